"""Routing PyTorch's CUDA allocations through mempool.

    import mempool.torch
    mempool.torch.use()          # before the first CUDA tensor

installs torch.cuda.memory.CUDAPluggableAllocator(libmempool.so,
"mp_torch_malloc", "mp_torch_free") (include/mempool/torch.h). The tensors
then come from mempool's default pool of their device;
mempool.default_pool_stats() reads the current device's. PyTorch accepts
a new allocator only before it has allocated anything.

From Python, PyTorch lets an allocator set only malloc and free; the other
hooks of CUDAPluggableAllocator are C++ setters (include/mempool/
torch_hooks.hpp installs them all from C++). So here:
  - torch.cuda.graph works as it is: an allocation on a stream the device
    reports capturing comes from a graph pool of that capture (addresses
    kept for replays, reused by nobody else); empty_cache() below releases
    the pools of graphs that are destroyed (never those of a graph that may
    still be replayed);
  - empty_cache() and set_memory_fraction() are this module's (PyTorch's
    own calls do not reach a pluggable allocator's pool from Python);
  - record_stream(tensor, stream) stands for tensor.record_stream(stream),
    which PyTorch drops for a pluggable allocator set from Python."""
import ctypes
import numbers
import operator
import os
import re
import sys

from . import _lib


class TorchUnavailable(ImportError):
    """PyTorch (with CUDA) is needed and missing."""


_INT_MAX = 2**31 - 1  # the C hooks take the device as an int


def _device_number(device, call):
    """device as a CUDA device number a C int holds: any integer (numpy's
    int64 too) is taken through __index__, as Python's own index arguments
    are; a bool, a float or another object: ValueError (ctypes would wrap
    2**32 to device 0)."""
    if not isinstance(device, bool) and hasattr(type(device), "__index__"):
        number = operator.index(device)
        if 0 <= number <= _INT_MAX:
            return number
    from . import _shown
    raise ValueError("%s: device %s is not a device number (an integer from 0 to %d)"
                     % (call, _shown(device), _INT_MAX))


# torch.device's grammar (c10/core/Device.cpp: type[:index], the index
# without leading zeros), of type cuda with an index.
_CUDA_INDEX = re.compile(r"cuda:(0|[1-9][0-9]*)")


def _torch_device_types():
    """(torch.device, torch.cuda.device), each None where torch is not
    imported or lacks it (a torch.device exists only once it is)."""
    torch = sys.modules.get("torch")
    tdev = getattr(torch, "device", None)
    cdev = getattr(getattr(torch, "cuda", None), "device", None)
    return (tdev if isinstance(tdev, type) else None,
            cdev if isinstance(cdev, type) else None)


def _fraction_device(device, call):
    """device as torch.cuda.set_per_process_memory_fraction takes it
    (torch.cuda._utils._get_device_index, no index optional), as a C int:
    None (PyTorch's current device), an integer (__index__, a bool
    excepted), "cuda:N", a torch.device of type cuda with an index, a
    torch.cuda.device. Anything else, or an index outside a C int:
    ValueError, as PyTorch's call raises."""
    if device is None:
        device = _current_device(call)
    number = None
    tdev, cdev = _torch_device_types()
    if isinstance(device, str):
        m = _CUDA_INDEX.fullmatch(device)
        number = int(m.group(1)) if m else None
    elif tdev is not None and isinstance(device, tdev):
        if device.type == "cuda" and device.index is not None:
            number = operator.index(device.index)
    elif cdev is not None and isinstance(device, cdev):
        number = operator.index(device.idx)
    elif not isinstance(device, bool) and hasattr(type(device), "__index__"):
        number = operator.index(device)
    if number is not None and 0 <= number <= _INT_MAX:
        return number
    from . import _shown
    raise ValueError("%s: device %s is not a CUDA device with an index: an integer "
                     "from 0 to %d, 'cuda:N', torch.device('cuda', N) or "
                     "torch.cuda.device(N) (as torch.cuda.set_per_process_memory_fraction "
                     "takes)" % (call, _shown(device), _INT_MAX))


_SPEC_MAX = 256  # MP_DEVICE_SPEC_MAX (include/mempool/device.h)


def _canonical(spec, call):
    """spec as the library reads it, in canonical form
    (mp_device_spec_canonical: "cuda" and "cuda:00" are "cuda:0", "host:"
    and "host:capacity=16G" are "host", "host:capacity=64M" is
    "host:capacity=67108864"); InvalidArgument, with the library's message
    naming the bad part, for a spec mp_device_open would refuse."""
    from . import _check, _cstr
    raw = _cstr(spec, "device spec", call)  # a NUL byte, a lone surrogate
    buf = ctypes.create_string_buffer(_SPEC_MAX)
    _check(_lib.lib().mp_device_spec_canonical(raw, buf, _SPEC_MAX), call)
    return buf.value.decode()


def _spec_opens(spec):
    """spec as the device it opens (its canonical form), so that two
    spellings of one compare equal. None (the library's choice) and a spec
    opening nothing: as they are."""
    if spec is None:
        return None
    try:
        return _canonical(spec, "mempool.torch.use")
    except (ValueError, TypeError):
        return spec


def _spec_checked(spec, call):
    """spec, a device spec, if the library would open it as written (its
    device, a CUDA index it opens, host options it takes): else
    InvalidArgument, before it is set anywhere (the default pools read it
    only at the first allocation, and keep its failure)."""
    _canonical(spec, call)
    return spec


def use(device=None):
    """Installs mempool as PyTorch's CUDA allocator; returns the allocator.

    device: the device spec of the default pool ("cuda:1", "host", or an
    integer N, numpy's included, torch.device("cuda", N) or
    torch.cuda.device(N), for "cuda:N"); None keeps $MEMPOOL_DEVICE or the
    library's choice. It is set as $MEMPOOL_DEVICE, which the default
    pool reads when it is made (on the first allocation). A negative
    number, one past a C int, a bool, a float or a torch.device that is
    not CUDA's or has no index: ValueError (as set_memory_fraction); a str that
    names no device ("", "gpu:0", "cuda:", one with a NUL byte) or a CUDA
    index the library cannot open ("cuda:abc", past "cuda:1024", an
    integer past 1024 too) or host options the library refuses
    ("host:capacity=oops"): InvalidArgument (a ValueError); another type
    than those: TypeError; either way nothing is set or installed.

    The default pools are made once per process and live until it exits:
    once this package has made them (default_pool_stats(), empty_cache(),
    set_memory_fraction(), record_stream()), or C code of the process has
    (mp_malloc, the preload shim: mp_default_pool_made()), a device other
    than the one they were made on cannot take effect, and use() raises
    RuntimeError, naming both, with nothing set or installed (call use()
    first). Specs are compared as the device they open, in the library's
    canonical form (mp_device_spec_canonical: "cuda", "cuda:0", "cuda:00"
    and 0 are one; "host:" and "host:capacity=16G" are "host";
    "host:capacity=64M" and "host:capacity=67108864" are one).
    If PyTorch refuses the allocator (it has allocated already), its error is raised
    and nothing changes: $MEMPOOL_DEVICE is left as it was, and the default
    pools are not recorded as this process's (a child forked later may
    still make its own)."""
    if isinstance(device, tuple(filter(None, _torch_device_types()))):
        # PyTorch's devices, read as set_memory_fraction reads them.
        device = _fraction_device(device, "mempool.torch.use")
    if isinstance(device, (float, bool)) or \
            (not isinstance(device, str) and hasattr(type(device), "__index__")):
        device = _device_number(device, "mempool.torch.use")
        _spec_checked("cuda:%d" % device, "mempool.torch.use")
    elif isinstance(device, str):
        _spec_checked(device, "mempool.torch.use")
    elif device is not None:
        raise TypeError("mempool.torch.use: device must be an int, a str or a CUDA "
                        "torch.device, not %s"
                        % type(device).__name__)
    try:
        import torch
        from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator
    except ImportError as e:
        raise TorchUnavailable(
            "mempool.torch.use() needs PyTorch with CUDA (import torch failed: %s); "
            "without torch, use mempool.Pool directly" % e) from e
    from . import _NOT_MADE, _default_device as made, _default_pools
    spec = device if not isinstance(device, int) else "cuda:%d" % device
    by = ""
    if made is _NOT_MADE and _lib.lib().mp_default_pool_made():
        # Made by C code of this process (mp_malloc, the preload shim),
        # which read $MEMPOOL_DEVICE as it was then: as it is now, unless
        # the program changed it since.
        made = os.environ.get("MEMPOOL_DEVICE")
        by = " by C code of this process (mp_malloc, the preload shim)"
    # Compared as the devices they open ("cuda" is "cuda:0").
    if spec is not None and made is not _NOT_MADE and _spec_opens(spec) != _spec_opens(made):
        raise RuntimeError(
            "mempool.torch.use: device %r cannot take effect: the default pools "
            "were made already%s, on %s, and live until the process exits (the "
            "device is read once, when the first is made); call use() before "
            "anything allocates from them"
            % (spec, by, "$MEMPOOL_DEVICE=%r" % made if made is not None
               else "the library's choice ($MEMPOOL_DEVICE unset)"))
    # Refused here in a child forked from a process that used them.
    _default_pools("mempool.torch.use", make=False, mark=False)
    before = os.environ.get("MEMPOOL_DEVICE")
    if spec is not None:
        os.environ["MEMPOOL_DEVICE"] = spec
    del torch
    try:
        alloc = CUDAPluggableAllocator(_lib.library_path(), "mp_torch_malloc", "mp_torch_free")
        change_current_allocator(alloc)
    except BaseException:
        # Not installed: the device the caller had stays theirs.
        if before is None:
            os.environ.pop("MEMPOOL_DEVICE", None)
        else:
            os.environ["MEMPOOL_DEVICE"] = before
        raise
    # PyTorch allocates from them from here: a child forked from now on
    # is refused them (not before: a refused use() changes nothing).
    _default_pools("mempool.torch.use", make=False)
    return alloc


def empty_cache():
    """torch.cuda.empty_cache() for mempool: every default pool gives its
    idle memory back to the device, and graph pools of captured graphs that
    are destroyed, with every executable made from them, are released
    (mp_torch_reset). Before anything made the default pools it makes
    none, and they are not recorded as made: use() may still pick their
    device."""
    from . import _default_pools
    lib = _default_pools("mp_torch_reset", mark=False)  # a forked child's
    lib.mp_torch_reset()
    if lib.mp_default_pool_made():
        _default_pools("mp_torch_reset")


def _current_device(call):
    """torch.cuda.current_device(), as PyTorch's calls read device None; 0
    without torch or CUDA (the host backend's one device). A torch that
    cannot tell it (no torch.cuda.is_available or current_device, either
    raising, CUDA failing to initialise): RuntimeError naming the call and
    the reason, where PyTorch's own call would fail too."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    except Exception as e:
        raise RuntimeError("%s: device None is PyTorch's current device, which "
                           "torch.cuda could not tell (%s: %s); pass the device"
                           % (call, type(e).__name__, e)) from e


def set_memory_fraction(fraction, device=None):
    """torch.cuda.set_per_process_memory_fraction() for mempool: caps the
    default pool of device at fraction of its memory (1: the whole
    device). 0 allows nothing, as in PyTorch, and so does a fraction whose
    share is under the pool's alignment (no block fits): until a larger
    fraction is set, every allocation PyTorch asks on device fails (cached
    blocks included), while the pool's own cap stays as it was.
    device: what PyTorch's call takes: an integer (numpy's included),
    "cuda:N", torch.device("cuda", N) or a torch.cuda.device; None is
    PyTorch's current device (device 0 where torch cannot be imported or
    has no CUDA; RuntimeError, nothing set, where torch cannot tell it).
    A fraction outside [0, 1] (NaN included) or a device that is none of
    those, or whose index is not from 0 to 2**31 - 1 (a C int; a bool is no
    integer here), "cuda" and torch.device("cuda") without an index or
    "cpu" included: ValueError, as PyTorch's call raises (ctypes would wrap
    2**32 to device 0). A refusal of the library's (a
    device the default pools do not serve, a paused pool for a fraction
    that allows some memory): MempoolError, the cap as it was. A fraction that is no real number (a
    str, a bool, None): TypeError, as PyTorch's call raises."""
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError("set_memory_fraction: fraction must be a real number, not %s"
                        % type(fraction).__name__)
    try:
        number = float(fraction)
    except OverflowError:  # an int past a double's range: out of [0, 1]
        number = float("inf")
    if not 0.0 <= number <= 1.0:
        from . import _shown
        raise ValueError("set_memory_fraction: fraction %s is not in [0, 1]"
                         % _shown(fraction))
    fraction = number
    device = _fraction_device(device, "set_memory_fraction")
    from . import _check, _default_pools
    # Named as the caller's call; the library's message names its own.
    L = _default_pools("set_memory_fraction")
    _check(L.mp_torch_memory_fraction_ex(fraction, device), "set_memory_fraction")


def _storage_ptr(tensor):
    """The start of the memory block holding tensor: its storage's pointer,
    as Tensor.record_stream records (a view's data_ptr() lies inside)."""
    st = getattr(tensor, "untyped_storage", None) or getattr(tensor, "storage", None)
    return st().data_ptr() if st is not None else tensor.data_ptr()


def _held(ptr):
    """Whether a default pool of mempool's holds the block at ptr. Before
    anything made the default pools none holds it: the library makes none
    to say so, and they are not recorded as made (use() may still pick
    their device), as for empty_cache(). The check's failure for memory
    no pool holds is the answer, not the caller's error: the thread's last
    error stays as it was (status.h: a call that succeeds does not replace
    it), as record_stream then returns normally."""
    import ctypes
    size = ctypes.c_size_t(0)
    from . import _default_pools, _keeping_last_error
    lib = _default_pools("mp_torch_base_alloc", mark=False)  # a forked child's
    if not lib.mp_default_pool_made():
        return False
    lib = _default_pools("mp_torch_base_alloc")
    with _keeping_last_error():
        lib.mp_torch_base_alloc(ptr, ctypes.byref(size))
    return size.value != 0


def record_stream(tensor, stream):
    """tensor.record_stream(stream) for mempool: the tensor's block is
    reused elsewhere only after the work queued on stream has completed.
    A view records its whole block, as PyTorch's does; as PyTorch's, an
    empty tensor and memory mempool did not allocate record nothing. A
    refusal (a stream of another device, a destroyed one): MempoolError."""
    from . import _check, _ptr_or_none, _word
    call = "mp_torch_record_stream"
    # As Tensor.record_stream, an argument of the wrong kind is TypeError
    # (it was AttributeError, from reading what it does not have).
    if not hasattr(stream, "cuda_stream"):
        raise TypeError("%s: stream must be a torch.cuda.Stream (an object "
                        "with cuda_stream), not %s" % (call, type(stream).__name__))
    if not hasattr(tensor, "data_ptr"):
        raise TypeError("%s: tensor must be a torch.Tensor (an object with "
                        "data_ptr), not %s" % (call, type(tensor).__name__))
    # Both as C words: ctypes wraps an int past 2**64 (or a negative one)
    # silently, and 2**64 + p recorded the block at p.
    ptr = _word(_storage_ptr(tensor), "ptr", call)
    handle = _ptr_or_none(stream.cuda_stream, call, "stream")
    if not ptr or not _held(ptr):
        return
    _check(_lib.lib().mp_torch_record_stream_ex(ptr, handle), call)
