#!/usr/bin/env python3
"""pool_ratios_failed_runs_check.py - bench/tools/pool_ratios.py (behind
bench/compare_builds.sh) on results.csv files written here.

A pool run that did not complete (completed 0) has a partial run's ratio:
`worse` showed it as the row's figure, so a build that failed a workload
came out no worse, or better. It must show FAILED, counted worse. A pool
row whose ratio is no number was read as 0 without a word: it must be
refused (exit 2) with its file and line."""
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "bench", "tools", "pool_ratios.py")
HEAD = ("workload,allocator,device,completed,events,peak_live_bytes,"
        "peak_reserved_bytes,ratio,error\n")


def results(path, *rows):
    """results.csv with rows of (workload, completed, ratio)."""
    with open(path, "w") as f:
        f.write(HEAD + "".join("%s,pool,host,%s,10,100,0,%s,\n" % r
                               for r in rows))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        old, new = os.path.join(tmp, "old.csv"), os.path.join(tmp, "new.csv")
        results(old, ("llm", 1, "1.1"), ("cnn", 1, "1.2"))
        # llm failed at an event with 1.05 reserved / live so far.
        results(new, ("llm", 0, "1.05"), ("cnn", 1, "1.2"))
        p = subprocess.run([sys.executable, TOOL, "worse", old, new],
                           capture_output=True, text=True, timeout=60)
        if (p.returncode != 0 or "| llm | 1.1 | FAILED (worse) |" not in
                p.stdout or "1 of 2 rows worse" not in p.stdout):
            sys.exit("pool_ratios_failed_runs_check: FAIL: a failed run "
                     f"(rc {p.returncode}):\n{p.stdout}{p.stderr}")
        results(new, ("llm", 1, "1.1"), ("cnn", 1, "x1.2"))
        p = subprocess.run([sys.executable, TOOL, "worse", old, new],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 2 or "new.csv:3: bad ratio 'x1.2'" not in p.stderr:
            sys.exit("pool_ratios_failed_runs_check: FAIL: a bad ratio "
                     f"(rc {p.returncode}):\n{p.stdout}{p.stderr}")
    print("pool_ratios_failed_runs_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
