"""An oom trace entry of mp_pool_snapshot is PyTorch's: device_free in
addr's place.

torch/csrc/cuda/memory_snapshot.cpp writes an OOM entry's figure under
"device_free" and every other entry's under "addr", never both;
torch/cuda/memory.py's TraceEntry says addr is "not present for OOM", and
_memory_viz.py's trace() and MemoryViz.js's formatEvent read
e['device_free'] for it. Before 2026-12-07 the entry carried both keys,
addr holding the free bytes, so a consumer that takes an entry with an addr
for a block event saw a block at an address that was a byte count.
"""
import os
import pickle
import subprocess

import pytest

import mempool

OOM_KEYS = {"action", "size", "stream", "time_us", "frames", "device_free"}
OTHER_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def _viz_line(e):
    """One trace entry as _memory_viz.py's trace() formats it (the fields
    it reads, by kind)."""
    if e["action"] == "oom":
        return f"oom {e['size']} requested, {e['device_free']} free"
    return f"{e['action']} {e['addr']:x} {e['size']}"


@pytest.mark.parametrize("arenas", [0, 2])
def test_an_oom_entry_has_device_free_and_no_addr(device, tmp_path, arenas):
    p = mempool.Pool(device, max_bytes="4M", history=32, arenas=arenas)
    a = p.alloc(1 << 20)
    with pytest.raises(mempool.OutOfMemory):
        p.alloc(64 << 20)
    p.snapshot(str(tmp_path / "s.pickle"))
    with open(tmp_path / "s.pickle", "rb") as f:
        t = pickle.load(f)["device_traces"][0]
    oom = [e for e in t if e["action"] == "oom"]
    assert len(oom) == 1, t
    assert set(oom[0]) == OOM_KEYS, oom[0]
    assert oom[0]["size"] == 64 << 20
    # What the pool could still reserve under its cap at the failure (the
    # pool's figure: see snapshot.c's top).
    assert oom[0]["device_free"] == (4 << 20) - p.stats()["reserved_bytes"]
    for e in t:
        if e["action"] != "oom":
            assert set(e) == OTHER_KEYS, e
        _viz_line(e)
    p.free(a)
    p.destroy()


def test_mpbench_replays_a_snapshot_with_an_oom_entry(device, tmp_path):
    # mpbench's reader (bench/core/pickle.c) takes an oom entry without an
    # addr, as PyTorch writes it, and counts it as an allocation failure.
    b = os.environ.get("MEMPOOL_TEST_BINARY_DIR")
    mpbench = os.path.join(b, "bench", "mpbench") if b else None
    if not mpbench or not os.access(mpbench, os.X_OK):
        pytest.skip("mpbench not built (MEMPOOL_TEST_BINARY_DIR unset)")
    p = mempool.Pool(device, max_bytes="4M", history=32)
    a = p.alloc(1 << 20)
    with pytest.raises(mempool.OutOfMemory):
        p.alloc(64 << 20)
    p.free(a)
    p.snapshot(str(tmp_path / "s.pickle"))
    p.destroy()
    r = subprocess.run([mpbench, "replay", str(tmp_path / "s.pickle"),
                        "--out", str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
