#!/usr/bin/env python3
"""snapshot_big_gen_args_check.py - bench/tools/snapshot_big_gen.py refuses
bad arguments with a usage line and exit 2 (no MB or OUT and an MB that is
no number were tracebacks, a negative MB wrote a file of one entry, an
unknown option was ignored), says a file it cannot write (exit 1), and
still writes a snapshot for good ones."""
import os
import pickle
import subprocess
import sys
import tempfile

GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                   "bench", "tools", "snapshot_big_gen.py")


def gen(*args):
    return subprocess.run([sys.executable, GEN, *args], capture_output=True,
                          text=True, timeout=120)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "s.pkl")
        for args in ((), ("1",), ("abc", out), ("-1", out), ("0", out),
                     ("inf", out), ("0.01", out, "--frames")):
            p = gen(*args)
            if (p.returncode != 2 or "Traceback" in p.stderr or
                    "usage:" not in p.stderr or os.path.exists(out)):
                sys.exit(f"snapshot_big_gen_args_check: FAIL: {args} "
                         f"(rc {p.returncode}): {p.stderr}")
        p = gen("0.01", os.path.join(tmp, "no", "s.pkl"))
        if (p.returncode != 1 or "Traceback" in p.stderr or
                "cannot write" not in p.stderr):
            sys.exit("snapshot_big_gen_args_check: FAIL: an unwritable OUT "
                     f"(rc {p.returncode}): {p.stderr}")
        p = gen("0.01", out, "--shared-frames")
        with open(out, "rb") as f:
            snap = pickle.load(f)
        if p.returncode != 0 or len(snap["device_traces"][0]) < 2:
            sys.exit("snapshot_big_gen_args_check: FAIL: 0.01 MB "
                     f"(rc {p.returncode}): {p.stderr}")


if __name__ == "__main__":
    main()  # exits 1 with its message on a failure
    print("snapshot_big_gen_args_check: ok")
