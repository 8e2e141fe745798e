"""Cleanup that runs at a point the caller did not choose (the finalizer
of a dropped Stream, Pool or Device, which the collector may run anywhere
on the caller's thread) leaves the thread's last error as it was: a
destroy refused there is said as a ResourceWarning, and mp_last_error(),
mp_last_status() and mp_last_driver_error() still describe the caller's
own failure (mp_error_save / mp_error_restore)."""
import ctypes
import gc

import pytest

import mempool
from mempool import _lib


def _last():
    L = _lib.lib()
    return L.mp_last_status(), L.mp_last_error()


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


def test_the_state_is_the_librarys_size_and_round_trips():
    # _lib.error_state() is room of the library's own size
    # (mp_error_state_size), not a layout mirrored here: a save fills it
    # and a restore gives back the status and message it took.
    L = _lib.lib()
    saved = _lib.error_state()
    assert ctypes.sizeof(saved) == L.mp_error_state_size() > 512
    with pytest.raises(mempool.InvalidArgument):
        mempool.Device("host:capacity=" + "9" * 2000)
    status, message = _last()
    assert status != 0 and message
    L.mp_error_save(saved)
    with pytest.raises(mempool.InvalidArgument):
        mempool.Device("host:nonsense=1")
    assert _last() != (status, message)
    L.mp_error_restore(saved)
    assert _last() == (status, message)
