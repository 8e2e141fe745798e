#!/usr/bin/env python3
"""snapshot_gen.py CASE PROTOCOL OUT - writes a PyTorch-style memory
snapshot pickle (the dict torch.cuda.memory._snapshot() returns: 'segments'
and 'device_traces') for tests/bench/test_snapshot_pickle.c, with Python's
own pickle module, and prints what a replay of it must find:
    peak_live N allocs N unknown_frees N failures N streams N
computed here from the events (alloc adds, free_completed -- or, in a trace
without it, free_requested / free -- subtracts).

Cases:
  train       two streams, segment events, delayed free_completed, an oom,
              frames, reused addresses, a snapshot marker
  legacy      only 'free' / 'free_requested' (snapshots before PyTorch 2.1)
  prehistory  frees of blocks allocated before the trace began
  wide        addresses above 2**63 and sizes above 2**32 (LONG1 ints)
  noalloc     a snapshot whose traces allocate nothing
  notsnap     a pickle that is not a snapshot (a list)
"""
import pickle
import random
import sys

FRAMES = [{"filename": "train.py", "line": 42, "name": "forward"},
          {"filename": "torch/nn/modules/linear.py", "line": 116, "name": "forward"}]


def entry(action, addr, size, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": t, "frames": FRAMES, "compile_context": "N/A"}


def train(rng, legacy=False, base=0x7F0000000000, scale=1):
    tr = [entry("segment_alloc", base, 64 << 20)]
    live = {}  # addr -> (size, stream)
    pending = []  # requested, not yet completed
    t = 1_700_000_000_000_000
    nxt = base
    streams = [0, 0x55D0A1B2C3D0]
    for i in range(300):
        t += rng.randrange(1, 5000)
        r = rng.random()
        if r < 0.55 or not live:
            size = rng.choice([512, 4096, 1 << 20, 3 << 20, 7 << 20]) * scale
            addr, nxt = nxt, nxt + size
            st = rng.choice(streams)
            live[addr] = (size, st)
            tr.append(entry("alloc", addr, size, st, t))
        else:
            addr = rng.choice(sorted(live))
            size, st = live.pop(addr)
            if legacy:
                tr.append(entry(rng.choice(["free", "free_requested"]), addr, size, st, t))
            else:
                tr.append(entry("free_requested", addr, size, st, t))
                pending.append((addr, size, st))
        if pending and rng.random() < 0.5:
            addr, size, st = pending.pop(0)
            tr.append(entry("free_completed", addr, size, st, t + 1))
            if rng.random() < 0.3:  # the address comes back
                live[addr] = (size, st)
                tr.append(entry("alloc", addr, size, st, t + 2))
        if i == 150:
            tr.append(entry("oom", 0, 1 << 40))
            tr.append(entry("snapshot", 0, 0))
            tr.append(entry("segment_map", base + (64 << 20), 2 << 20))
    for addr, size, st in pending:
        tr.append(entry("free_completed", addr, size, st, t))
    tr.append(entry("segment_free", base, 64 << 20))
    return tr


def expect(trace):
    completed = any(e["action"] == "free_completed" for e in trace)
    frees = {"free_completed"} if completed else {"free_requested", "free"}
    live, cur, peak = {}, 0, 0
    allocs = unknown = failures = 0
    streams = set()
    for e in trace:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = e["size"]
            cur += e["size"]
            peak = max(peak, cur)
            allocs += 1
            streams.add(e["stream"])
        elif a in frees:
            if e["addr"] in live:
                cur -= live.pop(e["addr"])
            else:
                unknown += 1
        elif a == "oom":
            failures += 1
    return "peak_live %d allocs %d unknown_frees %d failures %d streams %d" % (
        peak, allocs, unknown, failures, len(streams | {0}))


def main():
    case, proto, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rng = random.Random(12)
    other = []  # device 0 has no allocation: device 1's trace is replayed
    if case == "train":
        tr = train(rng)
    elif case == "legacy":
        tr = train(rng, legacy=True)
    elif case == "prehistory":
        tr = [entry("free_completed", 0x7F0000000000 - 4096 * k, 4096) for k in range(1, 4)]
        tr += train(rng)
    elif case == "wide":
        tr = train(rng, base=0x8000_0000_0000_0000, scale=1 << 12)
    elif case == "noalloc":
        tr = [entry("segment_alloc", 0x7F0000000000, 2 << 20), entry("snapshot", 0, 0)]
    elif case == "notsnap":
        with open(out, "wb") as f:
            pickle.dump([1, 2, 3], f, protocol=proto)
        print("peak_live 0 allocs 0 unknown_frees 0 failures 0 streams 0")
        return
    else:
        sys.exit("unknown case " + case)
    snap = {"segments": [{"device": 1, "address": 0x7F0000000000, "total_size": 64 << 20,
                          "stream": 0, "segment_type": "large", "allocated_size": 0,
                          "active_size": 0, "blocks": []}],
            "device_traces": [other, tr],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0,
                                   "expandable_segments": False,
                                   "roundup": (1, 2.5)}}
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=proto)
    print(expect(tr))


if __name__ == "__main__":
    main()
