"""Pool.pause / Pool.resume (mp_pool_pause / mp_pool_resume) on the host
device, and the shim's process-wide mempool.preload_pause / preload_resume."""
import ctypes
import os
import subprocess
import sys

import pytest

import mempool

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fill(ptr, n, seed):
    data = bytes((seed + 7 * i) & 0xFF for i in range(n))
    ctypes.memmove(ptr, data, n)
    return data


def test_pause_keeps_addresses_and_content_byte_for_byte(pool):
    a, b = pool.alloc(1 << 20), pool.alloc(300000)
    da, db = _fill(a, 1 << 20, 3), _fill(b, 300000, 11)
    pool.pause(keep_content=True)
    assert pool.stats()["reserved_bytes.all.current"] == 0
    pool.resume()
    assert ctypes.string_at(a, 1 << 20) == da
    assert ctypes.string_at(b, 300000) == db
    # The same blocks, at the same addresses: they free as before.
    assert pool.stats()["allocation.all.current"] == 2
    pool.free(a)
    pool.free(b)
    pool.check()


def test_calls_while_paused_are_busy_and_change_nothing(pool):
    a = pool.alloc(4096)
    pool.pause(keep_content=False)
    before = pool.stats()
    with pytest.raises(mempool.Busy) as e:
        pool.alloc(4096)
    assert e.value.name == "MP_EBUSY"
    with pytest.raises(mempool.Busy):
        pool.free(a)
    with pytest.raises(mempool.Busy):
        pool.trim()
    with pytest.raises(mempool.Busy):  # paused already
        pool.pause()
    assert pool.stats() == before
    pool.resume()
    assert pool.stats()["allocation.all.current"] == 1
    pool.free(a)


def test_resume_without_pause_is_invalid_argument(pool):
    with pytest.raises(mempool.InvalidArgument):
        pool.resume()


def test_pool_without_virtual_memory_cannot_pause(device):
    with mempool.Pool(device, "max_bytes=8M,virtual=0") as p:
        a = p.alloc(4096)
        with pytest.raises(mempool.NotSupported):
            p.pause()
        p.free(a)  # not paused: still serves


def test_preload_calls_without_the_shim_say_so():
    with pytest.raises(mempool.PreloadNotFound) as e:
        mempool.preload_pause()
    assert "LD_PRELOAD" in str(e.value)


# A process under the shim on the host device: the shim's own cudaMalloc
# serves from its pool; the whole process pauses and resumes through the
# package, and the block's content is back at the same address.
_UNDER_SHIM = r"""
import ctypes, sys
import mempool
rt = ctypes.CDLL(None)
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
data = bytes(range(256)) * 4096
ctypes.memmove(p.value, data, len(data))
mempool.preload_pause(keep_content=True)
q = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(q), 4096) != 0, "allocated while paused"
try:
    mempool.preload_pause()
    sys.exit("paused twice")
except mempool.Busy:
    pass
mempool.preload_resume()
assert ctypes.string_at(p.value, len(data)) == data
assert rt.cudaFree(p) == 0
print("ok")
"""


@pytest.mark.skipif(not os.environ.get("MEMPOOL_TEST_SHIM"),
                    reason="MEMPOOL_TEST_SHIM (the built libmempool_preload.so) not set")
def test_preload_pause_and_resume_the_whole_process():
    env = dict(os.environ, LD_PRELOAD=os.environ["MEMPOOL_TEST_SHIM"],
               MEMPOOL_DEVICE="host:capacity=256M")
    env.pop("MEMPOOL_CONF", None)
    r = subprocess.run([sys.executable, "-c", _UNDER_SHIM], cwd=PKG, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
