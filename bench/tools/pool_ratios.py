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
are found by the header's names (workload, allocator, ratio, completed;
where a header lacks them, the 1st, 2nd, 8th and 4th, as mpbench has always
written them). A run that did not complete (completed 0: its ratio is a
partial run's) shows as FAILED, and in `worse` a row that fails in NEW
only is worse. Exit 2 on a file that cannot be read, or a pool row whose
ratio is no number (with its line).
"""
import csv
import math
import sys

FAILED = "FAILED"


def fail(msg):
    sys.stderr.write("pool_ratios: %s\n" % msg)
    sys.exit(2)


def pool_ratios(path):
    """{workload: ratio text} of path's pool rows, and the workloads in
    order."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            # each row with the line it ends on
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        fail("cannot read %s: %s" % (path, e))
    if not rows:
        fail("%s is empty" % path)
    head = rows[0][1]
    keys = ("workload", "allocator", "ratio", "completed")
    cw, ca, cr, cc = ((head.index(k) for k in keys)
                      if all(k in head for k in keys) else (0, 1, 7, 3))
    ratio, order = {}, []
    for line, row in rows[1:]:
        if len(row) <= max(cw, ca, cr, cc) or row[ca] != "pool":
            continue
        if row[cw] not in ratio:
            order.append(row[cw])
        # A failed run's ratio is its partial run's: no figure of the row.
        text = FAILED if row[cc] == "0" else row[cr]
        if text != FAILED and not finite(text):
            fail("%s:%d: bad ratio %r (a number)" % (path, line, row[cr]))
        ratio[row[cw]] = text
    return ratio, order


def finite(text):
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def num(text):
    """text as a number; 0 where it is none (a row missing in one build, or
    FAILED)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def is_worse(old, new):
    """Whether NEW's ratio text is worse than OLD's: higher, or FAILED
    where OLD's is not."""
    if new == FAILED:
        return old != FAILED
    return old != FAILED and num(new) > num(old)


def cell(name):
    return name.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def worse(old_csv, new_csv):
    old, order = pool_ratios(old_csv)
    new, _ = pool_ratios(new_csv)
    print("| workload | old | new |\n|---|---:|---:|")
    bad = 0
    for w in order:
        mark = " (worse)" if is_worse(old.get(w), new.get(w)) else ""
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
        lo, hi, failed = {}, {}, set()
        for run in runs:
            for w, text in run.items():
                if text == FAILED:  # no figure: said beside the range
                    failed.add(w)
                    continue
                x = num(text)
                lo[w] = min(lo.get(w, x), x)
                hi[w] = max(hi.get(w, x), x)
        sides.append((base, lo, hi, failed))
    print("| workload | old: caught up, behind (min to max) | new: caught up, "
          "behind (min to max) |\n|---|---:|---:|")
    shown = 0
    for w in order:
        figs = [(num(b.get(w)), lo.get(w, 0.0), hi.get(w, 0.0))
                for b, lo, hi, _ in sides]
        bad = [b.get(w) == FAILED or w in f for b, _, _, f in sides]
        if not any(bad) and all(f[1] == f[0] and f[2] == f[0] for f in figs):
            continue
        shown += 1
        text = []
        for (base, _, _, failed), f in zip(sides, figs):
            t = "%s, %.3f to %.3f" % (
                FAILED if base.get(w) == FAILED else "%.3f" % f[0], f[1], f[2])
            text.append(t + (" (a run FAILED)" if w in failed else ""))
        print("| %s | %s | %s |" % (cell(w), text[0], text[1]))
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
