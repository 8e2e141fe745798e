#!/usr/bin/env python3
"""snapshot_big_gen.py MB OUT [--shared-frames] - writes a PyTorch-style
memory snapshot pickle of about MB megabytes for measuring `mpbench replay`
(peak memory and time of the pickle reader): not a test, a benchmark input.

The dict is what torch.cuda.memory._dump_snapshot() pickles (protocol 4):
{"segments": [...], "device_traces": [[entry, ...]]}, each entry a dict of
"action" (alloc, free_requested, free_completed, segment_alloc, ...),
"addr", "size", "stream", "time_us" and "frames": a list of 10 to 30 dicts
{"filename", "line", "name"} whose strings come from a few hundred, as
PyTorch's stacks repeat. Each frame is a dict of its own by default; with
--shared-frames the frames are a few thousand dicts the stacks share (as
torch's symbolize_tracebacks returns them), so the pickle's memo repeats
them.

Bad arguments (no MB or OUT, an MB that is no positive number, an option
it lacks) are refused with a usage line and exit 2; they were a traceback,
or a file of one entry for a negative MB, and a misspelt --shared-frames
was ignored. A file that cannot be written: a message and exit 1."""
import argparse
import math
import pickle
import random
import sys


def megabytes(text):
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is no positive number")
    return mb


def main():
    ap = argparse.ArgumentParser(
        prog="snapshot_big_gen.py",
        description="a PyTorch-style memory snapshot pickle of about MB "
        "megabytes")
    ap.add_argument("mb", metavar="MB", type=megabytes)
    ap.add_argument("out", metavar="OUT")
    ap.add_argument("--shared-frames", action="store_true")
    args = ap.parse_args()
    mb, out, shared = args.mb, args.out, args.shared_frames
    rng = random.Random(12)
    files = ["torch/nn/modules/module%d.py" % i for i in range(120)]
    names = ["forward_%d" % i for i in range(200)]
    pool = [{"filename": rng.choice(files), "line": rng.randrange(1, 3000),
             "name": rng.choice(names)} for _ in range(4000)]
    stacks = [[rng.randrange(len(pool)) for _ in range(rng.randrange(10, 31))]
              for _ in range(500)]

    def frames():
        s = rng.choice(stacks)
        if shared:
            return [pool[i] for i in s]
        return [dict(pool[i]) for i in s]

    base = 0x7F0000000000
    tr = [{"action": "segment_alloc", "addr": base, "size": 1 << 40,
           "stream": 0, "time_us": 0, "frames": frames()}]
    live, pending, nxt, t = [], [], base, 1_700_000_000_000_000
    per = 450 if not shared else 170  # pickle bytes per entry, about
    for _ in range(int(mb * 1e6 / per)):
        t += rng.randrange(1, 500)
        if rng.random() < 0.5 or not live:
            size = rng.choice([512, 4096, 65536, 1 << 20, 3 << 20])
            e = {"action": "alloc", "addr": nxt, "size": size,
                 "stream": rng.choice([0, 0x55D0A1B2C3D0]), "time_us": t}
            live.append(e)
            nxt += size
        elif pending and rng.random() < 0.5:
            a = pending.pop(0)
            e = dict(a, action="free_completed", time_us=t)
        else:
            a = live.pop(rng.randrange(len(live)))
            e = dict(a, action="free_requested", time_us=t)
            pending.append(e)
        e["frames"] = frames()
        tr.append(e)
    snap = {"segments": [{"device": 0, "address": base, "total_size": 1 << 40,
                          "stream": 0, "segment_type": "large",
                          "allocated_size": 0, "active_size": 0,
                          "blocks": []}],
            "device_traces": [tr]}
    try:
        with open(out, "wb") as f:
            pickle.dump(snap, f, protocol=4)
    except OSError as e:
        sys.exit(f"snapshot_big_gen.py: cannot write {out}: {e.strerror}")
    print(out, len(tr), "entries")


if __name__ == "__main__":
    main()
