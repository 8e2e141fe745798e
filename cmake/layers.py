#!/usr/bin/env python3
"""layers.py - checks that the files of one directory call each other
without a circle.

    layers.py [--show] NAME OBJECT.o...

Reads each object's defined and undefined global symbols with `nm -P`.
File A calls file B when A uses a symbol B defines. The calls must form
layers: no file may call, directly or through others, a file that calls it.
Every circle is printed with the symbols that close it, and the exit status
is 1. With --show the layers are printed too, bottom first (a file calls
only files in the layers below it).

Weak definitions count as definitions, so a weak no-op that stands in for a
higher file's function is a call like any other. Calls through function
pointers are not seen: they are the one sanctioned way down-to-up (a pool's
upstream, a callback), and each is named where the pointer is set.
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True,
                         check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] == "U":
            used.add(f[0])
        elif f[1] in "TDBRVWGS":
            defined.add(f[0])
    return defined, used


def file_name(obj):
    base = os.path.basename(obj)
    for suffix in (".c.o", ".o"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def circles(calls):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(calls[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(calls):
        if v not in index:
            visit(v)
    return out


def main(argv):
    show = "--show" in argv
    argv = [a for a in argv if a != "--show"]
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    name, objs = argv[0], argv[1:]
    defined, used = {}, {}
    for o in objs:
        defined[file_name(o)], used[file_name(o)] = symbols(o)
    owner = {}
    for f in sorted(defined):
        for s in defined[f]:
            owner.setdefault(s, f)
    calls = {f: set() for f in defined}
    why = {}
    for f in used:
        for s in sorted(used[f]):
            g = owner.get(s)
            if g is not None and g != f:
                calls[f].add(g)
                why.setdefault((f, g), []).append(s)
    bad = circles(calls)
    for comp in bad:
        print(f"{name}: circle between {', '.join(comp)}:")
        for f in comp:
            for g in sorted(calls[f] & set(comp)):
                print(f"  {f} -> {g}: {', '.join(why[(f, g)])}")
    if show and not bad:
        level = {}

        def depth(f):
            if f not in level:
                level[f] = 1 + max((depth(g) for g in calls[f]), default=-1)
            return level[f]

        for f in calls:
            depth(f)
        for d in range(max(level.values(), default=-1) + 1):
            row = sorted(f for f in level if level[f] == d)
            print(f"{name} layer {d}: {' '.join(row)}")
    if not bad:
        print(f"{name}: {len(calls)} files, no circle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
