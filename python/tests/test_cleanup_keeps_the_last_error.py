"""Cleanup that runs at a point the caller did not choose (the finalizer
of a dropped Stream, Pool or Device, which the collector may run anywhere
on the caller's thread; the destroy or close of a with block that a
failure leaves) leaves the thread's last error as it was: a destroy or
close refused there is said as a ResourceWarning, and mp_last_error(),
mp_last_status() and mp_last_driver_error() still describe the caller's
own failure (mp_error_save / mp_error_restore).

A destroy or close is refused in a host function (mp_stream_launch_host:
the library refuses every device call there, as CUDA forbids API calls in
one), so the paths other than the Stream's run there, on a stream's
worker thread, whose last error is its own."""
import ctypes
import gc
import threading

import pytest

import mempool
from mempool import _lib


V = ctypes.c_void_p
HOSTFN = ctypes.CFUNCTYPE(None, V)


def _last():
    L = _lib.lib()
    return L.mp_last_status(), L.mp_last_error()


def _in_a_host_function(fn):
    """fn() run in a host function of a stream of a device of its own (a
    stream's worker thread runs it); what it returned, or what it raised
    raised here."""
    lib = ctypes.CDLL(mempool.library_path())
    lib.mp_stream_launch_host.argtypes = [V, V, HOSTFN, V]
    lib.mp_stream_launch_host.restype = ctypes.c_int
    out, done = [], threading.Event()

    def on_stream(_):
        try:
            out.append((None, fn()))
        except BaseException as e:  # handed back to the test
            out.append((e, None))
        finally:
            done.set()
    cb = HOSTFN(on_stream)
    with mempool.Device("host:capacity=16M") as d:
        st = d.stream()
        assert lib.mp_stream_launch_host(d.handle, st.handle, cb, None) == 0
        assert done.wait(30)
        st.synchronize()
        st.destroy()
    raised, value = out[0]
    if raised is not None:
        raise raised
    return value


def _the_caller_fails():
    """The caller's own failure, made and recorded: the exception, and the
    (status, message) it left (a spec too long; in a host function any
    open is refused)."""
    try:
        mempool.Device("host:capacity=" + "9" * 2000)
    except mempool.MempoolError as e:
        status, message = _last()
        assert status == e.status
        assert message.decode() == e.detail and message
        return e, (status, message)
    raise AssertionError("a spec the library refuses was accepted")


def test_a_dropped_stream_whose_destroy_fails_leaves_the_callers_error(device, pool):
    L = _lib.lib()
    st = device.stream()
    # Destroyed behind the package's back: the finalizer's destroy is
    # refused (the device no longer knows the handle).
    assert L.mp_stream_destroy(device.handle, st.handle) == 0
    with pytest.raises(mempool.InvalidArgument) as e:
        pool.free(0x1234)  # the caller's own failure
    status, message = _last()
    assert status == e.value.status
    assert message.decode() == e.value.detail and message

    with pytest.warns(ResourceWarning, match="Stream.*not made by"):
        del st
        gc.collect()
    assert _last() == (status, message)


def _pool_holding_memory(device):
    """A Pool that holds no block but caches device memory: its destroy
    gives that memory back, a device call (one that holds none makes
    none, and is not refused in a host function)."""
    p = mempool.Pool(device, "max_bytes=8M")
    p.free(p.alloc(1 << 20))
    return p


@pytest.mark.parametrize("kind", ["Pool", "Device"])
def test_a_dropped_pool_or_device_whose_end_is_refused_leaves_the_callers_error(
        device, kind):
    held = [_pool_holding_memory(device) if kind == "Pool"
            else mempool.Device("host:capacity=16M")]
    handle = held[0].handle

    def drop():
        _, before = _the_caller_fails()
        del held[0]  # the last reference: its finalizer's destroy or close is refused
        gc.collect()
        return before, _last()
    # A pool's warning says why it was kept: the refusal, not live blocks.
    said = ("mempool.Pool was dropped and its destroy was refused "
            r"\(mp_pool_destroy.*host function" if kind == "Pool" else "mempool.Device")
    with pytest.warns(ResourceWarning, match=said):
        before, after = _in_a_host_function(drop)
    assert after == before
    if kind == "Pool":  # kept for the device, whose close (the fixture's) destroys it
        assert device._orphans == [handle]
    else:  # left open by its finalizer, which ran once: closed here
        assert _lib.lib().mp_device_close_ex(handle) == 0


def test_a_stream_whose_destroy_a_with_block_refuses_leaves_the_callers_error(device):
    L = _lib.lib()
    with pytest.warns(ResourceWarning, match="leaving a with block"):
        with pytest.raises(mempool.MempoolError):
            with device.stream() as st:
                # Destroyed behind the package's back: the destroy on the
                # way out is refused (the device no longer knows it).
                assert L.mp_stream_destroy(device.handle, st.handle) == 0
                err, before = _the_caller_fails()
                raise err  # the failure that leaves the block
    assert _last() == before
    st._finalizer.detach()  # its handle is gone: nothing left to destroy


@pytest.mark.parametrize("kind", ["Pool", "Device"])
def test_a_pool_or_device_whose_end_a_with_block_refuses_leaves_the_callers_error(
        device, kind):
    # a refused destroy or close keeps the object: ended here after
    obj, end = ((_pool_holding_memory(device), "destroy") if kind == "Pool"
                else (mempool.Device("host:capacity=16M"), "close"))

    def leave():
        with pytest.raises(mempool.MempoolError):
            with obj:
                err, before = _the_caller_fails()
                raise err
        return before, _last()
    with pytest.warns(ResourceWarning, match="leaving a with block"):
        before, after = _in_a_host_function(leave)
    assert after == before
    assert obj.handle is not None
    getattr(obj, end)()
    assert obj.handle is None


def test_the_state_is_the_librarys_size_and_round_trips():
    # _lib.error_state() is room of the library's own size
    # (mp_error_state_size), not a layout mirrored here: a save fills it
    # and a restore gives back the status and message it took.
    L = _lib.lib()
    saved = _lib.error_state()
    assert ctypes.sizeof(saved) == L.mp_error_state_size() > 512
    _, (status, message) = _the_caller_fails()
    L.mp_error_save(saved)
    with pytest.raises(mempool.InvalidArgument):
        mempool.Device("host:nonsense=1")
    assert _last() != (status, message)
    L.mp_error_restore(saved)
    assert _last() == (status, message)
