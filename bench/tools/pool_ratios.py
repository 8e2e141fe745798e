#!/usr/bin/env python3
"""pool_ratios.py - the `pool` rows of mpbench's results.csv files side by
side, as Markdown tables for bench/compare_builds.sh.

    pool_ratios.py worse OLD.csv NEW.csv
        per workload (in OLD's order): the ratio (peak reserved / peak live)
        of each build, the rows where NEW's is higher marked (worse), and
        how many are.
    pool_ratios.py spread OLD.csv OLD1.csv OLD2.csv OLD3.csv \\
                          NEW.csv NEW1.csv NEW2.csv NEW3.csv
        per workload and build: the caught-up ratio (OLD.csv, NEW.csv) and
        the lowest and highest of the three runs behind the host; rows
        whose figure never moved are left out.

The files are read as CSV (Python's csv module): a workload or trace name
with a comma, a quote or a line break in it is one quoted field, which a
split on commas cut into several (its row was lost, or another column read
as its ratio). A '|' in a name is escaped, as results.md does. The columns
are found by the header's names (workload, allocator, ratio; where a header
lacks them, the 1st, 2nd and 8th, as mpbench has always written them).
Exit 2 on a file that cannot be read.
"""
import csv
import sys


def fail(msg):
    sys.stderr.write("pool_ratios: %s\n" % msg)
    sys.exit(2)


def pool_ratios(path):
    """{workload: ratio text} of path's pool rows, and the workloads in
    order."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        fail("cannot read %s: %s" % (path, e))
    if not rows:
        fail("%s is empty" % path)
    head = rows[0]
    keys = ("workload", "allocator", "ratio")
    cw, ca, cr = ((head.index(k) for k in keys)
                  if all(k in head for k in keys) else (0, 1, 7))
    ratio, order = {}, []
    for row in rows[1:]:
        if len(row) <= max(cw, ca, cr) or row[ca] != "pool":
            continue
        if row[cw] not in ratio:
            order.append(row[cw])
        ratio[row[cw]] = row[cr]
    return ratio, order


def num(text):
    """text as a number; 0 where it is none (a row missing in one build)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def cell(name):
    return name.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def worse(old_csv, new_csv):
    old, order = pool_ratios(old_csv)
    new, _ = pool_ratios(new_csv)
    print("| workload | old | new |\n|---|---:|---:|")
    bad = 0
    for w in order:
        mark = " (worse)" if num(new.get(w)) > num(old.get(w)) else ""
        bad += mark != ""
        print("| %s | %s | %s%s |" % (cell(w), old.get(w, ""), new.get(w, ""),
                                      mark))
    print("\n%d of %d rows worse" % (bad, len(order)))


def spread(paths):
    sides = []
    order = None
    for s in (0, 4):
        base, names = pool_ratios(paths[s])
        if order is None:
            order = names
        runs = [pool_ratios(p)[0] for p in paths[s + 1:s + 4]]
        lo, hi = {}, {}
        for run in runs:
            for w, text in run.items():
                x = num(text)
                lo[w] = min(lo.get(w, x), x)
                hi[w] = max(hi.get(w, x), x)
        sides.append((base, lo, hi))
    print("| workload | old: caught up, behind (min to max) | new: caught up, "
          "behind (min to max) |\n|---|---:|---:|")
    shown = 0
    for w in order:
        figs = [(num(b.get(w)), lo.get(w, 0.0), hi.get(w, 0.0))
                for b, lo, hi in sides]
        if all(f[1] == f[0] and f[2] == f[0] for f in figs):
            continue
        shown += 1
        print("| %s | %.3f, %.3f to %.3f | %.3f, %.3f to %.3f |" %
              ((cell(w),) + figs[0] + figs[1]))
    print("\n%d of %d rows moved with the stream timing" % (shown, len(order)))


def main(argv):
    if len(argv) == 4 and argv[1] == "worse":
        worse(argv[2], argv[3])
    elif len(argv) == 10 and argv[1] == "spread":
        spread(argv[2:])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
