"""mempool.torch without PyTorch: a clear error, nothing installed."""
import importlib.util
import os

import pytest

import mempool
import mempool.torch
import torch_stand_in


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed (tests/preload/gpu/torch_smoke.py covers it)")
def test_use_without_torch_says_what_is_missing():
    before = os.environ.get("MEMPOOL_DEVICE")
    with pytest.raises(mempool.torch.TorchUnavailable) as e:
        mempool.torch.use(device=1)
    assert "needs PyTorch" in str(e.value)
    assert isinstance(e.value, ImportError)
    assert os.environ.get("MEMPOOL_DEVICE") == before  # nothing changed


def _run(code, conf=None):
    import subprocess
    import sys
    env = dict(os.environ, MEMPOOL_DEVICE="host:capacity=1G",
               MEMPOOL_LIBRARY=mempool.library_path())
    env.pop("MEMPOOL_CONF", None)
    if conf is not None:
        env["MEMPOOL_CONF"] = conf
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=pkg,
                          capture_output=True, text=True)


_MALLOC = """
import ctypes, mempool, mempool.torch
lib = ctypes.CDLL(mempool.library_path())
lib.mp_torch_malloc.restype = ctypes.c_void_p
lib.mp_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.mp_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
"""


def test_torch_submodule_is_reachable_after_a_plain_import():
    # `import mempool` then mempool.torch.use(), as users write it: the
    # submodule comes on first use; other missing names stay AttributeError.
    r = _run("import sys, mempool\n"
             "assert 'mempool.torch' not in sys.modules\n"
             "t = mempool.torch\n"
             "assert t is sys.modules['mempool.torch'] and callable(t.use)\n"
             "try:\n"
             "    mempool.no_such_name\n"
             "except AttributeError as e:\n"
             "    assert 'no_such_name' in str(e)\n"
             "else:\n"
             "    raise SystemExit('no AttributeError')\n"
             "print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_empty_cache_gives_the_default_pools_idle_memory_back():
    r = _run(_MALLOC + """
p = lib.mp_torch_malloc(8 << 20, 0, None)
lib.mp_torch_free(p, 8 << 20, 0, None)
before = mempool.default_pool_stats()["reserved_bytes.all.current"]
mempool.torch.empty_cache()
print(before, mempool.default_pool_stats()["reserved_bytes.all.current"])
""")
    assert r.returncode == 0, r.stderr
    before, after = map(int, r.stdout.split())
    assert before >= 8 << 20 and after == 0


# With per-thread arenas too: the fraction was refused there (and the C
# hook ignores a refusal), so the cap silently did nothing. With
# arenas_auto=1 the pool runs solo on its first arena, which takes the whole
# cap.
@pytest.mark.parametrize("conf", [None, "arenas=2", "arenas=2,arenas_auto=1"])
def test_set_memory_fraction_caps_the_default_pool(conf):
    r = _run(_MALLOC + """
mempool.torch.set_memory_fraction(16 / 1024, 0)   # 16 MiB of 1 GiB
capped = lib.mp_torch_malloc(32 << 20, 0, None)
mempool.torch.set_memory_fraction(1, 0)
lifted = lib.mp_torch_malloc(32 << 20, 0, None)
print(capped is None, lifted is not None)
""", conf)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("conf", [None, "arenas=2"])
def test_set_memory_fraction_zero_allows_nothing_as_pytorchs(conf):
    # torch.cuda.set_per_process_memory_fraction(0) lets PyTorch's own
    # allocator take 0 bytes; here 0 had lifted the cap (the pool's C
    # meaning of a fraction 0), so a program meaning "nothing more" got the
    # whole device.
    # A fraction whose share is under one block (1e-15 of 1 GiB: a byte)
    # is taken by PyTorch and allows nothing; the library's refusal of such
    # a cap raised InvalidArgument here (and the C++ hook dropped it,
    # leaving the pool uncapped).
    r = _run(_MALLOC + """
for f in (0, 1e-15):
    mempool.torch.set_memory_fraction(f, 0)
    print(lib.mp_torch_malloc(1 << 20, 0, None) is None)
    mempool.torch.set_memory_fraction(0.5, 0)
    print(lib.mp_torch_malloc(1 << 20, 0, None) is not None)
""", conf)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"] * 4, r.stdout


def test_use_with_a_bad_device_raises_and_installs_nothing(monkeypatch):
    # use() set $MEMPOOL_DEVICE to "cuda:-1" (or "cuda:1" for True) and
    # installed the allocator: the mistake surfaced only at the first
    # allocation, as an out-of-memory error inside PyTorch. A stand-in
    # torch records what use() would have installed.
    import sys
    installed = []
    for name, mod in torch_stand_in.modules(installed.append).items():
        monkeypatch.setitem(sys.modules, name, mod)
    # As in a process whose default pools are not made yet (this one's may
    # be, by other tests): use() refuses a device there.
    monkeypatch.setattr(mempool, "_default_device", mempool._NOT_MADE)
    monkeypatch.delenv("MEMPOOL_DEVICE", raising=False)  # restored after
    # 2**32 was set as "cuda:4294967296", a device no C int can name.
    for bad in (-1, True, False, 1.0, 2**31, 2**32):
        with pytest.raises(ValueError, match="device"):
            mempool.torch.use(device=bad)
        assert "MEMPOOL_DEVICE" not in os.environ
        assert installed == []
    mempool.torch.use(device=1)  # a good one still works
    assert os.environ["MEMPOOL_DEVICE"] == "cuda:1" and len(installed) == 1


def test_use_that_pytorch_refuses_leaves_mempool_device_as_it_was(monkeypatch):
    # PyTorch refuses a new allocator once it has allocated ("Can't swap an
    # already initialized allocator"); use() had set $MEMPOOL_DEVICE before
    # asking, so the refused call still changed the device that later
    # default pools, mempool.Device(None) and child processes take. A
    # device of another type (a list, a dict) was set as its str().
    import sys

    def refuse(alloc):
        raise RuntimeError("Can't swap an already initialized allocator")
    for name, mod in torch_stand_in.modules(refuse).items():
        monkeypatch.setitem(sys.modules, name, mod)
    # As in a process whose default pools are not made yet (this one's may
    # be, by other tests): use() refuses a device there.
    monkeypatch.setattr(mempool, "_default_device", mempool._NOT_MADE)
    monkeypatch.setenv("MEMPOOL_DEVICE", "host")
    for dev in (1, "cuda:0"):
        with pytest.raises(RuntimeError, match="already initialized"):
            mempool.torch.use(device=dev)
        assert os.environ["MEMPOOL_DEVICE"] == "host"
    monkeypatch.delenv("MEMPOOL_DEVICE")
    with pytest.raises(RuntimeError):
        mempool.torch.use(device=0)
    assert "MEMPOOL_DEVICE" not in os.environ
    for bad in ([1], {"cuda": 1}, b"cuda:0"):
        with pytest.raises(TypeError, match="device"):
            mempool.torch.use(device=bad)
        assert "MEMPOOL_DEVICE" not in os.environ


def test_set_memory_fraction_raises_what_the_library_refuses():
    # The C hook returns nothing: a device the default pools do not serve
    # (the host backend serves device 0) left every pool uncapped, silently.
    r = _run(_MALLOC + """
try:
    mempool.torch.set_memory_fraction(0.5, 1)
except mempool.MempoolError as e:
    print("raised", e.name)
else:
    print("no exception")
mempool.torch.set_memory_fraction(16 / 1024, 0)   # still works: 16 MiB
print(lib.mp_torch_malloc(32 << 20, 0, None) is None)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["raised", "MP_ENODEV", "True"], r.stdout


def test_a_refused_fraction_names_the_call_made_and_the_pools_reason():
    # The refusal of a paused default pool read "mp_torch_memory_fraction:
    # ... : mp_pool_set_max_fraction: the pool is paused": two calls the
    # program never made. It names set_memory_fraction, then what it asked
    # of the library, and keeps the pool's reason.
    r = _run(_MALLOC + """
V = ctypes.c_void_p
lib.mp_default_pool.restype = V
lib.mp_pool_pause.argtypes = [V, ctypes.c_int]
lib.mp_pool_resume.argtypes = [V]
p = lib.mp_torch_malloc(1 << 20, 0, None)
assert lib.mp_pool_pause(lib.mp_default_pool(), 0) == 0
try:
    mempool.torch.set_memory_fraction(0.5, 0)
except mempool.Busy as e:
    print(e)
assert lib.mp_pool_resume(lib.mp_default_pool()) == 0
lib.mp_torch_free(p, 1 << 20, 0, None)
""")
    assert r.returncode == 0, r.stderr
    msg = r.stdout.strip()
    assert msg.startswith("set_memory_fraction: "), msg
    assert ": mp_torch_memory_fraction: fraction 0.5 on device 0: " in msg, msg
    assert "(mp_pool_set_max_fraction: the pool is paused)" in msg, msg


_RECORD = _MALLOC + r"""
import threading
V = ctypes.c_void_p
lib.mp_default_pool.restype = V
lib.mp_pool_device.restype = V
lib.mp_pool_device.argtypes = [V]
lib.mp_stream_create.argtypes = [V, ctypes.POINTER(V)]
lib.mp_stream_synchronize.argtypes = [V, V]
HOSTFN = ctypes.CFUNCTYPE(None, V)
lib.mp_stream_launch_host.argtypes = [V, V, HOSTFN, V]
dev = lib.mp_pool_device(lib.mp_default_pool())
def stream():
    s = V()
    assert lib.mp_stream_create(dev, ctypes.byref(s)) == 0
    return s.value
a, b, c = stream(), stream(), stream()
gate = threading.Event()
hold = HOSTFN(lambda arg: gate.wait())
assert lib.mp_stream_launch_host(dev, b, hold, None) == 0   # b is busy
p = lib.mp_torch_malloc(1 << 20, 0, a)
class Storage:
    def data_ptr(self): return p
class Tensor:                  # a view x[16:] of a float tensor
    def data_ptr(self): return p + OFFSET
    def untyped_storage(self): return Storage()
class Stream:
    cuda_stream = b
mempool.torch.record_stream(Tensor(), Stream())   # used on b
lib.mp_torch_free(p, 1 << 20, 0, a)
q = lib.mp_torch_malloc(2 << 20, 0, c)
print("reused" if q == p else "held")
gate.set()
lib.mp_stream_synchronize(dev, b)
"""


@pytest.mark.parametrize("offset", [0, 64])
def test_record_stream_of_a_view_holds_its_whole_block(offset):
    # A view's data_ptr() lies inside the block: the library refused it,
    # the hook dropped the refusal, nothing was recorded, and another
    # stream got the block while b's work still used it. PyTorch's own
    # Tensor.record_stream records the storage's pointer.
    r = _run(_RECORD.replace("OFFSET", str(offset)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "held", "reused while b's work was queued"


def test_record_stream_skips_what_pytorch_skips_and_raises_a_bad_stream():
    # As Tensor.record_stream: an empty tensor (storage pointer 0) and
    # memory mempool did not allocate record nothing; a refusal of a real
    # block (a stream handle no device knows) raises.
    r = _run(_MALLOC + """
import ctypes
buf = ctypes.create_string_buffer(64)
p = lib.mp_torch_malloc(1 << 20, 0, None)
class Tensor:
    def __init__(self, ptr): self.ptr = ptr
    def data_ptr(self): return self.ptr
class Stream:
    cuda_stream = None
mempool.torch.record_stream(Tensor(0), Stream())
mempool.torch.record_stream(Tensor(ctypes.addressof(buf)), Stream())
print("skipped")
class Bad:
    cuda_stream = ctypes.addressof(buf)
try:
    mempool.torch.record_stream(Tensor(p), Bad())
except mempool.MempoolError as e:
    print("raised", e.name)
lib.mp_torch_free(p, 1 << 20, 0, None)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["skipped", "raised", "MP_EINVAL"], r.stdout


def test_record_stream_of_memory_mempool_did_not_allocate_keeps_last_error():
    # The check whether a pool holds the block (mp_torch_base_alloc) fails
    # for memory mempool did not allocate, and record_stream returns: a
    # call that succeeds does not replace the caller's last error
    # (status.h). It was the check's "is in no live block".
    r = _run(_MALLOC + """
import ctypes
lib.mp_last_error.restype = ctypes.c_char_p
buf = ctypes.create_string_buffer(64)
p = lib.mp_torch_malloc(1 << 20, 0, None)   # the default pool made
class Tensor:
    def __init__(self, ptr): self.ptr = ptr
    def data_ptr(self): return self.ptr
class Stream:
    cuda_stream = None
assert lib.mp_torch_malloc(-1, 0, None) is None   # the caller's failure
before = (lib.mp_last_status(), lib.mp_last_error())
mempool.torch.record_stream(Tensor(ctypes.addressof(buf)), Stream())
after = (lib.mp_last_status(), lib.mp_last_error())
print("kept" if after == before else "replaced: %r by %r" % (before, after))
lib.mp_torch_free(p, 1 << 20, 0, None)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "kept", r.stdout


def test_record_stream_refuses_a_pointer_or_stream_past_a_c_word():
    # ctypes wraps an int past 2**64 (or a negative one) into a pointer
    # silently: 2**64 + p recorded the block at p, on a stream b + 2**64
    # named b. Each is refused, as the package's other pointer arguments.
    r = _run(_MALLOC + """
V = ctypes.c_void_p
lib.mp_pool_device.restype = V
lib.mp_pool_device.argtypes = [V]
lib.mp_default_pool.restype = V
lib.mp_stream_create.argtypes = [V, ctypes.POINTER(V)]
p = lib.mp_torch_malloc(1 << 20, 0, None)
s = V()
assert lib.mp_stream_create(lib.mp_pool_device(lib.mp_default_pool()), ctypes.byref(s)) == 0
class Tensor:
    def __init__(self, ptr): self.ptr = ptr
    def data_ptr(self): return self.ptr
class Stream:
    def __init__(self, h): self.cuda_stream = h
for ptr, h in [(p + 2**64, s.value), (p - 2**64, s.value), (p, s.value + 2**64), (p, -1)]:
    try:
        mempool.torch.record_stream(Tensor(ptr), Stream(h))
        print("recorded")
    except mempool.InvalidArgument as e:
        # named as what it is (a bad stream was called "ptr")
        print("refused", "ptr" if " ptr " in str(e) else "stream" if " stream " in str(e) else "?")
lib.mp_torch_free(p, 1 << 20, 0, None)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "ptr"] * 2 + ["refused", "stream"] * 2, r.stdout
