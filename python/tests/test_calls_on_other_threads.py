"""A destroy or close on one thread while a call into the library on the
same object runs on another (ctypes lets go of the GIL for the call): it
used to free what the running call was using. Each test holds a call in
the library deterministically: mp_pool_snapshot writing to a FIFO blocks in
open() until a reader opens it."""
import os
import threading
import time

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
