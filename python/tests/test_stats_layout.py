"""The Python mirror of mp_stats_t matches include/mempool/stats.h.

Field names and order come from parsing the header; offsets and the size
from a probe compiled against it. A field added to, removed from or retyped
in the header without the same change in mempool/_stats.py fails here."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from mempool._stats import Stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = os.environ.get("MEMPOOL_INCLUDE_DIR", os.path.join(REPO, "include"))
HEADER = os.path.join(INCLUDE, "mempool", "stats.h")
CTYPES = {"size_t": ctypes.c_size_t, "uint64_t": ctypes.c_uint64}


def header_fields():
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    body = re.search(r"typedef\s+struct\s+mp_stats\s*\{(.*?)\}\s*mp_stats_t\s*;", text, re.S)
    assert body, "struct mp_stats not found in " + HEADER
    out = []
    for decl in body.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        ctype, names = decl.split(None, 1)
        for n in names.split(","):
            out.append((n.strip(), ctype))
    return out


def test_names_order_and_types_match_the_header():
    fields = header_fields()
    assert [n for n, _ in fields] == [n for n, _ in Stats._fields_]
    for (name, ctype), (_, pytype) in zip(fields, Stats._fields_):
        assert ctype in CTYPES, "unknown C type %s of %s: mirror it" % (ctype, name)
        assert CTYPES[ctype] == pytype, name


def test_offsets_and_size_match_a_compiled_probe(tmp_path):
    cc = os.environ.get("MEMPOOL_TEST_CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        if os.environ.get("MEMPOOL_TEST_CC") is not None:
            pytest.fail("MEMPOOL_TEST_CC is set but empty")
        pytest.skip("no C compiler")
    names = [n for n, _ in header_fields()]
    src = tmp_path / "probe.c"
    src.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <mempool/stats.h>\n"
        "int main(void) {\n  printf(\"sizeof %zu\\n\", sizeof(mp_stats_t));\n"
        + "".join('  printf("%s %%zu\\n", offsetof(mp_stats_t, %s));\n' % (n, n) for n in names)
        + "  return 0;\n}\n")
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-I", INCLUDE, str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    assert int(got.pop("sizeof")) == ctypes.sizeof(Stats)
    for name, _ in Stats._fields_:
        assert int(got[name]) == getattr(Stats, name).offset, name
