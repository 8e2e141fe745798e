"""mempool.torch.use(device=...) and set_memory_fraction(device=...): the
device takes effect or is refused with nothing changed. A stand-in torch
module (installed in a child process) records what use() installs."""
import os
import subprocess
import sys

import pytest
import torch_stand_in

import mempool

_STAND_IN = """
import ctypes, os, sys
import mempool, mempool.torch
sys.path.insert(0, %r)
import torch_stand_in
installed = []
sys.modules.update(torch_stand_in.modules(installed.append))
""" % os.path.dirname(os.path.abspath(__file__)) + """
lib = ctypes.CDLL(mempool.library_path())
V = ctypes.c_void_p
lib.mp_default_pool.restype = V
lib.mp_pool_device.restype = V
lib.mp_pool_device.argtypes = [V]
lib.mp_device_mem_info.argtypes = [V, V, ctypes.POINTER(ctypes.c_size_t)]
lib.mp_torch_malloc.restype = V
lib.mp_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, V]
def capacity():
    total = ctypes.c_size_t(0)
    dev = lib.mp_pool_device(lib.mp_default_pool())
    assert lib.mp_device_mem_info(dev, None, ctypes.byref(total)) == 0
    return total.value >> 20
class Index:                     # an integer as numpy's int64 is one
    def __init__(self, n): self.n = n
    def __index__(self): return self.n
"""


# use() of a device other than the default pools' (host:capacity=64M), then
# what it set and installed and the pools' capacity in MiB.
_USE_128 = """
try:
    mempool.torch.use(device="host:capacity=128M")
except RuntimeError as e:
    print("refused:", e)
else:
    print("taken")
print(len(installed), os.environ["MEMPOOL_DEVICE"], capacity())
"""


def _run(code):
    env = dict(os.environ, MEMPOOL_DEVICE="host:capacity=64M",
               MEMPOOL_LIBRARY=mempool.library_path())
    env.pop("MEMPOOL_CONF", None)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _STAND_IN + code], env=env,
                       cwd=pkg, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")


def test_use_before_the_default_pools_exist_sets_their_device():
    out = _run("""
mempool.torch.use(device="host:capacity=128M")
print(len(installed), os.environ["MEMPOOL_DEVICE"], capacity())
""")
    assert out[0] == "1 host:capacity=128M 128"


def test_use_of_another_device_once_the_default_pools_exist_is_refused():
    # The default pools read $MEMPOOL_DEVICE once, when the first is made,
    # and live until the process exits: use() set the new device and
    # installed the allocator, and PyTorch's tensors still came from the
    # pools of the old device, silently.
    out = _run("""
mempool.default_pool_stats()   # makes the default pools, on 64M
""" + _USE_128 + """mempool.torch.use(device="host:capacity=64M")   # theirs: nothing to change
mempool.torch.use()                             # no device: nothing either
print(len(installed), os.environ["MEMPOOL_DEVICE"])
""")
    assert out[0].startswith("refused:"), out
    assert "'host:capacity=128M' cannot take effect" in out[0]
    assert "made already, on $MEMPOOL_DEVICE='host:capacity=64M'" in out[0]
    assert out[1] == "0 host:capacity=64M 64"  # nothing set or installed
    assert out[2] == "2 host:capacity=64M"


def test_use_once_the_default_pools_exist_without_a_device_set_names_it():
    out = _run("""
del os.environ["MEMPOOL_DEVICE"]
mempool.default_pool_stats()   # makes the default pools, library's choice
try:
    mempool.torch.use(device="host")
except RuntimeError as e:
    print("refused:", e)
print(len(installed), "MEMPOOL_DEVICE" in os.environ)
""")
    assert "the library's choice ($MEMPOOL_DEVICE unset)" in out[0], out
    assert out[1] == "0 False"


def test_any_integer_is_a_device_and_a_bool_or_a_non_integer_is_refused():
    # numpy.int64(0) was TypeError in use() and ValueError in
    # set_memory_fraction(): only an exact int was taken.
    out = _run("""
mempool.torch.use(device=Index(3))
print(os.environ["MEMPOOL_DEVICE"], len(installed))
os.environ["MEMPOOL_DEVICE"] = "host:capacity=64M"
for bad in (Index(-1), Index(2**31), True, 0.0):
    try:
        mempool.torch.use(device=bad)
    except ValueError as e:
        print("ValueError", "device" in str(e), os.environ["MEMPOOL_DEVICE"])
try:
    mempool.torch.use(device=[0])
except TypeError as e:
    print("TypeError", "device" in str(e))
print(len(installed))
# The host backend serves device 0: 16M of 64M; a refused device leaves it.
mempool.torch.set_memory_fraction(0.25, Index(0))
print(lib.mp_torch_malloc(32 << 20, 0, None) is None)
for bad in (Index(-1), False, 0.0, "0", None.__class__):
    try:
        mempool.torch.set_memory_fraction(1, bad)
    except ValueError as e:
        print("ValueError", "device" in str(e))
print(lib.mp_torch_malloc(32 << 20, 0, None) is None)  # still capped
""")
    assert out[0] == "cuda:3 1"
    assert out[1:5] == ["ValueError True host:capacity=64M"] * 4, out
    assert out[5] == "TypeError True"
    assert out[6] == "1"
    assert out[7] == "True"
    assert out[8:13] == ["ValueError True"] * 5, out
    assert out[13] == "True"


def test_a_spec_of_no_device_is_refused_before_anything_is_installed():
    # A spec naming no device ("bogus", "" or "cuda:") was set as
    # $MEMPOOL_DEVICE and the allocator installed: the mistake surfaced
    # only at PyTorch's first allocation, as an out-of-memory error, and
    # the default pools stayed unusable for the process. A NUL byte was
    # os.environ's "embedded null byte", naming no device.
    out = _run("""
for bad in ("bogus", "", "cuda:", "gpu:0", "hostx", "cuda:0\\0", "\\udcff"):
    try:
        mempool.torch.use(device=bad)
    except mempool.InvalidArgument as e:
        print("refused", "device" in str(e), os.environ["MEMPOOL_DEVICE"])
print(len(installed))
mempool.torch.use(device="host:capacity=32M")   # good ones still work
print(len(installed), capacity())
""")
    assert out[:7] == ["refused True host:capacity=64M"] * 7, out
    assert out[7] == "0"
    assert out[8] == "1 32"


def test_another_spelling_of_the_default_pools_device_is_that_device():
    # Host options were compared as written: "capacity=67108864" or
    # "capacity=65536K" was "another device" than "capacity=64M", and
    # use() refused the device the pools were made on.
    out = _run("""
mempool.default_pool_stats()   # makes the default pools, on 64M
for same in ("host:capacity=67108864", "host:capacity=65536K",
             "host:vmm=1,capacity=64M,latency_us=0"):
    mempool.torch.use(device=same)
    print(len(installed), capacity())
""" + _USE_128)
    assert out[:3] == ["1 64", "2 64", "3 64"], out
    assert out[3].startswith("refused:"), out  # 128M is another device


def test_host_options_the_library_refuses_are_refused_before_anything_is_installed():
    # Only the device's name and a CUDA index were checked: a host spec
    # with a bad option was set as $MEMPOOL_DEVICE and the allocator
    # installed, and the default pools failed at the first allocation.
    out = _run("""
for bad in ("host:capacity=oops", "host:capacity=0", "host:nokey=1",
            "host:vmm=2", "host:capacity=1G,capacity=2G", "host:,"):
    try:
        mempool.torch.use(device=bad)
    except mempool.InvalidArgument as e:
        print("refused", "device spec" in str(e), os.environ["MEMPOOL_DEVICE"])
print(len(installed))
""")
    assert out[:6] == ["refused True host:capacity=64M"] * 6, out
    assert out[6] == "0"


def test_empty_cache_before_the_default_pools_exist_leaves_their_device_open():
    # empty_cache() made no pool (the library makes none to trim), but the
    # package recorded the pools as made, on $MEMPOOL_DEVICE as it was, and
    # refused use() of another device that could still take effect.
    out = _run("""
mempool.torch.empty_cache()
print(lib.mp_default_pool_made())
""" + _USE_128)
    assert out[0] == "0", out
    assert out[1:3] == ["taken", "1 host:capacity=128M 128"], out


def test_use_of_another_device_once_c_code_made_the_default_pools_is_refused():
    # mp_malloc (or the preload shim) made the default pools before the
    # package was asked: the package has no record of them, and use() set
    # the new device and installed the allocator, to no effect.
    out = _run("""
lib.mp_malloc.argtypes = [ctypes.POINTER(V), ctypes.c_size_t]
lib.mp_free.argtypes = [V]
p = V()
assert lib.mp_malloc(ctypes.byref(p), 4096) == 0
assert lib.mp_free(p) == 0
""" + _USE_128 + """mempool.torch.use(device="host:capacity=64M")   # theirs: nothing to change
print(len(installed))
""")
    assert out[0].startswith("refused:"), out
    assert "by C code of this process" in out[0], out
    assert out[1] == "0 host:capacity=64M 64"
    assert out[2] == "1"


def _fraction_calls(monkeypatch):
    """The stand-in torch in sys.modules and the (fraction, device) pairs
    set_memory_fraction hands the library, recorded instead of set."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_stand_in
    for name, mod in torch_stand_in.modules(lambda alloc: None).items():
        monkeypatch.setitem(sys.modules, name, mod)
    calls = []
    monkeypatch.setattr(mempool._lib.lib(), "mp_torch_memory_fraction_ex",
                        lambda *a: calls.append(a) or 0)
    return torch_stand_in, calls


def test_set_memory_fraction_takes_a_device_as_pytorchs_call_does(monkeypatch):
    # torch.cuda.set_per_process_memory_fraction(f, device) takes None, an
    # int, "cuda:N" and a torch.device (torch.cuda._utils._get_device_index);
    # here "cuda:1" and torch.device("cuda:1") were ValueError ("not a
    # device number"), so code written for PyTorch's call failed.
    import mempool.torch
    torch, calls = _fraction_calls(monkeypatch)
    for dev in (1, "cuda:1", torch.device("cuda:1"), torch.device("cuda", 1),
                torch.cuda_device(1)):
        mempool.torch.set_memory_fraction(0.5, dev)
    mempool.torch.set_memory_fraction(0.5, "cuda:0")
    mempool.torch.set_memory_fraction(0.5, "cuda:10")
    mempool.torch.set_memory_fraction(0.5, None)  # torch's current device
    assert calls == [(0.5, 1)] * 5 + [(0.5, 0), (0.5, 10), (0.5, 2)]


def test_set_memory_fraction_refuses_a_device_pytorch_refuses_and_sets_nothing(monkeypatch):
    # As PyTorch's call: a device with no index ("cuda"), another type of
    # device ("cpu"), a string torch.device does not parse (its grammar is
    # type[:index], the index without leading zeros) and a value of
    # another type are ValueError, naming the device; nothing is set.
    import mempool.torch
    torch, calls = _fraction_calls(monkeypatch)
    for bad in ("cuda", "cuda:", "cpu", "cpu:0", "host", "cuda:-1", "cuda:01",
                " cuda:1", "cuda:1 ", "cuda:1x", "cuda:\u0661", "cuda:%d" % 2**31,
                torch.device("cuda"), torch.device("cpu"), torch.device("meta", 0),
                torch.device("cuda", -1), torch.device("cuda", 2**31),
                torch.cuda_device(-1), b"cuda:1", [1], 1.0, True):
        with pytest.raises(ValueError, match="device") as e:
            mempool.torch.set_memory_fraction(0.5, bad)
        assert "set_memory_fraction" in str(e.value), e.value
    assert calls == []


def test_a_cuda_index_the_library_cannot_open_is_refused_before_anything_is_installed():
    # "cuda:" then anything but a device index the library opens (decimal,
    # at most 1024: src/device/cuda.c) passed the check of the device's
    # name, was set as $MEMPOOL_DEVICE and the allocator installed; the
    # mistake surfaced at PyTorch's first allocation, the default pools
    # unusable for the process. An integer past 1024 was set as "cuda:N".
    out = _run("""
for bad in ("cuda:abc", "cuda:-1", "cuda:1x", "cuda: 1", "cuda:+1", "cuda:1025",
            "cuda:\\u0661", "cuda:" + "9" * 5000, 1025, 2**31 - 1):
    try:
        mempool.torch.use(device=bad)
    except ValueError as e:
        print("refused", "device" in str(e), os.environ["MEMPOOL_DEVICE"])
print(len(installed))
mempool.torch.use(device="cuda:01024")  # the last one the library opens
mempool.torch.use(device=1024)
print(len(installed), os.environ["MEMPOOL_DEVICE"])
""")
    assert out[:10] == ["refused True host:capacity=64M"] * 10, out
    assert out[10] == "0"
    assert out[11] == "2 cuda:1024"


def test_use_takes_a_torch_device_as_set_memory_fraction_does():
    # set_memory_fraction took torch.device("cuda", N) and a
    # torch.cuda.device; use() raised TypeError ("must be an int or a
    # str") for them. A device with no CUDA index is refused as there.
    out = _run("""
torch = sys.modules["torch"]
for dev in (torch.device("cuda", 3), torch.device("cuda:1"), torch.cuda.device(2)):
    mempool.torch.use(device=dev)
    print(os.environ["MEMPOOL_DEVICE"])
os.environ["MEMPOOL_DEVICE"] = "host:capacity=64M"
for bad in (torch.device("cuda"), torch.device("cpu"), torch.device("cuda", -1),
            torch.device("cuda", 1025)):
    try:
        mempool.torch.use(device=bad)
    except ValueError as e:
        print("ValueError", "mempool.torch.use" in str(e), os.environ["MEMPOOL_DEVICE"])
print(len(installed))
""")
    assert out[:3] == ["cuda:3", "cuda:1", "cuda:2"], out
    assert out[3:7] == ["ValueError True host:capacity=64M"] * 4, out
    assert out[7] == "3"


def test_use_that_pytorch_refuses_leaves_the_default_pools_to_a_forked_child():
    # use() recorded the default pools as this process's before PyTorch
    # took the allocator: after a refusal (PyTorch had allocated already)
    # a child forked from here, which has pools of its own to make, was
    # refused them as the parent's.
    out = _run("""
def refuse(alloc):
    raise RuntimeError("Can't swap an already initialized allocator")
sys.modules["torch.cuda.memory"].change_current_allocator = refuse
try:
    mempool.torch.use(device="host:capacity=128M")
except RuntimeError as e:
    print("refused", "already initialized" in str(e), os.environ["MEMPOOL_DEVICE"])
def child():
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            mempool.default_pool_stats()
            print("child served", capacity())
        except mempool.InvalidArgument as e:
            print("child refused", "forked" in str(e))
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
child()
# Taken: PyTorch's allocations come from them, the parent's from here.
sys.modules["torch.cuda.memory"].change_current_allocator = installed.append
mempool.torch.use()
child()
""")
    assert out[0] == "refused True host:capacity=64M", out
    assert out[1] == "child served 64", out
    assert out[2] == "child refused True", out


def test_set_memory_fraction_of_the_current_device_says_when_torch_cannot_tell_it(monkeypatch):
    # Device None is PyTorch's current device. A torch with no
    # torch.cuda.is_available raised AttributeError, and one whose
    # current_device() failed (CUDA's initialisation) its bare error,
    # neither naming the call or the device; nothing is set either way.
    import mempool.torch
    torch, calls = _fraction_calls(monkeypatch)
    cuda = sys.modules["torch.cuda"]

    def failing():
        raise RuntimeError("CUDA error: initialization error")
    monkeypatch.setattr(cuda, "current_device", failing)
    with pytest.raises(RuntimeError, match="set_memory_fraction: device None") as e:
        mempool.torch.set_memory_fraction(0.5)
    assert "initialization error" in str(e.value)
    monkeypatch.delattr(cuda, "is_available")
    with pytest.raises(RuntimeError, match="set_memory_fraction: device None") as e:
        mempool.torch.set_memory_fraction(0.5, None)
    assert "is_available" in str(e.value)
    assert calls == []
    # Without CUDA: device 0, the host backend's.
    monkeypatch.setattr(cuda, "is_available", lambda: False, raising=False)
    mempool.torch.set_memory_fraction(0.5)
    assert calls == [(0.5, 0)]


def test_use_of_the_default_pools_device_in_another_spelling_is_taken(monkeypatch):
    # Specs were compared as text: once the default pools existed on
    # "cuda", use("cuda:0") (or use(0)) was refused as another device.
    import mempool.torch
    installed = []
    for name, mod in torch_stand_in.modules(installed.append).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(mempool, "_default_pid", None)
    monkeypatch.setenv("MEMPOOL_DEVICE", "cuda")
    monkeypatch.setattr(mempool, "_default_device", "cuda")  # made on it
    for same in ("cuda:0", 0, "cuda:000", torch_stand_in.device("cuda", 0), "cuda"):
        mempool.torch.use(device=same)
    assert len(installed) == 5
    for other in ("cuda:1", 1, "host"):
        with pytest.raises(RuntimeError, match="cannot take effect"):
            mempool.torch.use(device=other)
    monkeypatch.setattr(mempool, "_default_device", "cuda:01")
    mempool.torch.use(device="cuda:1")
    monkeypatch.setattr(mempool, "_default_device", "host")
    mempool.torch.use(device="host:")
    assert len(installed) == 7


def test_record_stream_before_the_default_pools_exist_leaves_their_device_open():
    # record_stream() of memory mempool did not allocate (a tensor PyTorch
    # allocated before use()) made no pool (mp_torch_base_alloc makes none
    # to look a pointer up), but the package recorded the pools as made, on
    # $MEMPOOL_DEVICE as it was, and refused use() of another device.
    out = _run("""
buf = ctypes.create_string_buffer(64)
class Tensor:
    def data_ptr(self): return ctypes.addressof(buf)
class Stream:
    cuda_stream = None
mempool.torch.record_stream(Tensor(), Stream())
print(lib.mp_default_pool_made())
""" + _USE_128)
    assert out[0] == "0", out
    assert out[1:3] == ["taken", "1 host:capacity=128M 128"], out
