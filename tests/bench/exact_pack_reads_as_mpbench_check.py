#!/usr/bin/env python3
"""exact_pack_reads_as_mpbench_check.py - bench/tools/exact_pack.py reads a
trace as mpbench's loader does (bench/core/trace.c).

Pointers are hex numbers: a block allocated at 0x1000 and freed at 0X01000
is freed (it was a free of an unknown pointer, so the block lived to the
end and the peak doubled). Blank lines and CRLF endings are read (a blank
line was refused). A pointer that is no hex number, and a free whose size
is neither its block's nor 0, are refused with their line (both were
taken). Exits 77 (ctest's skip) without minisat."""
import os
import shutil
import sys
import tempfile

from exact_pack_check import MIB, run

HEAD = "Thread,Time,Action,Pointer,Size,Stream\r\n"


def write(path, *rows):
    """rows: (action, pointer text, size); "" for a blank line."""
    with open(path, "w", newline="") as f:
        f.write(HEAD)
        for i, r in enumerate(rows):
            f.write("\r\n" if r == "" else
                    "1,00:00:00.%06d,%s,%s,%d,0\r\n" % ((i,) + r))


def refused(path, what, *rows):
    write(path, *rows)
    rc, out = run(path)
    if rc != 2 or f"t.csv:{len(rows) + 1}: {what}" not in out:
        sys.exit(f"exact_pack_reads_as_mpbench_check: FAIL: no '{what}' "
                 f"on line {len(rows) + 1} (rc {rc}): {out}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        t = os.path.join(tmp, "t.csv")
        write(t, ("allocate", "0x1000", MIB), ("free", "0X01000", 0), "",
              ("allocate", "2000", MIB), ("free", "0x2000", MIB), "")
        rc, out = run(t)
        if rc != 0 or f"2 blocks, peak live {MIB} B" not in out:
            sys.exit("exact_pack_reads_as_mpbench_check: FAIL: one block "
                     f"live at a time (rc {rc}): {out}")
        refused(t, "bad pointer", ("allocate", "0x1000", MIB),
                ("free", "0xZZ", 0))
        refused(t, "free of 0x1000 gives 4096 bytes",
                ("allocate", "0x1000", MIB), ("free", "0x1000", 4096))
    print("exact_pack_reads_as_mpbench_check: ok")


if __name__ == "__main__":
    if shutil.which("minisat") is None:
        print("exact_pack_reads_as_mpbench_check: no minisat; skipped")
        sys.exit(77)
    main()
