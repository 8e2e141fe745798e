#!/usr/bin/env python3
"""exact_pack.py - an offline placement of a trace in a given number of
granules, searched exactly with a SAT solver, for the granule bound that
`mpbench bound`'s greedy placement cannot settle.

    bench/tools/exact_pack.py TRACE.csv [--granules N] [--unit BYTES]
                              [--min-size BYTES] [--seconds S]

Reads an RMM-style trace (Thread,Time,Action,Pointer,Size,Stream) as mpbench
does: pointers are hex numbers (0x1000 and 0X01000 are one) or (nil), blank
lines and a CRLF's CR are skipped, "allocate failure" rows, frees of (nil)
and of pointers never allocated are skipped, a free's size is its
block's or 0, an allocation of an address still live frees the old block first,
sizes are rounded up to 512 B (as the pool rounds), streams are ignored (the
device caught up). Blocks of at least --min-size (default 256 KiB), in units
of --unit bytes (default 256 KiB, sizes rounded up to it), get offsets from
a SAT solver (minisat, Debian's `minisat` package) such that blocks whose
lifetimes overlap never overlap in memory, within C units; the smaller
blocks are then placed best fit around them. C starts at what N granules of
2 MiB hold (default: the granule bound, ceil(peak live / 2 MiB)) and comes
down one unit at a time while the small blocks still fit, to leave them
room. Every placement printed is checked pair by pair.

Prints the peak live bytes, the granule bound, and for each C tried whether
the solver found a placement and how high all blocks reach; exits 0 when one
fits in N granules, 1 when none was found, 2 on bad input. Only the first
C, all N granules hold, can prove that no placement fits ("proved"): the
large blocks alone unsatisfiable there, in whole units where every large
size is a multiple of --unit, else with each size rounded down and the
range rounded up to whole units (a relaxation: every real placement gives
one). Sizes rounded up to whole units that the solver cannot place, a
smaller C (the small blocks left no room) or a time-out prove nothing.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

GRANULE = 2 << 20
ROUND = 512


def read_trace(path):
    """Blocks as (start event, end event, rounded bytes). Sizes are plain
    decimals, as mpbench reads them (int() would take "-4096", "+1" and
    "4_096"); a trace with no block of a nonzero size is refused."""
    live, asked, blocks, t = {}, {}, [], 0  # asked: a live block's size
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip()
        if header != "Thread,Time,Action,Pointer,Size,Stream":
            raise ValueError(f"{path}:1: not a trace header: {header!r}")
        for line_no, line in enumerate(f, start=2):
            line = line.rstrip("\n")
            line = line[:-1] if line.endswith("\r") else line
            if line == "":
                continue  # as mpbench skips it
            fields = line.split(",")
            if len(fields) != 6:
                raise ValueError(f"{path}:{line_no}: {len(fields)} fields, not 6")
            action = fields[2]
            if action not in ("allocate", "free", "allocate failure"):
                raise ValueError(f"{path}:{line_no}: bad action {action!r}")
            if re.fullmatch(r"[0-9]+", fields[4]) is None:
                raise ValueError(f"{path}:{line_no}: bad size {fields[4]!r} "
                                 "(a decimal number)")
            size = int(fields[4])
            ptr = pointer(fields[3], f"{path}:{line_no}")
            t += 1
            if action == "allocate failure":
                continue
            if ptr == 0:
                # free(NULL), or a zero-byte allocation mpbench replays as
                # NULL; a size there names no block.
                if size != 0:
                    raise ValueError(f"{path}:{line_no}: {action} of {size} "
                                     "bytes at pointer (nil)")
                continue
            if action == "free" and ptr in live and size not in (0, asked[ptr]):
                raise ValueError(f"{path}:{line_no}: free of {fields[3]} "
                                 f"gives {size} bytes, not its allocation's "
                                 "(a free's size is its allocation's, or 0)")
            if action == "allocate":
                if ptr in live:
                    s, r = live.pop(ptr)
                    blocks.append((s, t, r))
                live[ptr] = (t, (size + ROUND - 1) // ROUND * ROUND)
                asked[ptr] = size
            elif ptr in live:
                s, r = live.pop(ptr)
                blocks.append((s, t, r))
    blocks += [(s, t + 1, r) for s, r in live.values()]
    blocks = [b for b in blocks if b[2] > 0]
    if not blocks:
        raise ValueError(f"{path}: no allocation of a nonzero size: "
                         "nothing to place")
    return blocks


def pointer(text, where):
    """A trace's pointer as mpbench reads it: hex of 1 to 16 digits, with or
    without 0x, or (nil) (0)."""
    if text == "(nil)":
        return 0
    m = re.fullmatch(r"(?:0[xX])?([0-9a-fA-F]{1,16})", text)
    if m is None:
        raise ValueError(f"{where}: bad pointer {text!r} (hex such as 0x7f00 "
                         "or (nil))")
    return int(m.group(1), 16)


def peak_live(blocks):
    ev = sorted([(s, r) for s, e, r in blocks] + [(e, -r) for s, e, r in blocks])
    cur = peak = 0
    for _, d in ev:  # a free (negative) sorts before an allocation at one time
        cur += d
        peak = max(peak, cur)
    return peak


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def solve(large, units, cap, seconds, solver):
    """Offsets (in units) of the large blocks within cap units, or None
    (unsatisfiable), or "timeout". Order encoding: x[i][v] is offset_i >= v;
    for each pair alive together, one lies wholly below the other."""
    nv = 0
    var = {}
    for i, u in enumerate(units):
        for v in range(1, cap - u + 1):
            nv += 1
            var[i, v] = nv
    clauses = []

    def at_least(i, v):
        if v <= 0:
            return True
        if v > cap - units[i]:
            return False
        return var[i, v]

    for i, u in enumerate(units):
        clauses += [[-var[i, v + 1], var[i, v]] for v in range(1, cap - u)]
    for i in range(len(large)):
        for j in range(i + 1, len(large)):
            if not overlaps(large[i], large[j]):
                continue
            below = {}
            for a, b in ((i, j), (j, i)):
                nv += 1
                below[a, b] = nv
                for v in range(cap - units[a] + 1):
                    lo, hi = at_least(a, v), at_least(b, v + units[a])
                    if lo is False or hi is True:
                        continue
                    c = [-nv]
                    if lo is not True:
                        c.append(-lo)
                    if hi is not False:
                        c.append(hi)
                    clauses.append(c)
            clauses.append([below[i, j], below[j, i]])
    with tempfile.TemporaryDirectory() as tmp:
        cnf, out = os.path.join(tmp, "f.cnf"), os.path.join(tmp, "f.out")
        with open(cnf, "w") as f:
            f.write(f"p cnf {nv} {len(clauses)}\n")
            f.writelines(" ".join(map(str, c)) + " 0\n" for c in clauses)
        try:
            subprocess.run([solver, cnf, out], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=seconds)
        except subprocess.TimeoutExpired:
            return "timeout"
        with open(out) as f:
            words = f.read().split()
    if not words or words[0] != "SAT":
        return None
    true = {int(w) for w in words[1:] if int(w) > 0}
    return [max([0] + [v for v in range(1, cap - units[i] + 1)
                       if var[i, v] in true]) for i in range(len(large))]


def proved(large, limit, unit, seconds, solver, granules):
    """What the large blocks being unsatisfiable in limit // unit units,
    each rounded up to whole units, proves. Where every size is whole
    units, no placement fits: any placement pushed down (each block to 0 or
    onto the end of one below it) has its offsets in whole units. Else only
    a relaxation can prove it: a real placement at offsets o gives one of
    the sizes rounded down at offsets rounded up (a block above another
    stays above), within the range rounded up to whole units."""
    no = f": no placement fits {granules} granules (proved)"
    if all(b[2] % unit == 0 for b in large):
        return no
    cap = -(-limit // unit)
    down = [(b, b[2] // unit) for b in large if b[2] >= unit]
    if any(u > cap for _, u in down):
        return no
    offs = solve([b for b, _ in down], [u for _, u in down], cap, seconds,
                 solver)
    if offs is None:
        return no
    return (f" with sizes rounded up to whole units of {unit} B: not a proof"
            f" ({'timed out' if offs == 'timeout' else 'they fit'} rounded"
            " down)")


def place_rest(placed, rest, limit):
    """Best fit of each block of rest (largest first) among the placed
    blocks alive with it, below limit; False when one does not fit."""
    for blk in sorted(rest, key=lambda b: -b[2]):
        busy = sorted((o, o + b[2]) for b, o in placed if overlaps(b, blk))
        pos, best, gap = 0, None, None
        for lo, hi in busy + [(limit, limit)]:
            if lo - pos >= blk[2] and (best is None or lo - pos < gap):
                best, gap = pos, lo - pos
            pos = max(pos, hi)
        if best is None:
            return False
        placed.append((blk, best))
    return True


def check(placed):
    for x in range(len(placed)):
        (a, oa) = placed[x]
        for y in range(x + 1, len(placed)):
            (b, ob) = placed[y]
            if overlaps(a, b) and oa < ob + b[2] and ob < oa + a[2]:
                raise AssertionError(f"blocks {a} and {b} overlap")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--granules", type=int)
    ap.add_argument("--unit", type=int, default=256 << 10)
    ap.add_argument("--min-size", type=int, default=256 << 10)
    ap.add_argument("--seconds", type=float, default=300)
    args = ap.parse_args()
    # Values that mean nothing are bad input (exit 2, argparse's status):
    # sys.exit's 1 said no placement was found, 0 granules was taken as
    # "the bound", fewer said none fits, a solver given no time "timed out".
    if args.unit <= 0:
        ap.error(f"--unit {args.unit}: must be positive")
    if args.min_size < 0:
        ap.error(f"--min-size {args.min_size}: must not be negative")
    if args.granules is not None and args.granules <= 0:
        ap.error(f"--granules {args.granules}: at least 1")
    if not args.seconds > 0:
        ap.error(f"--seconds {args.seconds}: more than 0")
    solver = shutil.which("minisat")
    if solver is None:
        sys.exit("exact_pack: needs minisat (apt-get install minisat)")
    try:
        blocks = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"exact_pack: {e}", file=sys.stderr)
        return 2
    peak = peak_live(blocks)
    bound = -(-peak // GRANULE)
    granules = args.granules or bound
    limit = granules * GRANULE
    large = [b for b in blocks if b[2] >= args.min_size]
    rest = [b for b in blocks if b[2] < args.min_size]
    units = [-(-b[2] // args.unit) for b in large]
    print(f"{args.trace}: {len(blocks)} blocks, peak live {peak} B "
          f"({peak / 2**20:.3f} MiB), granule bound {bound} "
          f"({bound * GRANULE / peak:.3f}); trying {granules} granules "
          f"({limit / peak:.3f}), {len(large)} blocks by SAT")
    if max(b[2] for b in blocks) > limit:
        print(f"  a block of {max(b[2] for b in blocks)} B is larger than "
              f"{granules} granules: no placement fits (proved)")
        return 1
    cap = limit // args.unit
    first = True
    while cap > 0 and cap >= max(units, default=0):
        offs = solve(large, units, cap, args.seconds, solver)
        if offs == "timeout":
            print(f"  {cap} units of {args.unit} B: timed out (proves nothing)")
            return 1
        if offs is None:
            print(f"  {cap} units of {args.unit} B: unsatisfiable" +
                  (proved(large, limit, args.unit, args.seconds, solver,
                          granules) if first else
                   "; the small blocks had no room above: not a proof"))
            return 1
        first = False
        placed = [(b, o * args.unit) for b, o in zip(large, offs)]
        fits = place_rest(placed, rest, limit)
        if fits:
            check(placed)
            top = max(o + b[2] for b, o in placed)
            print(f"  {cap} units of {args.unit} B: every block placed, "
                  f"highest end {top} B ({top / 2**20:.3f} MiB, "
                  f"{top / peak:.4f} x peak live): fits {granules} granules")
            return 0
        print(f"  {cap} units of {args.unit} B: large blocks placed, "
              f"small ones do not fit; one unit less")
        cap -= 1
    print(f"  {cap} units of {args.unit} B: too few for the largest block; "
          "no placement found (not a proof)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
