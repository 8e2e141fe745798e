"""A destroy or close on one thread while a call into the library on the
same object runs on another (ctypes lets go of the GIL for the call): it
used to free what the running call was using. Each test holds a call in
the library deterministically: mp_pool_snapshot writing to a FIFO blocks in
open() until a reader opens it."""
import os
import threading
import time
import warnings

import pytest

import mempool


def _held_snapshot(pool, tmp_path):
    """Starts pool.snapshot(fifo) on a thread; returns (thread, fifo, result
    list). The call is in the library once the pool counts it."""
    fifo = str(tmp_path / "snap.fifo")
    os.mkfifo(fifo)
    result = []

    def run():
        try:
            pool.snapshot(fifo)
            result.append("ok")
        except Exception as e:  # reported to the main thread
            result.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while getattr(pool, "_calls", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return t, fifo, result


def _release(t, fifo):
    """Opens the FIFO's read end (never blocking, should the writer have
    failed before it opened) and reads until the writer closes it."""
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    chunks = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            try:
                b = os.read(fd, 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not b and not t.is_alive():
                break
            if not b:
                time.sleep(0.01)  # no writer yet, or between writes
            chunks.append(b)
    finally:
        os.close(fd)
    t.join(30)
    assert not t.is_alive()
    return b"".join(chunks)


def test_destroy_is_busy_while_a_call_on_the_pool_runs_on_another_thread(device, tmp_path):
    pool = mempool.Pool(device, "max_bytes=16M")
    p = pool.alloc(4096)
    t, fifo, result = _held_snapshot(pool, tmp_path)
    try:
        with pytest.raises(mempool.Busy) as e:
            pool.destroy()
        assert "running on other threads" in str(e.value)
        assert pool.handle is not None
    finally:
        data = _release(t, fifo)
    # The held call finished on a pool that was all there, and the pool
    # still works.
    assert result == ["ok"]
    assert data[:1] == b"\x80"  # a pickle
    pool.free(p)
    assert pool.stats()["allocated_bytes.all.current"] == 0
    pool.destroy()
    assert pool.handle is None


def test_stream_destroy_and_device_close_are_busy_while_a_call_uses_the_stream(device):
    s = device.stream()
    # A call that uses the stream (a pool's alloc or free on it, its
    # synchronize) counts on the stream and on its device while it runs:
    # _use is what each of them enters for the length of the call.
    with mempool._use(s):
        with pytest.raises(mempool.Busy):
            s.destroy()
        with pytest.raises(mempool.Busy):
            device.close()
        assert s.handle is not None and device.handle is not None
    s.synchronize()  # both still there
    s.destroy()
    assert s.handle is None


def test_a_call_begun_during_a_destroy_finds_the_pool_gone(device):
    pool = mempool.Pool(device, "max_bytes=16M")
    got = []
    with pool._guard:  # as destroy holds it while it runs
        def run():
            try:
                pool.alloc(4096)
                got.append("allocated")
            except mempool.InvalidArgument as e:
                got.append(str(e))

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.2)
        assert got == []  # waiting for the destroy to end
        pool.destroy()  # the same thread: the guard is re-entrant
    t.join(30)
    assert len(got) == 1 and "destroyed" in got[0]


def test_a_pool_dying_while_its_device_closes_keeps_the_device_open():
    # A dying Pool leaves the device's weak set before its finalizer runs:
    # a close on another thread in between does not count it, and freed
    # the device, which the finalizer's destroy then reached. The library
    # counts the pools on a device and refuses the close (Busy), the device
    # open; the finalizer then destroys the pool, and a later close goes.
    dev = mempool.Device("host:capacity=64M")
    pool = mempool.Pool(dev, "max_bytes=16M")
    handle, pid = pool.handle, pool._pid
    pool._finalizer.detach()
    dev._pools.discard(pool)
    with pytest.raises(mempool.Busy, match="still made on it"):
        dev.close()
    assert dev.handle is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ResourceWarning either
        mempool.Pool._dropped(dev, handle, pid)
    assert dev._orphans == []
    dev.close()
    assert dev.handle is None


def test_a_forked_child_is_refused_where_a_parent_thread_held_the_guards():
    # Python does not reset a lock in a forked child: a guard that a thread
    # of the parent held at the fork (a destroy or close running there)
    # stays held in the child, whose calls and finalizers waited on it for
    # ever. A child's calls are refused before any guard is taken.
    import subprocess
    import sys
    from test_pool import _WAIT_CHILD
    code = """if True:
        import os, sys, threading, mempool
        d = mempool.Device("host:capacity=64M")
        p = mempool.Pool(d)
        st = d.stream()
        held, done = threading.Event(), threading.Event()
        def hold():
            with p._guard, st._guard, d._guard:
                held.set()
                done.wait()
        t = threading.Thread(target=hold, daemon=True)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            refused = 0
            for call in (lambda: p.alloc(4096), p.destroy, st.destroy, d.close,
                         st.synchronize, d.synchronize):
                try:
                    call()
                except mempool.InvalidArgument:
                    refused += 1
            sys.exit(refused)  # a normal exit: the finalizers run
        status = wait_child(pid, "the child hung")
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(status))
        p.destroy()
        st.destroy()
        d.close()
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _WAIT_CHILD + code], cwd=pkg,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "6"


def test_exit_leaves_alone_what_a_daemon_thread_is_still_using(tmp_path):
    # At exit weakref.finalize runs every live finalizer, with daemon
    # threads still running: a Pool, Stream or Device still in use on one
    # of them was destroyed under its call (alloc/free pairs on a daemon
    # thread aborted at exit in 3 runs of 10 on an internal check of the
    # pool, a use after free in a release build). Here the daemon thread's
    # call is held in the library (a snapshot to a FIFO) as the interpreter
    # exits; an atexit handler registered before the finalizers runs after
    # them and says whether the pool was destroyed.
    import subprocess
    import sys
    fifo = str(tmp_path / "snap.fifo")
    os.mkfifo(fifo)
    code = """if True:
        import atexit, os, sys, threading, time
        import mempool
        destroyed = []
        atexit.register(lambda: print("destroyed" if destroyed else "kept", flush=True))
        real = mempool._destroy
        mempool._destroy = lambda h: destroyed.append(h) or real(h)
        d = mempool.Device("host:capacity=64M")
        p = mempool.Pool(d)
        p.free(p.alloc(4096))
        threading.Thread(target=p.snapshot, args=(sys.argv[1],), daemon=True).start()
        deadline = time.monotonic() + 30
        while p._calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        print("held" if p._calls else "not held", flush=True)
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code, fifo], cwd=pkg, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["held", "kept"]
