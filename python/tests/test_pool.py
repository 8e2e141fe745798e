"""The Pool and Device classes on the emulated host device."""
import ctypes
import gc
import json
import os

import pytest

import mempool
from process_threads import left_since, tasks


def test_alloc_free_moves_allocated_and_peak(pool):
    a = pool.alloc(1000)
    b = pool.alloc(3000)
    s = pool.stats()
    assert a and b and a != b
    # Blocks are rounded to the alignment (512 by default).
    assert s["allocated_bytes.all.current"] == 1024 + 3072
    assert s["requested_bytes.all.current"] == 4000
    assert s["allocation.all.current"] == 2
    assert s["reserved_bytes.all.current"] >= 4096
    pool.free(a)
    pool.free(b)
    s = pool.stats()
    assert s["allocated_bytes.all.current"] == 0
    assert s["allocated_bytes.all.peak"] == 4096
    assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 2
    pool.check()


def test_stats_dict_has_torch_and_own_names_that_agree(pool):
    p = pool.alloc(5 << 20)
    s = pool.stats()
    for torch_key, own in mempool.TORCH_KEYS.items():
        assert s[torch_key] == s[own], torch_key
    assert s["reserved_bytes.all.peak"] == s["peak_reserved_bytes"] >= 5 << 20
    assert s["num_device_alloc"] >= 1
    assert s["num_alloc_retries"] == 0
    pool.free(p)


def test_torch_keys_agree_with_the_c_librarys_torch_dump(pool):
    import json
    keep = pool.alloc(1 << 20)
    gap = pool.alloc(1 << 20)
    top = pool.alloc(1 << 20)
    pool.free(gap)  # free between live blocks: cached, not releasable
    c = json.loads(pool.dump("torch"))
    s = pool.stats()
    for key in mempool.TORCH_KEYS:
        assert c[key] == s[key], key
    assert set(c) - set(mempool.TORCH_KEYS) == {
        "inactive_split_bytes.all.current", "inactive_split.all.current"}
    assert c["inactive_split_bytes.all.current"] >= 1 << 20
    assert c["inactive_split.all.current"] >= 1
    pool.free(keep)
    pool.free(top)


def test_trim_gives_free_memory_back(pool):
    p = pool.alloc(8 << 20)
    pool.free(p)
    assert pool.stats()["reserved_bytes.all.current"] >= 8 << 20
    pool.trim()
    s = pool.stats()
    assert s["reserved_bytes.all.current"] == 0
    assert s["num_device_free"] >= 1
    assert s["reserved_bytes.all.peak"] >= 8 << 20


def test_record_stream_and_free_on_a_stream(device, pool):
    with device.stream() as st:
        p = pool.alloc(4096, stream=st)
        pool.record_stream(p, None)
        pool.free(p)
        q = pool.alloc(4096, stream=st)
        pool.free(q, stream=st)  # mp_pool_free_async
        st.synchronize()
    pool.check()
    assert pool.stats()["allocation.all.current"] == 0


def test_zero_bytes_is_none(pool):
    assert pool.alloc(0) is None


def test_free_of_unknown_pointer_is_invalid_argument_with_details(pool):
    with pytest.raises(mempool.InvalidArgument) as e:
        pool.free(0x1234)
    err = e.value
    assert err.name == "MP_EINVAL" and err.message == "invalid argument"
    assert err.detail  # mp_last_error() names the pointer
    assert isinstance(err, ValueError)
    assert pool.stats()["allocation.all.freed"] == 0


def test_bad_option_names_the_key(device):
    with pytest.raises(mempool.InvalidArgument) as e:
        mempool.Pool(device, "max_bytez=1G")
    assert "max_bytez" in str(e.value)


def test_keyword_options_are_applied(device):
    with mempool.Pool(device, max_bytes="4M", align=4096) as p:
        a = p.alloc(1)
        assert a % 4096 == 0
        assert p.stats()["allocated_bytes.all.current"] == 4096
        with pytest.raises(mempool.OutOfMemory) as e:
            p.alloc(8 << 20)
        assert e.value.name == "MP_ELIMIT"
        assert p.stats()["num_ooms"] == 1
        p.free(a)


def test_device_capacity_exhausted_is_out_of_memory(device):
    with mempool.Pool(device) as p:
        with pytest.raises(mempool.OutOfMemory) as e:
            p.alloc(128 << 20)  # the device has 64M
        assert isinstance(e.value, MemoryError)
        assert p.stats()["num_ooms"] == 1


def test_bad_device_spec_raises():
    with pytest.raises(mempool.InvalidArgument) as e:
        mempool.Device("host:capcity=1G")
    assert "capcity" in e.value.detail


def test_device_name_and_mem_info(device):
    assert device.name.startswith("host")
    free, total = device.mem_info()
    assert total == 64 << 20 and 0 < free <= total


def test_destroyed_pool_refuses_calls(device):
    p = mempool.Pool(device)
    p.destroy()
    p.destroy()  # twice is fine
    with pytest.raises(mempool.InvalidArgument):
        p.alloc(10)


def _status(name):
    L = mempool._lib.lib()
    return next(i for i in range(1, 64) if mempool._s(L.mp_status_name(i)) == name)


def test_a_destroy_that_fails_after_the_pool_went_drops_the_handle(device, monkeypatch):
    # A device free refused after others went fails mp_pool_destroy, but the
    # pool is gone (pool.h): the handle was kept and a second destroy (or
    # Device.close, for a dropped pool) freed it again. The library's
    # destroy runs for real here; only its status is the device's refusal.
    L = mempool._lib.lib()
    real = L.mp_pool_destroy_ex
    edriver = _status("MP_EDRIVER")

    def refused_after_release(handle, destroyed):
        assert real(handle, destroyed) == 0
        return edriver

    p = mempool.Pool(device)
    p.free(p.alloc(1 << 20))
    monkeypatch.setattr(L, "mp_pool_destroy_ex", refused_after_release)
    with pytest.raises(mempool.MempoolError) as e:
        p.destroy()
    assert e.value.status == edriver
    assert p.handle is None
    monkeypatch.undo()
    p.destroy()  # nothing left to destroy: no second free
    with pytest.raises(mempool.InvalidArgument):
        p.alloc(10)


def test_a_destroy_refused_before_anything_went_keeps_the_pool(device, monkeypatch):
    L = mempool._lib.lib()
    edriver = _status("MP_EDRIVER")
    p = mempool.Pool(device)
    a = p.alloc(1 << 20)
    monkeypatch.setattr(L, "mp_pool_destroy_ex", lambda handle, destroyed: edriver)
    with pytest.raises(mempool.MempoolError):
        p.destroy()
    monkeypatch.undo()
    assert p.handle is not None
    p.free(a)
    p.destroy()
    assert p.handle is None



def test_options_appended_after_the_first_config_size_reach_the_pool(device):
    # arenas is a field appended after struct_size: a config made at the
    # first size dropped it (the pool had no arenas). A pool with arenas
    # names each segment's arena in its JSON dump.
    p = mempool.Pool(device, max_bytes="8M", arenas=2)
    a = p.alloc(4096)
    segments = json.loads(p.dump("json"))["segments"]
    assert segments and all("arena" in g for g in segments)
    p.free(a)
    p.destroy()
    plain = mempool.Pool(device, max_bytes="8M")
    b = plain.alloc(4096)
    assert not any("arena" in g for g in json.loads(plain.dump("json"))["segments"])
    plain.free(b)
    plain.destroy()


def test_map_piece_reaches_the_pool_and_trim_gives_back_free_pieces(device):
    # map_piece is a field appended after arenas: growth maps 2 MiB pieces
    # (four device maps for 8 MiB), and trim gives back the three free
    # pieces of a growth whose first 2 MiB are used again.
    p = mempool.Pool(device, max_bytes="32M", map_piece="2M")
    a = p.alloc(8 << 20)
    assert p.stats()["device_alloc_count"] == 4
    p.free(a)
    b = p.alloc(2 << 20)
    p.trim()
    assert p.stats()["reserved_bytes"] == 2 << 20
    p.free(b)
    p.destroy()


def test_a_dropped_empty_pool_gives_its_memory_back(device):
    # A Pool dropped without destroy() holding no block is destroyed with
    # it: what it reserved goes back to the device (it leaked before, and
    # Device.close then closed the device under the library's pool).
    free0, _ = device.mem_info()
    p = mempool.Pool(device)
    p.free(p.alloc(8 << 20))
    assert device.mem_info()[0] < free0
    del p
    gc.collect()
    assert device.mem_info()[0] == free0


def test_a_dropped_pool_with_live_blocks_keeps_them_until_the_device_closes(device):
    # Its blocks may still be used through their addresses: it is kept
    # (with a ResourceWarning), not destroyed under them, and Device.close
    # destroys it before closing.
    p = mempool.Pool(device)
    addr = p.alloc(1 << 20)
    used = device.mem_info()[0]
    with pytest.warns(ResourceWarning, match="live"):
        del p
        gc.collect()
    assert addr and device.mem_info()[0] == used
    device.close()
    assert device.handle is None


def test_freeing_what_alloc_of_zero_returned_does_nothing(device, pool):
    # alloc(0) returns None (the C NULL), but free(None) raised TypeError,
    # so `p = pool.alloc(n); ...; pool.free(p)` failed for n == 0.
    p = pool.alloc(0)
    q = pool.alloc(4096)
    before = pool.stats()
    pool.free(p)
    st = device.stream()
    pool.free(p, stream=st)
    st.destroy()
    after = pool.stats()
    for key in ("allocation.all.current", "allocation.all.freed",
                "allocated_bytes.all.current"):
        assert after[key] == before[key], key
    pool.free(q)
    pool.check()


def test_a_destroyed_pool_refuses_free_of_none_too(device):
    p = mempool.Pool(device)
    p.destroy()
    with pytest.raises(mempool.InvalidArgument, match="destroyed"):
        p.free(None)


def test_a_dropped_device_is_closed():
    # A Device dropped without close() kept the library's device open: on
    # the host device a worker thread per stream and its reserved memory
    # (50 dropped devices: 100 threads, 1.8 GB of address space).
    gc.collect()
    before = tasks()
    d = mempool.Device("host:capacity=64M")
    p = mempool.Pool(d)
    p.free(p.alloc(1 << 20))
    st = d.stream()
    st.synchronize()
    assert tasks() - before
    del d, p, st
    gc.collect()
    assert not left_since(before)


def test_a_refused_close_raises_and_leaves_the_device_open():
    # The library refuses a close from a host function (a stream's worker
    # runs it; CUDA forbids API calls there) and keeps the device open.
    # close() called mp_device_close, which returns nothing: it dropped the
    # handle as if closed, so the device (its worker threads, its memory)
    # stayed open for the life of the process and could not be closed.
    import threading
    gc.collect()
    before = tasks()
    d = mempool.Device("host:capacity=64M")
    st = d.stream()
    lib = ctypes.CDLL(mempool.library_path())
    V = ctypes.c_void_p
    HOSTFN = ctypes.CFUNCTYPE(None, V)
    lib.mp_stream_launch_host.argtypes = [V, V, HOSTFN, V]
    lib.mp_stream_launch_host.restype = ctypes.c_int
    seen, done = [], threading.Event()

    def on_stream(_):
        try:
            d.close()
            seen.append("closed")
        except mempool.MempoolError as e:
            seen.append(e)
        done.set()
    fn = HOSTFN(on_stream)
    assert lib.mp_stream_launch_host(d.handle, st.handle, fn, None) == 0
    assert done.wait(30)
    assert isinstance(seen[0], mempool.InvalidArgument), seen
    assert d.handle is not None  # still open, still usable
    st.synchronize()
    del st
    d.close()  # from here it closes
    assert d.handle is None
    gc.collect()
    assert not left_since(before)


def test_a_dropped_device_keeps_a_pool_dropped_with_live_blocks():
    # Those blocks' addresses may still be in use: the device stays open
    # (with a ResourceWarning), its memory still there to write.
    d = mempool.Device("host:capacity=64M")
    p = mempool.Pool(d)
    addr = p.alloc(4096)
    with pytest.warns(ResourceWarning):
        del d, p
        gc.collect()
    ctypes.memset(addr, 0x5A, 4096)
    assert ctypes.string_at(addr, 4096) == b"\x5a" * 4096


def test_a_dropped_stream_is_destroyed_and_its_blocks_stay_usable(device, pool):
    # A Stream dropped without destroy() lived until its Device closed: on
    # the host device a worker thread each, so a loop making streams on a
    # long-lived device piled them up.
    gc.collect()
    before = tasks()
    st = device.stream()
    p = pool.alloc(4096, stream=st)
    pool.free(pool.alloc(4096, stream=st), stream=st)
    assert len(tasks() - before) == 1
    del st
    gc.collect()
    assert not left_since(before)
    pool.free(p)  # the pool forgot the stream, not the block
    pool.check()
    assert pool.stats()["allocation.all.current"] == 0


def test_close_collects_a_pool_dropped_in_a_reference_cycle(device):
    # A dropped Pool still in a reference cycle (an object holding it and
    # itself, a traceback's frames) waits for the cycle collector: close()
    # counted it as live and raised Busy until some later collection ran.
    class Holder:
        pass
    gc.disable()  # no collection but the one close() asks for
    try:
        empty = mempool.Pool(device)
        h = Holder()
        h.self, h.pool = h, empty
        busy = mempool.Pool(device)
        busy.alloc(4096)
        h.busy = busy
        del empty, busy, h
        with pytest.warns(ResourceWarning, match="live"):
            device.close()
    finally:
        gc.enable()
    assert device.handle is None


# Prepended to the fork tests' child scripts: waits 30 s at most for pid
# (inside the scripts' 60 s), then kills it and exits with why.
_WAIT_CHILD = """
import os, signal, sys, time
def wait_child(pid, why):
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.exit(why)
"""


@pytest.mark.parametrize("held", ["pool", "device", "stream"])
def test_a_forked_child_exits_without_touching_the_parents_objects(held):
    # A child forked with a Pool, Device or Stream of the parent alive ran
    # their finalizers at its exit: the library's state there is a copy
    # whose device threads were not forked, and the destroy or close
    # waited for them for ever (the child hung, and its parent in wait).
    import subprocess
    import sys
    code = """if True:
        import os, signal, sys, time, mempool
        d = mempool.Device("host:capacity=64M")
        held = {"device": d}
        d.synchronize()
        if sys.argv[1] == "pool":
            held["pool"] = p = mempool.Pool(d)
            p.free(p.alloc(4096))
        if sys.argv[1] == "stream":
            held["stream"] = st = d.stream()
            st.synchronize()
        pid = os.fork()
        if pid == 0:
            sys.exit(7)  # a normal exit: atexit and finalizers run
        status = wait_child(pid, "the child hung at exit")
        assert os.waitstatus_to_exitcode(status) == 7, status
        for obj in (held.get("stream"), held.get("pool")):
            if obj is not None:
                obj.destroy()  # the parent's are still there
        d.close()
        print("ok")
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _WAIT_CHILD + code, held], cwd=pkg, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_a_forked_child_is_refused_the_parents_objects():
    # In a child forked from the process that made them, a Pool's trim or
    # destroy, a Stream's destroy or a Device's close waited for device
    # threads that were not forked: the child hung. Every call on them is
    # refused there, naming the process they belong to.
    import subprocess
    import sys
    code = """if True:
        import os, signal, sys, time, mempool
        d = mempool.Device("host:capacity=64M")
        p = mempool.Pool(d)
        st = d.stream()
        p.free(p.alloc(4096, stream=st), stream=st)
        pid = os.fork()
        if pid == 0:
            refused = 0
            for call in (p.trim, p.destroy, st.destroy, d.close, d.synchronize,
                         lambda: p.alloc(4096), lambda: mempool.Pool(d),
                         st.synchronize, p.stats):
                try:
                    call()
                except mempool.InvalidArgument as e:
                    refused += "process %d" % os.getppid() in str(e)
            assert repr(d) == "<mempool.Device of process %d>" % os.getppid()
            os._exit(refused)
        status = wait_child(pid, "the child hung")
        print(os.waitstatus_to_exitcode(status))
        p.free(p.alloc(4096, stream=st), stream=st)  # the parent's still work
        p.trim()
        p.destroy()
        st.destroy()
        d.close()
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _WAIT_CHILD + code], cwd=pkg, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "9"


def test_dump_of_none_is_the_text_dump_as_in_c(pool):
    # mp_pool_dump takes a NULL format as "text"; None raised TypeError.
    p = pool.alloc(4096)
    try:
        assert pool.dump(None) == pool.dump("text")
    finally:
        pool.free(p)


def test_a_forked_child_is_refused_the_parents_default_pools():
    # The default pools (default_pool_stats, mempool.torch's calls) are the
    # library's process-wide state: a child forked after the parent used
    # them holds a copy whose device threads do not run there, and
    # mempool.torch.empty_cache() there waited for them for ever (the child
    # hung); default_pool_stats() read the parent's figures. A child whose
    # parent never used them makes its own.
    import subprocess
    import sys
    code = """if True:
        import os, sys, mempool, mempool.torch
        if sys.argv[1] == "used":  # as PyTorch does after mempool.torch.use()
            import ctypes
            lib = ctypes.CDLL(mempool.library_path())
            lib.mp_torch_malloc.restype = ctypes.c_void_p
            lib.mp_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.mp_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                          ctypes.c_void_p]
            mempool.torch.set_memory_fraction(0.5, 0)
            lib.mp_torch_free(lib.mp_torch_malloc(8 << 20, 0, None), 8 << 20, 0, None)
        else:
            mempool.Device("host:capacity=64M").close()  # the library loaded
        pid = os.fork()
        if pid == 0:
            refused = 0
            for call in (mempool.torch.empty_cache, mempool.default_pool_stats,
                         lambda: mempool.torch.set_memory_fraction(0, 0)):
                try:
                    call()
                except mempool.InvalidArgument as e:
                    refused += "process %d" % os.getppid() in str(e)
            os._exit(refused)
        status = wait_child(pid, "the child hung")
        print(os.waitstatus_to_exitcode(status))
        mempool.torch.empty_cache()  # the parent's still work
        mempool.default_pool_stats()
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MEMPOOL_DEVICE="host:capacity=64M")
    env.pop("MEMPOOL_CONF", None)
    for parent, refused in (("used", "3"), ("unused", "0")):
        r = subprocess.run([sys.executable, "-c", _WAIT_CHILD + code, parent], cwd=pkg,
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == refused, parent
