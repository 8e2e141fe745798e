#!/usr/bin/env python3
"""exact_pack_check.py - bench/tools/exact_pack.py on small traces made here.

A trace that a first-fit placement packs badly but an exact one packs into
its granule bound: the tool must find that placement (exit 0, "fits 2
granules") and must prove one granule too few (exit 1, "unsatisfiable").
A malformed trace is refused with its line (exit 2), as are a trace with
nothing to place and option values that mean nothing. Exits 77 (ctest's
skip) without minisat (cmake/deps.sh installs it)."""
import os
import shutil
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "bench", "tools", "exact_pack.py")
MIB = 1 << 20


def fail(msg):
    print("exact_pack_check: FAIL: " + msg)
    sys.exit(1)


def trace(path, rows):
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i, (action, ptr, size) in enumerate(rows):
            f.write(f"1,00:00:00.{i:06d},{action},{ptr:#x},{size},0\n")


def run(*args, unit=MIB):
    """The tool on args, with unit as its --unit and --min-size."""
    p = subprocess.run([sys.executable, TOOL, *args, "--unit", str(unit),
                        "--min-size", str(unit)], capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def main():
    if shutil.which("minisat") is None:
        print("exact_pack_check: no minisat; skipped")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        # A, B and C of 1 MiB, B freed, then D of 2 MiB with A and C live:
        # first fit puts A, B, C side by side and D cannot use B's hole, so
        # it needs a third granule; C placed beside A leaves D its 2 MiB.
        good = os.path.join(tmp, "good.csv")
        trace(good, [("allocate", 0xA000000, MIB), ("allocate", 0xB000000, MIB),
                     ("allocate", 0xC000000, MIB), ("free", 0xB000000, 0),
                     ("allocate", 0xD000000, 2 * MIB), ("free", 0xA000000, 0),
                     ("free", 0xC000000, 0), ("free", 0xD000000, 0)])
        rc, out = run(good)
        if rc != 0 or "fits 2 granules" not in out:
            fail(f"the exact placement was not found (rc {rc}): {out}")
        rc, out = run(good, "--granules", "1")
        if rc != 1 or "unsatisfiable" not in out:
            fail(f"one granule was not proved too few (rc {rc}): {out}")
        bad = os.path.join(tmp, "bad.csv")
        with open(bad, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                    "1,00:00:00.000000,allocate,0x10,4096,0\n"
                    "1,00:00:00.000001,allocate,0x20,many,0\n")
        rc, out = run(bad)
        if rc != 2 or "bad.csv:3: bad size" not in out:
            fail(f"a malformed trace was not refused with its line (rc {rc}): "
                 f"{out}")
        # A size mpbench refuses (negative, signed, with '_') was read by
        # int(): a negative block was dropped and the rest "fit".
        for size in ("-4096", "+4096", "4_096", " 4096"):
            with open(bad, "w") as f:
                f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                        "1,00:00:00.000000,allocate,0x10,4096,0\n"
                        f"1,00:00:00.000001,allocate,0x20,{size},0\n")
            rc, out = run(bad)
            if rc != 2 or "bad.csv:3: bad size" not in out:
                fail(f"size {size!r} was not refused with its line (rc {rc}): "
                     f"{out}")
        # Nothing to place (a header alone, zero-byte blocks): a traceback
        # (division by a peak of 0) and exit 1, "no placement found".
        for rows in ("", "1,00:00:00.000000,allocate,0x10,0,0\n"):
            with open(bad, "w") as f:
                f.write("Thread,Time,Action,Pointer,Size,Stream\n" + rows)
            rc, out = run(bad)
            if rc != 2 or "Traceback" in out or "nothing to place" not in out:
                fail(f"an empty trace was not refused (rc {rc}): {out}")
        # Option values that mean nothing: --granules 0 was the default,
        # a negative one or --seconds 0 said no placement was found.
        for opt in (("--granules", "0"), ("--granules", "-2"),
                    ("--seconds", "0"), ("--seconds", "-1")):
            rc, out = run(good, *opt)
            if rc != 2 or opt[0] not in out:
                fail(f"{' '.join(opt)} was not refused (rc {rc}): {out}")
        # --unit 0 and a negative --min-size were refused with exit 1, the
        # status that says no placement was found.
        for opt in (("--unit", "0"), ("--min-size", "-1")):
            p = subprocess.run([sys.executable, TOOL, good, *opt],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 2 or opt[0] not in p.stderr:
                fail(f"{' '.join(opt)} was not bad input (rc {p.returncode}): "
                     f"{p.stdout + p.stderr}")
    print("exact_pack_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
