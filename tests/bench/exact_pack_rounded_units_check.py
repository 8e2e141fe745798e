#!/usr/bin/env python3
"""exact_pack_rounded_units_check.py - bench/tools/exact_pack.py says
"proved" only where the solver's answer proves that no placement fits.

The solver places the large blocks with their sizes rounded up to whole
units (--unit): where a size is no multiple of the unit, "unsatisfiable"
there proves nothing (three blocks of 600 KiB, live together, fit one
granule of 2 MiB; rounded up to 768 KiB they do not). Where the sizes
rounded down do not fit either, it is a proof; a block larger than every
granule given is one too. Exits 77 (ctest's skip) without minisat."""
import os
import shutil
import sys
import tempfile

from exact_pack_check import run, trace

KIB = 1 << 10


def together(path, sizes):
    """A trace of blocks of sizes, all live at once, then freed."""
    ptrs = [(i + 1) << 24 for i in range(len(sizes))]
    trace(path, [("allocate", p, s) for p, s in zip(ptrs, sizes)] +
          [("free", p, s) for p, s in zip(ptrs, sizes)])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        t = os.path.join(tmp, "t.csv")
        # 1800 KiB live in one granule: no proof that they do not fit.
        together(t, [600 * KIB] * 3)
        rc, out = run(t, unit=256 * KIB)
        if rc != 1 or "proved" in out or "not a proof" not in out:
            sys.exit("FAIL: 600 KiB blocks rounded up to 768 KiB: no "
                     f"'not a proof' (rc {rc}): {out}")
        # 2400 KiB cannot fit one granule: rounded down (768 KiB each) they
        # do not either, which proves it.
        together(t, [800 * KIB] * 3)
        rc, out = run(t, "--granules", "1", unit=256 * KIB)
        if rc != 1 or "unsatisfiable" not in out or "(proved)" not in out:
            sys.exit("FAIL: 800 KiB blocks in one granule not proved "
                     f"(rc {rc}): {out}")
        # A block larger than the granules given: said, and a proof (it
        # said nothing, exit 1).
        together(t, [3 << 20])
        rc, out = run(t, "--granules", "1", unit=256 * KIB)
        if rc != 1 or "larger than 1 granules" not in out \
                or "(proved)" not in out:
            sys.exit(f"FAIL: a 3 MiB block in one granule (rc {rc}): {out}")
    print("exact_pack_rounded_units_check: ok")
    return 0


if __name__ == "__main__":
    if shutil.which("minisat") is None:
        print("exact_pack_rounded_units_check: no minisat; skipped")
        sys.exit(77)
    sys.exit(main())
