"""Device.close on a device whose driver refuses a release of what the
program left on it (a cuMemFree refused at the close): the device is
closed all the same (mp_device_close_checked: closed, the refusal its
status), so the handle is dropped, never closed twice, and the refusal is
raised, not passed over. Run on the fake CUDA driver in a child process
that has it on its library path (cuFakeRefuse makes the driver refuse)."""
import os
import subprocess
import sys

import pytest

import mempool

_CHILD = r"""
import ctypes, mempool
fake = ctypes.CDLL("libcuda.so.1")
lib = ctypes.CDLL(mempool.library_path())
V = ctypes.c_void_p
lib.mp_device_alloc.argtypes = [V, ctypes.c_size_t, ctypes.POINTER(V)]
d = mempool.Device("cuda")
p = V()
assert lib.mp_device_alloc(d.handle, 1 << 20, ctypes.byref(p)) == 0
fake.cuFakeRefuse(b"cuMemFree_v2", 999, 1)  # CUDA_ERROR_UNKNOWN, once
try:
    d.close()
except mempool.MempoolError as e:
    print("RAISED", e)
print("HANDLE", d.handle)
d.close()  # closed already: nothing, no second close of a freed device
print("AGAIN ok")
"""


def test_a_close_with_a_refused_release_drops_the_handle_and_raises(tmp_path):
    fake = os.environ.get("MEMPOOL_TEST_FAKECUDA_DIR")
    if not fake or not os.path.isdir(fake):
        pytest.skip("no fake CUDA driver (MEMPOOL_TEST_FAKECUDA_DIR unset)")
    env = dict(os.environ,
               LD_LIBRARY_PATH=fake + os.pathsep +
               os.environ.get("LD_LIBRARY_PATH", ""),
               PYTHONPATH=os.path.dirname(os.path.dirname(
                   os.path.abspath(mempool.__file__))))
    r = subprocess.run([sys.executable, "-c", _CHILD], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "RAISED" in out and "cuMemFree" in out, out
    assert "HANDLE None" in out, out
    assert "AGAIN ok" in out, out
