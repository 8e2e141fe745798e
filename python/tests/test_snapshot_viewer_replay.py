"""A snapshot's trace replays in memory_viz's "Allocator State History" view.

That view (torch/utils/viz/MemoryViz.js, MemoryView's simulate_memory)
draws the state at a chosen trace entry by starting from the snapshot's
segments and live blocks and undoing the entries after it, newest first.
It assumes what PyTorch's allocator guarantees; where a trace breaks that,
the page throws and draws nothing. The rules, as read there (checked
here with a replay of our own, no code of the page):

- a "free_requested" directly followed by a "free_completed" of the same
  address is one "free" (annotate_snapshot);
- undoing "free"/"free_completed" makes the block live again, "alloc"
  drops it, a lone "free_requested" needs its block live (else it throws);
- undoing "segment_unmap" maps the range back (merged with a neighbour
  that touches it on the same stream), "segment_free" puts the segment
  back; undoing "segment_map" cuts the range out of the segment holding
  it (none holds it: it throws), "segment_alloc" removes the segment that
  starts at its address (none: the page removes another one, counted
  here as a problem too);
- every live block drawn must lie in a segment (else it throws).

So a trace may unmap memory only where no block is live: mp_pool_pause,
which unmaps memory under live blocks, must say those blocks left the
device first.
"""
import pytest

import mempool

MiB = 1 << 20


def _elide_frees(trace):
    out = []
    for e in trace:
        if (e["action"] == "free_completed" and out and
                out[-1]["action"] == "free_requested" and
                out[-1]["addr"] == e["addr"]):
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(e)
    return out


def viewer_replay_problems(snap, device=0):
    """What the Allocator State History view of device would throw on,
    for each entry one may select: a list of strings, empty when every
    state replays. Also returns the states (segments, live block
    addresses) from newest to oldest, for the test's own checks."""
    segs = sorted([s["address"], s["total_size"], s["stream"]]
                  for s in snap["segments"] if s["device"] == device)
    live = set()
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                live.add(b["address"])
    trace = _elide_frees(snap["device_traces"][device])
    problems, states = [], []

    def check(where):
        states.append(([tuple(s) for s in segs], set(live)))
        for a in live:
            if not any(s[0] <= a < s[0] + s[1] for s in segs):
                problems.append("%s: block 0x%x lies in no segment" % (where, a))

    check("at the snapshot")
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        act, addr, size = e["action"], e["addr"], e["size"]
        where = "before entry %d (%s 0x%x)" % (i, act, addr)
        if act in ("free", "free_completed"):
            live.add(addr)
        elif act == "free_requested":
            if addr not in live:
                problems.append("%s: no live block to undo it on" % where)
        elif act == "alloc":
            live.discard(addr)
        elif act == "segment_free":
            segs.append([addr, size, e["stream"]])
            segs.sort()
        elif act == "segment_unmap":
            # Merged with the segments that touch it only (two segments of
            # the snapshot that touch stay apart).
            new = [addr, size, e["stream"]]
            for s in [s for s in segs if s[0] + s[1] == addr and
                      s[2] == new[2]]:
                segs.remove(s)
                new = [s[0], s[1] + new[1], new[2]]
            for s in [s for s in segs if s[0] == addr + size and
                      s[2] == new[2]]:
                segs.remove(s)
                new[1] += s[1]
            segs.append(new)
            segs.sort()
        elif act == "segment_alloc":
            at = [k for k, s in enumerate(segs) if s[0] == addr]
            if not at:
                problems.append("%s: no segment starts there" % where)
            else:
                del segs[at[0]]
        elif act == "segment_map":
            at = [k for k, s in enumerate(segs)
                  if s[0] <= addr and addr + size <= s[0] + s[1]]
            if not at:
                problems.append("%s: no segment holds the range" % where)
            else:
                s = segs.pop(at[0])
                if addr > s[0]:
                    segs.append([s[0], addr - s[0], s[2]])
                if addr + size < s[0] + s[1]:
                    segs.append([addr + size, s[0] + s[1] - addr - size, s[2]])
                segs.sort()
        check(where)
    return problems, states


def _load(path):
    import pickle
    with open(path, "rb") as f:
        return pickle.load(f)


def test_the_replay_finds_a_block_left_live_in_unmapped_memory():
    # The check itself: a segment_unmap under a live block is caught.
    seg = {"device": 0, "address": 1 << 30, "total_size": 2 * MiB,
           "stream": 0, "blocks": [{"address": 1 << 30, "size": MiB,
                                     "state": "active_allocated"},
                                    {"address": (1 << 30) + MiB, "size": MiB,
                                     "state": "inactive"}]}

    def ev(action, addr, size):
        return {"action": action, "addr": addr, "size": size, "stream": 0}
    bad = {"segments": [seg], "device_traces": [[
        ev("segment_map", 1 << 30, 2 * MiB), ev("alloc", 1 << 30, MiB),
        ev("segment_unmap", 1 << 30, 2 * MiB),
        ev("segment_map", 1 << 30, 2 * MiB)]]}
    problems, _ = viewer_replay_problems(bad)
    assert any("lies in no segment" in p for p in problems), problems
    good = {"segments": [seg], "device_traces": [[
        ev("segment_map", 1 << 30, 2 * MiB), ev("alloc", 1 << 30, MiB),
        ev("free_requested", 1 << 30, MiB), ev("free_completed", 1 << 30, MiB),
        ev("segment_unmap", 1 << 30, 2 * MiB),
        ev("segment_map", 1 << 30, 2 * MiB), ev("alloc", 1 << 30, MiB)]]}
    assert viewer_replay_problems(good)[0] == []


@pytest.mark.parametrize("arenas", [0, 2])
@pytest.mark.parametrize("keep_content", [False, True])
def test_a_paused_and_resumed_pools_snapshots_replay(device, tmp_path,
                                                     keep_content, arenas):
    p = mempool.Pool(device, max_bytes="32M", history=4096, arenas=arenas)
    live = [p.alloc(n) for n in (MiB, 3 * MiB + 512, 4096, 70000, 2 * MiB)]
    p.free(live.pop(2))
    p.snapshot(str(tmp_path / "before.pickle"))
    p.pause(keep_content=keep_content)
    p.snapshot(str(tmp_path / "paused.pickle"))
    p.resume()
    p.snapshot(str(tmp_path / "resumed.pickle"))
    b = p.alloc(MiB)  # the pool runs on after the resume
    p.free(b)
    p.snapshot(str(tmp_path / "after.pickle"))
    for a in live:
        p.free(a)
    p.destroy()
    names = ("before", "paused", "resumed", "after")
    snaps = {name: _load(tmp_path / (name + ".pickle")) for name in names}
    replays = {name: viewer_replay_problems(snaps[name]) for name in names}
    assert {name: r[0][:3] for name, r in replays.items() if r[0]} == {}
    # Truthful too: replayed back to where the pause began, the program's
    # blocks are live in mapped memory; while paused the viewer draws
    # what the device holds: nothing.
    n = len(_elide_frees(snaps["before"]["device_traces"][0]))
    for name in names[1:]:
        states = replays[name][1]
        segs, blocks = states[len(_elide_frees(snaps[name]["device_traces"][0]))
                              - n]
        assert set(live) <= blocks, name
        assert segs, name
    assert snaps["paused"]["segments"] == []
