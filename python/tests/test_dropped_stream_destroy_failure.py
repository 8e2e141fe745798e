"""A Stream dropped without destroy() whose destroy the library refuses
(from a host function, where no device call may be made; a handle the
device no longer knows; on CUDA a stream being captured) is not passed
over in silence: a ResourceWarning says why, and the stream is destroyed
with its Device's close."""
import ctypes
import gc
import os
import threading

import pytest

import mempool
from process_threads import left_since

V = ctypes.c_void_p
HOSTFN = ctypes.CFUNCTYPE(None, V)


def _tasks():
    """The process's threads: a host device's stream is a worker each."""
    return set(os.listdir("/proc/self/task"))


def test_a_stream_dropped_in_a_host_function_is_said_and_closed_with_its_device():
    gc.collect()
    tasks = _tasks()
    lib = ctypes.CDLL(mempool.library_path())
    lib.mp_stream_launch_host.argtypes = [V, V, HOSTFN, V]
    lib.mp_stream_launch_host.restype = ctypes.c_int
    done = threading.Event()
    with mempool.Device("host:capacity=64M") as d:
        a = d.stream()
        held = [d.stream()]
        held[0].synchronize()

        def on_stream(_):
            try:
                del held[0]  # the last reference: dropped on a stream's worker
            finally:
                done.set()
        fn = HOSTFN(on_stream)
        with pytest.warns(ResourceWarning, match="Stream.*host function"):
            assert lib.mp_stream_launch_host(d.handle, a.handle, fn, None) == 0
            assert done.wait(30)
            a.synchronize()
        assert len(_tasks() - tasks) >= 2  # the streams' workers, the refused one too
        del a
    # the close destroyed the stream the library refused to destroy
    gc.collect()
    assert not left_since(tasks)


def test_a_dropped_stream_the_device_no_longer_knows_is_said(device):
    lib = ctypes.CDLL(mempool.library_path())
    lib.mp_stream_destroy.argtypes = [V, V]
    st = device.stream()
    assert lib.mp_stream_destroy(device.handle, st.handle) == 0
    with pytest.warns(ResourceWarning, match="Stream.*not made by"):
        del st
        gc.collect()
