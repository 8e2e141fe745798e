"""Pool.snapshot / mp_pool_snapshot: PyTorch's memory snapshot pickle.

Checked against the documented format (the TypedDicts Segment, Block, Frame
and TraceEntry of torch/cuda/memory.py, which torch/cuda/_memory_viz.py
reads; no torch here), with Python's own pickle, and replayed with mpbench.
"""
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

import mempool

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size",
                "active_size", "requested_size", "stream", "segment_type",
                "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_map",
           "segment_unmap", "segment_alloc", "segment_free", "oom"}


def _run(pool, sizes):
    """Allocates and frees in a pattern with several live blocks."""
    live = []
    for i, n in enumerate(sizes):
        live.append(pool.alloc(n))
        if i % 3 == 2:
            pool.free(live.pop(0))
    return live


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


SIZES = [1000, 70000, 3 << 20, 512, 9000, 1 << 20, 300, 5 << 20, 4096,
         123457, 2 << 20, 64]


@pytest.mark.parametrize("virtual", [0, 1])
def test_snapshot_has_the_fields_the_viewer_reads(device, tmp_path, virtual):
    p = mempool.Pool(device, max_bytes="32M", history=1000, virtual=virtual)
    live = _run(p, SIZES)
    path = tmp_path / "snap.pickle"
    p.snapshot(str(path))
    s = _load(path)
    assert {"segments", "device_traces"} <= set(s)
    st = p.stats()
    assert sum(seg["total_size"] for seg in s["segments"]) == st["reserved_bytes"]
    assert sum(seg["allocated_size"] for seg in s["segments"]) == st["allocated_bytes"]
    nlive = 0
    for seg in s["segments"]:
        assert set(seg) == SEGMENT_KEYS
        assert seg["segment_type"] in ("small", "large")
        assert seg["is_expandable"] is bool(virtual)
        assert isinstance(seg["segment_pool_id"], tuple)
        # Blocks tile the segment in address order, as memory_viz draws them.
        at = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == BLOCK_KEYS
            assert b["address"] == at
            at += b["size"]
            assert b["state"] in ("active_allocated", "inactive")
            if b["state"] == "active_allocated":
                nlive += 1
                assert b["address"] in live
                assert 0 < b["requested_size"] <= b["size"]
            else:
                assert b["requested_size"] == 0
        assert at == seg["address"] + seg["total_size"]
    assert nlive == len(live)
    traces = s["device_traces"]
    assert isinstance(traces, list) and len(traces) == 1
    t = traces[0]
    assert t, "no trace entries"
    for e in t:
        assert set(e) == (TRACE_KEYS - {"addr"} | {"device_free"}
                          if e["action"] == "oom" else TRACE_KEYS)
        assert e["action"] in ACTIONS
        assert e["frames"] == []  # no history_stacks
    allocs = [e for e in t if e["action"] == "alloc"]
    assert len(allocs) == len(SIZES)
    assert [e["time_us"] for e in t] == sorted(e["time_us"] for e in t)
    grow = "segment_map" if virtual else "segment_alloc"
    assert t[0]["action"] == grow
    frees = [e["addr"] for e in t if e["action"] == "free_completed"]
    assert len(frees) == len(SIZES) - len(live)
    for a in live:
        p.free(a)
    p.destroy()


# With arenas too (refused at create before 2026-12-01): the arena's ring
# holds the events, its stacks start at the pool's caller as well.
@pytest.mark.parametrize("arenas", [0, 2])
def test_stacks_come_symbolized_only_with_history_stacks(device, tmp_path,
                                                         arenas):
    p = mempool.Pool(device, max_bytes="8M", history=64, history_stacks=1,
                     arenas=arenas)
    a = p.alloc(4096)
    p.snapshot(str(tmp_path / "s.pickle"))
    s = _load(tmp_path / "s.pickle")
    alloc = [e for e in s["device_traces"][0] if e["action"] == "alloc"][0]
    assert alloc["frames"], "no frames with history_stacks=1"
    for fr in alloc["frames"]:
        assert set(fr) == {"filename", "line", "name"}
        assert isinstance(fr["filename"], str) and isinstance(fr["line"], int)
    # The stack starts at the pool's caller (here ctypes' call through
    # libffi): none of the library's own frames is kept.
    lib = os.path.realpath(mempool.library_path())
    assert all(os.path.realpath(fr["filename"]) != lib for fr in alloc["frames"]), \
        alloc["frames"]
    assert not any(fr["name"].startswith("mp_") for fr in alloc["frames"])
    block = [b for seg in s["segments"] for b in seg["blocks"]
             if b["state"] == "active_allocated"][0]
    assert block["frames"] == alloc["frames"]
    p.free(a)
    p.destroy()


def test_an_oom_entry_has_device_free(device, tmp_path):
    # _memory_viz.py's trace() reads e['device_free'] for an oom entry.
    p = mempool.Pool(device, max_bytes="4M", history=16)
    a = p.alloc(1 << 20)
    with pytest.raises(mempool.OutOfMemory):
        p.alloc(64 << 20)
    p.snapshot(str(tmp_path / "s.pickle"))
    t = _load(tmp_path / "s.pickle")["device_traces"][0]
    oom = [e for e in t if e["action"] == "oom"]
    assert len(oom) == 1
    assert oom[0]["size"] == 64 << 20
    assert oom[0]["device_free"] == (4 << 20) - p.stats()["reserved_bytes"]
    p.free(a)
    p.destroy()


def test_without_history_the_trace_is_empty_but_segments_are_there(device, tmp_path):
    p = mempool.Pool(device, max_bytes="8M")
    a = p.alloc(4096)
    p.snapshot(str(tmp_path / "s.pickle"))
    s = _load(tmp_path / "s.pickle")
    assert s["device_traces"] == [[]]
    assert len(s["segments"]) == 1
    p.free(a)
    p.destroy()


_ON_CUDA1 = """
import sys
import mempool
d = mempool.Device("cuda:1")
p = mempool.Pool(d, max_bytes="16M", history=64)
a = p.alloc(1 << 20)
p.snapshot(sys.argv[1])
p.free(a)
p.destroy()
d.close()
"""


def test_a_pool_on_cuda1_is_device_1(tmp_path):
    # PyTorch's snapshot names each segment's device and keeps one list of
    # events per device, indexed by ordinal (memory_viz reads
    # device_traces[device]). Run on the fake CUDA driver with two devices,
    # in a child process that has it on its library path.
    fake = os.environ.get("MEMPOOL_TEST_FAKECUDA_DIR")
    if not fake or not os.path.isdir(fake):
        pytest.skip("no fake CUDA driver (MEMPOOL_TEST_FAKECUDA_DIR unset)")
    env = dict(os.environ, FAKECUDA_DEVICE_COUNT="2",
               LD_LIBRARY_PATH=fake + os.pathsep +
               os.environ.get("LD_LIBRARY_PATH", ""),
               PYTHONPATH=os.path.dirname(os.path.dirname(
                   os.path.abspath(mempool.__file__))))
    path = tmp_path / "cuda1.pickle"
    r = subprocess.run([sys.executable, "-c", _ON_CUDA1, str(path)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    s = _load(path)
    assert s["segments"] and all(seg["device"] == 1 for seg in s["segments"])
    assert len(s["device_traces"]) == 2
    assert s["device_traces"][0] == []
    assert [e["action"] for e in s["device_traces"][1]][-1] == "alloc"


def test_bad_path_raises_and_writes_nothing(device, tmp_path):
    p = mempool.Pool(device, max_bytes="8M", history=8)
    with pytest.raises(mempool.MempoolError) as ei:
        p.snapshot(str(tmp_path / "missing" / "s.pickle"))
    assert "missing" in str(ei.value)
    assert os.listdir(tmp_path) == []
    p.destroy()


def _mpbench():
    b = os.environ.get("MEMPOOL_TEST_BINARY_DIR")
    path = os.path.join(b, "bench", "mpbench") if b else None
    if not path or not os.access(path, os.X_OK):
        pytest.skip("mpbench not built (MEMPOOL_TEST_BINARY_DIR unset)")
    return path


@pytest.mark.parametrize("virtual", [0, 1])
def test_replay_of_a_snapshot_reproduces_peak_live_bytes(device, tmp_path, virtual):
    p = mempool.Pool(device, max_bytes="48M", history=1000, virtual=virtual)
    for a in _run(p, SIZES * 3):
        p.free(a)
    st = p.stats()
    p.snapshot(str(tmp_path / "run.pickle"))
    p.destroy()
    out = tmp_path / "out"
    r = subprocess.run([_mpbench(), "replay", str(tmp_path / "run.pickle"),
                        "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((out / "results.json").read_text())
    pool = [x for x in rows if x["allocator"] == ("pool" if virtual else
                                                   "pool:virtual=0")]
    assert pool and pool[0]["completed"]
    # Trace sizes are the bytes asked for, as PyTorch's: the replay's live
    # bytes are the pool's requested bytes, and its peak is the run's.
    assert pool[0]["peak_live_bytes"] == st["peak_requested_bytes"]
    # The same allocator on the same sequence reserves the same peak.
    assert pool[0]["peak_reserved_bytes"] == st["peak_reserved_bytes"]


# The opcodes the unpickler of PyTorch's memory_viz page
# (torch/utils/viz/MemoryViz.js, function unpickle) handles; a snapshot that
# used any other would load in Python but not in the page.
VIEWER_OPCODES = {"PROTO", "FRAME", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE",
                  "MARK", "SETITEMS", "APPENDS", "APPEND", "BINUNICODE",
                  "SHORT_BINUNICODE", "BININT", "BININT1", "BININT2", "LONG1",
                  "NEWTRUE", "NEWFALSE", "NONE", "TUPLE2", "BINFLOAT",
                  "MEMOIZE", "BINPUT", "BINGET", "LONG_BINGET", "STOP"}


def test_snapshot_uses_only_opcodes_the_memory_viz_page_reads(device, tmp_path):
    import pickletools
    p = mempool.Pool(device, max_bytes="16M", history=256, history_stacks=1)
    for a in _run(p, SIZES[:8]):
        p.free(a)
    p.snapshot(str(tmp_path / "s.pickle"))
    data = (tmp_path / "s.pickle").read_bytes()
    used = {op.name for op, _, _ in pickletools.genops(data)}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES
    assert data[:2] == b"\x80\x02"
    p.destroy()


def _append_batches(data):
    """The number of items each APPENDS of the pickle adds: the values
    pushed since its MARK (each opcode's net effect on the stack, from
    pickletools' own description of it)."""
    import pickletools
    marks, batches = [0], []
    for op, _, _ in pickletools.genops(data):
        if op.name == "MARK":
            marks.append(0)
        elif op.name in ("APPENDS", "SETITEMS"):
            n = marks.pop()
            if op.name == "APPENDS":
                batches.append(n)
        else:
            marks[-1] += len(op.stack_after) - len(op.stack_before)
    return batches


def test_long_lists_are_appended_in_batches_the_viewer_can_spread(device,
                                                                  tmp_path):
    # memory_viz's unpickler spreads each APPENDS batch into one push()
    # call, which V8 refuses above about 125 000 arguments: a trace of
    # 200 000 entries in one batch did not open there. Written as Python
    # writes lists, in batches of at most 1000, it does.
    p = mempool.Pool(device, max_bytes="16M", history=5000)
    for _ in range(1200):  # alloc, free_requested, free_completed
        p.free(p.alloc(4096))
    p.snapshot(str(tmp_path / "s.pickle"))
    data = (tmp_path / "s.pickle").read_bytes()
    batches = _append_batches(data)
    assert max(batches) <= 1000, max(batches)
    trace = pickle.loads(data)["device_traces"][0]
    assert len(trace) == 3601  # and the first segment_map
    # 3601 entries: three full batches and the rest.
    assert batches.count(1000) == 3, batches
    p.destroy()


@pytest.mark.parametrize("keep_content", [False, True])
def test_a_paused_pool_lists_no_mapped_memory(device, tmp_path, keep_content):
    # Pause gives every mapped byte back to the device: a snapshot then
    # holds no segment (memory_viz draws segments as reserved memory, and
    # stats say 0 reserved), and the trace says where the memory went
    # (segment_unmap at the pause, segment_map again at resume), so that
    # the viewer's segment timeline, replayed from the segments, agrees.
    # The live blocks leave with their memory (a free of each before the
    # unmaps) and come back with it (an alloc of each after the maps), as
    # the viewer allows no live block in unmapped memory
    # (test_snapshot_viewer_replay.py).
    p = mempool.Pool(device, max_bytes="32M", history=1000)
    live = _run(p, SIZES)
    p.snapshot(str(tmp_path / "before.pickle"))
    before = _load(tmp_path / "before.pickle")
    mapped = sorted((seg["address"], seg["total_size"])
                    for seg in before["segments"])
    assert mapped
    p.pause(keep_content=keep_content)
    assert p.stats()["reserved_bytes"] == 0
    p.snapshot(str(tmp_path / "paused.pickle"))
    paused = _load(tmp_path / "paused.pickle")
    assert paused["segments"] == []
    t = paused["device_traces"][0]
    n = len(before["device_traces"][0])
    ev = t[n:]
    k = 2 * len(live)
    assert [e["action"] for e in ev[:k]] == \
        ["free_requested", "free_completed"] * len(live)
    assert sorted(e["addr"] for e in ev[:k:2]) == sorted(live)
    unmapped = sorted((e["addr"], e["size"]) for e in ev[k:])
    assert [e["action"] for e in ev[k:]] == ["segment_unmap"] * len(ev[k:])
    assert unmapped and sum(s for _, s in unmapped) == sum(s for _, s in mapped)
    p.resume()
    p.snapshot(str(tmp_path / "resumed.pickle"))
    resumed = _load(tmp_path / "resumed.pickle")
    assert sorted((seg["address"], seg["total_size"])
                  for seg in resumed["segments"]) == mapped
    t = resumed["device_traces"][0][len(t):]
    assert [e["action"] for e in t] == \
        ["segment_map"] * len(unmapped) + ["alloc"] * len(live)
    assert sorted((e["addr"], e["size"])
                  for e in t[:len(unmapped)]) == unmapped
    assert sorted(e["addr"] for e in t[len(unmapped):]) == sorted(live)
    for a in live:
        p.free(a)
    p.destroy()


def test_a_pool_with_arenas_shows_every_arenas_blocks(device, tmp_path):
    # Each thread allocates in an arena of its own; the pool itself holds no
    # memory, so the snapshot is made of the arenas' segments.
    p = mempool.Pool(device, max_bytes="48M", arenas=2)
    got = {}

    def work(k):
        got[k] = p.alloc((k + 2) << 20)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = tmp_path / "arenas.pickle"
    p.snapshot(str(path))
    s = _load(path)
    st = p.stats()
    assert sum(seg["total_size"] for seg in s["segments"]) == st["reserved_bytes"]
    assert sum(seg["allocated_size"] for seg in s["segments"]) == st["allocated_bytes"]
    live = {b["address"]: b["size"] for seg in s["segments"]
            for b in seg["blocks"] if b["state"] == "active_allocated"}
    assert set(live) == set(got.values())
    for k, addr in got.items():
        assert live[addr] >= (k + 2) << 20
        p.free(addr)
    # It is a pool with arenas: each segment names its arena in the dump.
    segments = json.loads(p.dump("json"))["segments"]
    assert segments and all("arena" in g for g in segments)
    p.destroy()


def test_a_pool_with_arenas_merges_their_histories_by_time(device, tmp_path):
    # Each arena keeps a ring of its own; the trace is one list, oldest
    # first, in the order the two threads took turns (each turn a few
    # milliseconds apart, so that the times tell them apart).
    p = mempool.Pool(device, max_bytes="48M", arenas=2, history=1000)
    turn = [threading.Event(), threading.Event()]
    done = []  # (action, addr) as the threads did them

    def work(k):
        held = []
        for step in range(4):
            turn[k].wait()
            turn[k].clear()
            if step % 2 == 0:
                held.append(p.alloc((k + 1) << 20))
                done.append(("alloc", held[-1]))
            else:
                a = held.pop()
                p.free(a)
                done.append(("free_requested", a))
            time.sleep(0.003)
            turn[1 - k].set()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    turn[0].set()
    for t in threads:
        t.join()
    path = tmp_path / "arenas.pickle"
    p.snapshot(str(path))
    trace = _load(path)["device_traces"][0]
    # (No oom entry: an arena asking for its share of the cap is none.)
    assert all(set(e) == TRACE_KEYS for e in trace)
    times = [e["time_us"] for e in trace]
    assert times == sorted(times)
    seen = [(e["action"], e["addr"]) for e in trace
            if e["action"] in ("alloc", "free_requested")]
    assert seen == done
    p.destroy()


def test_a_snapshot_that_cannot_be_written_raises_an_os_error(pool, tmp_path):
    # MP_EIO had no class of its own: a snapshot to a missing directory
    # raised a bare MempoolError, which `except OSError` did not catch.
    path = tmp_path / "no-such-dir" / "x.pickle"
    with pytest.raises(mempool.IOFailure) as e:
        pool.snapshot(path)
    assert isinstance(e.value, OSError) and isinstance(e.value, mempool.MempoolError)
    assert e.value.name == "MP_EIO" and str(path) in str(e.value)
    assert not path.parent.exists()
