"""mempool: a caching best-fit GPU memory pool, from Python (ctypes).

    import mempool
    dev = mempool.Device("host:capacity=1G")      # or "cuda:0", or None
    with mempool.Pool(dev, "max_bytes=512M") as pool:
        p = pool.alloc(1 << 20)                    # an address (int)
        pool.free(p)
        pool.stats()["reserved_bytes.all.peak"]

Errors raise MempoolError (or a subclass per status) carrying the C status,
its name, mp_status_string() and mp_last_error(). mempool.torch.use()
routes PyTorch's CUDA allocations through the library."""
import contextlib
import ctypes
import gc
import operator
import os
import tempfile
import threading
import warnings
import weakref

from . import _lib
from ._lib import LibraryNotFound, find_library, library_path
from ._stats import TORCH_KEYS, Stats, to_dict

__all__ = ["Device", "Pool", "Stream", "Stats", "MempoolError", "InvalidArgument",
           "OutOfMemory", "NotSupported", "Busy", "DeviceUnavailable",
           "DriverError", "Corrupt", "IOFailure", "LibraryNotFound", "find_library",
           "library_path", "default_pool_stats", "TORCH_KEYS",
           "preload_pause", "preload_resume", "PreloadNotFound"]
__version__ = "0.1.0"


class MempoolError(Exception):
    """A call into libmempool failed: .status (int), .name ("MP_EINVAL"),
    .message (mp_status_string) and .detail (mp_last_error)."""

    def __init__(self, status, name, message, detail, call):
        self.status, self.name, self.message, self.detail = status, name, message, detail
        self.call = call
        super().__init__("%s: %s (%s)%s" % (call, message, name,
                                            ": " + detail if detail else ""))

    def __reduce__(self):
        # pickle and copy rebuild an exception as cls(*self.args), and args
        # holds only the message: multiprocessing could not send one back.
        return (type(self), (self.status, self.name, self.message, self.detail,
                             self.call), self.__dict__)


class InvalidArgument(MempoolError, ValueError):
    """MP_EINVAL"""


class OutOfMemory(MempoolError, MemoryError):
    """MP_ENOMEM, or MP_ELIMIT (the pool's own cap)"""


class DeviceUnavailable(MempoolError):
    """MP_ENODEV"""


class DriverError(MempoolError):
    """MP_EDRIVER"""


class Busy(MempoolError):
    """MP_EBUSY"""


class NotSupported(MempoolError):
    """MP_ENOTSUP"""


class Corrupt(MempoolError):
    """MP_ECORRUPT"""


class IOFailure(MempoolError, OSError):
    """MP_EIO: a file the library was asked to write (snapshot, dump)
    could not be written; an OSError, as Python's own writes raise."""


# By name, so the numbering is never mirrored here: the library says which
# name each status number has.
_CLASSES = {"MP_EINVAL": InvalidArgument, "MP_ENOMEM": OutOfMemory,
            "MP_ELIMIT": OutOfMemory, "MP_ENODEV": DeviceUnavailable,
            "MP_EDRIVER": DriverError, "MP_EBUSY": Busy,
            "MP_ENOTSUP": NotSupported, "MP_ECORRUPT": Corrupt,
            "MP_EIO": IOFailure}


def _s(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _error(status, detail, call):
    """The exception for library status number status: its name and message
    from the library, the class from _CLASSES."""
    L = _lib.lib()
    name = _s(L.mp_status_name(status))
    return _CLASSES.get(name, MempoolError)(
        status, name, _s(L.mp_status_string(status)), detail, call)


def _check(status, call):
    if status != 0:
        raise _error(status, _s(_lib.lib().mp_last_error()), call)


def _destroy(handle):
    """mp_pool_destroy_ex: (status, whether the pool is gone). A failure can
    come after the pool was freed (a device free refused after others went):
    its handle must then be dropped all the same, or a later destroy would
    free it twice."""
    gone = ctypes.c_int(0)
    status = _lib.lib().mp_pool_destroy_ex(handle, ctypes.byref(gone))
    return status, bool(gone.value)


def _refusal(name, detail, call):
    """The exception for status name ("MP_EINVAL") with a detail of this
    package's own (a refusal made before calling the library)."""
    L = _lib.lib()
    for status in range(1, 64):
        if _s(L.mp_status_name(status)) == name:
            return _error(status, detail, call)
    raise RuntimeError("libmempool has no status %s" % name)


def _bad(detail, call):
    return _refusal("MP_EINVAL", detail, call)


_WORD = 1 << (8 * ctypes.sizeof(ctypes.c_size_t))


def _int_text(value):
    """An int as a message shows it: decimal, but by its size past 128
    bits (str() of an int of more than 4300 digits raises ValueError, which
    would replace the refusal being made)."""
    if value.bit_length() <= 128:
        return "%d" % value
    return "%s(a %d-bit integer)" % ("-" if value < 0 else "", value.bit_length())


def _shown(value):
    """repr(value) for a call's name, an int by _int_text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_text(value)
    return repr(value)


def _word(value, what, call):
    """value as a C size_t or pointer: ctypes would wrap an int outside
    [0, 2**64) silently (2**64 + p freed p; -1 asked 16 EiB). Any integer
    (numpy's int64 too) is taken through __index__, as Python's own size
    arguments are; a bool or a float is refused."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError("%s: %s must be an int, not %s"
                        % (call, what, type(value).__name__))
    value = operator.index(value)
    if not 0 <= value < _WORD:
        raise _bad("%s %s is not in [0, 2**%d)"
                   % (what, _int_text(value), 8 * ctypes.sizeof(ctypes.c_size_t)), call)
    return value


def _ptr_or_none(ptr, call, what="ptr"):
    """A pointer argument that may be None, passed as NULL: alloc(0)
    returns None, and freeing it must be what freeing NULL is in C."""
    return None if ptr is None else _word(ptr, what, call)


def _cstr(text, what, call):
    """text as a C string: an embedded NUL would end it early, and the
    library would take a prefix of what was given."""
    if not isinstance(text, (str, bytes)):
        raise TypeError("%s: %s must be a str, not %s"
                        % (call, what, type(text).__name__))
    try:
        b = text if isinstance(text, bytes) else text.encode()
    except UnicodeEncodeError as e:
        # A lone surrogate (from os.fsdecode of bytes that are not UTF-8,
        # or "\udcff" written out) is no text the library can read: the
        # package's own refusal, naming where, not the codec's.
        raise _bad("%s %r is not UTF-8 text: %s at offset %d"
                   % (what, text, e.reason, e.start), call) from None
    if b"\0" in b:
        raise _bad("%s %r holds a NUL byte" % (what, text), call)
    return b


def _stream_handle(stream):
    if stream is None:
        return None
    if isinstance(stream, Stream):
        return stream._live()
    # a CUstream / cudaStream_t as an int (e.g. torch's); int() would turn
    # 2.5 into 0x2 (the per-thread stream) and True into 0x1 (the legacy one)
    return _word(stream, "stream", "stream handle")


def _device(device, call):
    if not isinstance(device, Device):
        raise TypeError("%s: device must be a mempool.Device, not %s"
                        % (call, type(device).__name__))
    return device._live()


class _use:
    """with _use(a) or _use(a, b): a call into the library that uses a (a
    Device, Stream or Pool) and b (a Stream; a raw stream handle or None is
    passed over) is running (_Handle)."""

    __slots__ = ("a", "b")

    def __init__(self, a, b=None):
        self.a = a
        self.b = b if isinstance(b, _Handle) else None

    def __enter__(self):
        self.a._enter()
        if self.b is not None:
            try:
                self.b._enter()
            except BaseException:
                self.a._leave()
                raise
        return self

    def __exit__(self, *exc):
        if self.b is not None:
            self.b._leave()
        self.a._leave()


def _forked(pid):
    """Whether this process is a child forked from process pid (which made
    the handle a finalizer is given): the library's state here is a copy
    whose device threads (a host stream's worker) were not forked, and a
    destroy or close would wait for them for ever. The finalizers leave
    such a copy alone; the parent's objects are the parent's to free."""
    return _this_pid != pid


# This process's id, renewed in a forked child: os.getpid() is a system
# call, and it was checked on every call into the library (1 to 2 us a call
# where system calls are slow, a sandbox's for one).
_this_pid = os.getpid()


def _renew_pid():
    global _this_pid
    _this_pid = os.getpid()


os.register_at_fork(after_in_child=_renew_pid)

# The process whose default pools (mp_default_pool's, which mp_torch_*
# serve PyTorch from) this package used or handed to PyTorch; None until
# then. They are process-wide library state: a forked child holds a copy
# whose device threads do not run there (a trim waited for them for ever),
# so the child is refused them, as it is the parent's objects (_mine).
_default_pid = None

# The $MEMPOOL_DEVICE (None: unset) the default pools were made with, once a
# call of this package made them; _NOT_MADE before. The library reads it
# once, when the first default pool is made, and those pools live until the
# process exits (src/default.c): mempool.torch.use() refuses a device that
# could no longer take effect.
_NOT_MADE = object()
_default_device = _NOT_MADE


def _default_pools(call, make=True, mark=True):
    """The library, for a call on the default pools of this process. make:
    the call makes them if they are not yet (every call on them does, but
    mempool.torch.use(), which only hands them to PyTorch). mark: record
    them as used by this process (use() checks first, with mark False, and
    records them only once PyTorch took the allocator)."""
    global _default_pid, _default_device
    if _default_pid is not None and _forked(_default_pid):
        raise _bad("the default pools were used by process %d, and process %d is a "
                   "child forked from it: they are that process's"
                   % (_default_pid, os.getpid()), call)
    if not mark:
        return _lib.lib()
    _default_pid = _this_pid
    if make and _default_device is _NOT_MADE:
        _default_device = os.environ.get("MEMPOOL_DEVICE")
    return _lib.lib()


def _on_drop(obj, fn, *args):
    """A weakref.finalize that calls fn(*args) once obj is dropped, and not
    at exit: there weakref.finalize runs every live finalizer while daemon
    threads still run, and one of them may be in a call on obj (a Pool
    destroyed under its alloc was a use after free). What is alive at exit
    goes with the process."""
    f = weakref.finalize(obj, fn, *args)
    f.atexit = False
    return f


@contextlib.contextmanager
def _keeping_last_error():
    """Cleanup run at a point the caller did not choose (the finalizer of a
    dropped object, which the collector may run between a failing call and
    the read of its message; a close while a with block's exception is on
    its way out) leaves the thread's last error as it found it
    (mp_error_save, mp_error_restore): a destroy or close refused there,
    said as a ResourceWarning or an exception of its own, does not replace
    the message, status and driver code of the caller's failure."""
    L = _lib.lib()
    saved = _lib.error_state()
    L.mp_error_save(saved)
    try:
        yield
    finally:
        L.mp_error_restore(saved)


def _exit_closing(close, exc_type):
    """close() on leaving a with block. While the block's own exception is
    on its way out, a refusal of the close (Busy: a pool still alive on the
    device, a call running on another thread) does not replace it: it is
    said as a ResourceWarning, and the object stays open as close() leaves
    it."""
    if exc_type is None:
        close()
        return
    try:
        with _keeping_last_error():
            close()
    except MempoolError as e:
        warnings.warn("%s (leaving a with block that raised %s)" % (e, exc_type.__name__),
                      ResourceWarning, stacklevel=3)


class _Handle:
    """An object holding a handle of this process's library state: a copy
    would share it (destroying one left the other dangling, and its next
    call crashed the interpreter), a pickle would carry a raw address into
    another process. Both are refused.

    Calls on other threads: ctypes lets go of the GIL for each call into
    the library, so a destroy (or close) on one thread could free what a
    call running on another was using: the interpreter crashed, or the
    library's memory was corrupted. Each call into the library counts
    itself in (_use) under the object's guard; a destroy or close takes the
    guard, refuses with Busy while calls are counted, and holds it while it
    runs, so a call begun meanwhile waits and then finds the object gone.
    In a forked child the guards are not taken at all (_forked is checked
    first): one that a thread of the parent held at the fork stays held in
    the child for good."""

    def _guarded(self):
        self._guard = threading.RLock()
        self._calls = 0

    def _enter(self):
        self._mine()
        with self._guard:
            self._live()
            self._calls += 1

    def _leave(self):
        with self._guard:
            self._calls -= 1

    @contextlib.contextmanager
    def _ending(self, call):
        """What destroy and close run in: yields whether self is still
        there, with its guard held and no call on it running on another
        thread (else Busy). Refused in a forked child before the guard."""
        if self.handle is None:
            yield False
            return
        self._mine()
        with self._guard:
            if self._calls:
                raise _refusal("MP_EBUSY", "%d call(s) on this mempool.%s are running "
                               "on other threads" % (self._calls, type(self).__name__),
                               call)
            yield self.handle is not None

    def _mine(self):
        """Refuses a call in a child forked from the process that made
        self (_forked): there the library's device threads do not run, and
        a call that waits for them (trim, destroy, close) hung."""
        if _forked(self._pid):
            raise _bad("this mempool.%s belongs to process %d, and process %d is a "
                       "child forked from it: make a new Device here"
                       % (type(self).__name__, self._pid, os.getpid()),
                       type(self).__name__)

    def __reduce_ex__(self, protocol):
        raise TypeError("mempool.%s holds a handle of this process's libmempool "
                        "state: it cannot be copied or pickled"
                        % type(self).__name__)


class Device(_Handle):
    """An mp_device_t. spec: "host", "host:capacity=8G,...", "cuda", "cuda:N",
    or None ($MEMPOOL_DEVICE, else cuda where usable, else host). Dropped
    without close(), it is closed (Device._dropped)."""

    def __init__(self, spec=None):
        self._guarded()
        L = _lib.lib()
        h = ctypes.c_void_p()
        call = "mp_device_open(%r)" % (spec,)
        _check(L.mp_device_open(_cstr(spec, "spec", call) if spec is not None else None,
                                ctypes.byref(h)), call)
        self.handle = h.value
        self._pid = os.getpid()
        self._streams = []
        self._pools = weakref.WeakSet()  # live Pools on it (close refuses)
        # Handles of Pools dropped with blocks still live (Pool._dropped):
        # kept, as those blocks may still be used, and destroyed by close.
        self._orphans = []
        # Dropped without close(): _dropped, with what it needs (not self).
        # Pools and Streams hold their Device, so it goes after them.
        self._finalizer = _on_drop(self, Device._dropped, h.value, self._orphans, self._pid)

    @staticmethod
    def _dropped(handle, orphans, pid):
        """A Device object that was never closed is gone, and with it every
        Pool and Stream of it. Closed (its streams with it), unless a Pool
        was dropped on it with live blocks: their addresses may still be in
        use, so it is kept open, with a ResourceWarning."""
        if _forked(pid):
            return
        if orphans:
            warnings.warn("a mempool.Device was dropped without close() while %d pool(s) "
                          "dropped with live blocks were on it: it is kept open"
                          % len(orphans), ResourceWarning, stacklevel=2)
            return
        with _keeping_last_error():
            failure = Device._release(handle)
        if failure is not None:  # open for good: said, not hidden
            warnings.warn("a dropped mempool.Device could not be closed and stays open: %s"
                          % failure, ResourceWarning, stacklevel=2)

    @staticmethod
    def _release(handle):
        """Closes a dropped device: None, or why not."""
        L = _lib.lib()
        return None if L.mp_device_close_ex(handle) == 0 else _s(L.mp_last_error())

    @property
    def name(self):
        with _use(self):
            return _s(_lib.lib().mp_device_name(self.handle))

    def _live(self):
        if self.handle is None:
            raise _bad("the device is closed", "Device")
        self._mine()
        return self.handle

    def mem_info(self):
        """(free_bytes, total_bytes)"""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        with _use(self):
            _check(_lib.lib().mp_device_mem_info(self.handle, ctypes.byref(free),
                                                 ctypes.byref(total)), "mp_device_mem_info")
        return free.value, total.value

    def synchronize(self):
        with _use(self):
            _check(_lib.lib().mp_device_synchronize(self.handle), "mp_device_synchronize")

    def stream(self):
        """A new stream on this device (destroyed when dropped, or with the
        device if not before)."""
        return Stream(self)

    def close(self):
        """Drains every stream and closes; pools on it must be destroyed
        first (a live one: Busy, and the device stays open: the library's
        pool would use the closed device and crash the interpreter); dropped
        ones still in a reference cycle are collected first. Pools dropped
        with blocks still live (Pool._dropped) are destroyed here. Busy
        while a call on the device or one of its streams runs on another
        thread. A close the library refuses (from a host function, or on
        CUDA a wait for the device the driver refuses, such as while one of
        its streams is captured) raises, the device open as it was; one
        that went ahead but met a release the driver refused (what the
        program left on the device) raises too, the device closed."""
        with self._ending("Device.close") as there:
            if there:
                self._close()

    def _close(self):
        live = [p for p in self._pools if p.handle is not None]
        if live:
            # Dropped ones still in a reference cycle wait for the cycle
            # collector: it runs their finalizers (Pool._dropped) now.
            del live
            gc.collect()
            live = [p for p in self._pools if p.handle is not None]
        if live:
            raise _refusal("MP_EBUSY",
                           "%d pool(s) on the device are not destroyed" % len(live),
                           "Device.close")
        while self._orphans:
            status, gone = _destroy(self._orphans[-1])
            if gone:
                self._orphans.pop()
            _check(status, "mp_pool_destroy (a Pool dropped with live blocks)")
        # A refused close (from a host function, a wait the driver refuses)
        # leaves the device open, and its handle must stay for a later
        # close, not be dropped as if closed; a close that went ahead and
        # met a release the driver refused is closed all the same: the
        # handle goes, then the refusal is raised.
        closed = ctypes.c_int(0)
        status = _lib.lib().mp_device_close_checked(self.handle, ctypes.byref(closed))
        if closed.value:
            self.handle = None
            self._finalizer.detach()
        _check(status, "mp_device_close")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        _exit_closing(self.close, exc_type)

    def __repr__(self):
        if self.handle is None:
            return "<mempool.Device closed>"
        if _forked(self._pid):  # name would be refused (_mine)
            return "<mempool.Device of process %d>" % self._pid
        return "<mempool.Device %s>" % self.name


class Stream(_Handle):
    """An mp_stream_t of a Device; .handle is the raw pointer (int)."""

    def __init__(self, device):
        self._guarded()
        h = ctypes.c_void_p()
        _device(device, "Stream")
        with _use(device):
            _check(_lib.lib().mp_stream_create(device.handle, ctypes.byref(h)),
                   "mp_stream_create")
        self.device, self.handle, self._pid = device, h.value, os.getpid()
        # Dropped without destroy(): destroyed (the pools on the device
        # forget it first, mp_stream_destroy), unless its device is closed.
        self._finalizer = _on_drop(self, Stream._dropped, device, h.value, self._pid)

    @staticmethod
    def _dropped(device, handle, pid):
        if _forked(pid):
            return
        with _keeping_last_error(), device._guard:  # a close on another thread waits
            if device.handle is None:
                return
            failure = Stream._release(device.handle, handle)
        if failure is not None:
            # Refused (from a host function; a stream being captured): the
            # library keeps it, and the device's close destroys it.
            warnings.warn("a dropped mempool.Stream could not be destroyed: %s (one the "
                          "library still holds goes with its Device's close)" % failure,
                          ResourceWarning, stacklevel=2)

    @staticmethod
    def _release(dev, handle):
        """Destroys a dropped stream: None, or why not."""
        L = _lib.lib()
        return None if L.mp_stream_destroy(dev, handle) == 0 else _s(L.mp_last_error())

    def _live(self):
        # A destroyed stream's handle is None, which ctypes would pass as
        # NULL: the default stream, not the one asked for.
        if self.handle is None:
            raise _bad("the stream is destroyed", "Stream")
        # Closing the device freed it: the handle may name a stream made
        # since, on any device.
        if self.device.handle is None:
            raise _bad("the stream's device is closed", "Stream")
        self._mine()
        return self.handle

    def _enter(self):
        # Its device's calls count it too: a close would destroy it.
        self.device._enter()
        try:
            _Handle._enter(self)
        except BaseException:
            self.device._leave()
            raise

    def _leave(self):
        _Handle._leave(self)
        self.device._leave()

    def synchronize(self):
        with _use(self):
            _check(_lib.lib().mp_stream_synchronize(self.device.handle, self.handle),
                   "mp_stream_synchronize")

    def destroy(self):
        """Busy while a call that uses the stream runs on another thread."""
        with self._ending("Stream.destroy") as there:
            if not there:
                return
            with self.device._guard:  # no close meanwhile
                if self.device.handle is not None:  # else it went with it
                    _check(_lib.lib().mp_stream_destroy(self.device.handle, self.handle),
                           "mp_stream_destroy")
            self.handle = None
            self._finalizer.detach()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        _exit_closing(self.destroy, exc_type)


_libc_handle = None


def _libc():
    """The C library, for the FILE * mp_pool_dump writes to."""
    global _libc_handle
    if _libc_handle is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fdopen.restype = ctypes.c_void_p
        libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose.restype = ctypes.c_int
        _libc_handle = libc
    return _libc_handle


def _stdio_open(fd):
    """A FILE * writing to a duplicate of fd (fclose closes the duplicate)."""
    dup = os.dup(fd)
    f = _libc().fdopen(dup, b"wb")
    if not f:
        err = ctypes.get_errno()
        os.close(dup)
        raise OSError(err, "fdopen: %s" % os.strerror(err))
    return f


class _Config(ctypes.Structure):
    # Opaque room for mp_pool_config_t, filled only by
    # mp_pool_config_init_sized and mp_pool_config_parse, so its layout is
    # never mirrored here. The struct is eleven words today; 64 leave room
    # for appended fields. It is made at the library's own size
    # (mp_pool_config_sizeof): the mp_pool_config_init symbol makes the
    # first size, which lacks the fields appended since (arenas), and an
    # option for one of those was then dropped.
    _fields_ = [("words", ctypes.c_uint64 * 64)]


def _options(options, kwargs):
    if isinstance(options, bytes):  # as Device takes its spec
        try:
            options = options.decode()
        except UnicodeDecodeError as e:
            raise _bad("options %r are not UTF-8 text: %s at offset %d"
                       % (options, e.reason, e.start), "Pool") from None
    if options is not None and not isinstance(options, str):
        raise TypeError("Pool: options must be a str or bytes, not %s"
                        % type(options).__name__)
    # The string goes to the library as given: a trailing ',' it refuses
    # ("trailing ','") stays refused with keywords after it (an empty
    # option), never dropped here.
    parts = [options] if options else []
    for k, v in kwargs.items():
        if isinstance(v, bool):
            v = int(v)
        # One option each: a ',' would start another one inside the string,
        # and '=' or ':' in a name would split it elsewhere.
        if "," in str(v) or any(c in k for c in ",=:"):
            raise _bad("option %s=%r holds a separator (',' in a value, ',', '=' "
                       "or ':' in a name)" % (k, v), "Pool")
        parts.append("%s=%s" % (k, v))
    return ",".join(parts)


class Pool(_Handle):
    """An mp_pool_t on a Device.

    options: mp_pool_config_parse's string ("max_bytes=8G,align=512,..."),
    keyword arguments are appended to it (Pool(dev, max_bytes="1G")). The
    defaults include $MEMPOOL_CONF, as for mp_pool_config_init."""

    def __init__(self, device, options=None, **kwargs):
        self._guarded()
        L = _lib.lib()
        _device(device, "Pool")
        cfg = _Config()
        size = L.mp_pool_config_sizeof()
        if size > ctypes.sizeof(cfg):
            raise RuntimeError("mp_pool_config_t is %d bytes in this library, "
                               "more than the %d this package holds"
                               % (size, ctypes.sizeof(cfg)))
        _check(L.mp_pool_config_init_sized(ctypes.byref(cfg), size),
               "mp_pool_config_init_sized")
        opts = _options(options, kwargs)
        if opts:
            call = "mp_pool_config_parse(%r)" % opts
            _check(L.mp_pool_config_parse(ctypes.byref(cfg), _cstr(opts, "options", call)),
                   call)
        h = ctypes.c_void_p()
        with _use(device):  # counted by a close until the pool is in _pools
            _check(L.mp_pool_create(device.handle, ctypes.byref(cfg), ctypes.byref(h)),
                   "mp_pool_create")
            self.device, self.handle, self._pid = device, h.value, os.getpid()
            device._pools.add(self)
        # Dropped without destroy(): _dropped, with what it needs (not self).
        self._finalizer = _on_drop(self, Pool._dropped, device, h.value, self._pid)

    @staticmethod
    def _dropped(device, handle, pid):
        """A Pool object that was never destroyed is gone. Holding no block,
        its pool is destroyed (what it reserved goes back); holding some, it
        is kept for the device to destroy at close, as their addresses may
        still be in use, with a ResourceWarning. A close of the device on
        another thread waits (_Handle)."""
        if _forked(pid):
            return
        with _keeping_last_error(), device._guard:
            Pool._drop(device, handle)

    @staticmethod
    def _drop(device, handle):
        # Closed meanwhile: the pool left _pools (a weak set) before this
        # finalizer ran, so a close on another thread did not count it and
        # freed the device; the pool is then left alone (destroying it would
        # reach the freed device).
        if device.handle is None:
            return
        gone, failure = Pool._release(handle)
        if gone:
            if failure is not None:
                warnings.warn("a dropped mempool.Pool was destroyed, but: %s" % failure,
                              ResourceWarning, stacklevel=2)
            return
        device._orphans.append(handle)
        why = ("and its destroy was refused (%s)" % failure if failure is not None
               else "with live blocks (or child pools)")
        warnings.warn("a mempool.Pool was dropped %s and not destroyed: it is kept "
                      "until its Device closes" % why, ResourceWarning, stacklevel=2)

    @staticmethod
    def _release(handle):
        """Destroys a dropped pool that holds no block: (whether it is
        gone, the failure's message or None)."""
        L = _lib.lib()
        s = Stats()
        if L.mp_pool_get_stats_sized(handle, ctypes.byref(s), ctypes.sizeof(s)) != 0 \
                or s.allocated_bytes != 0:
            return False, None
        status, gone = _destroy(handle)
        return gone, (_s(L.mp_last_error()) if status != 0 else None)

    def _live(self):
        if self.handle is None:
            raise _bad("the pool is destroyed", "Pool")
        self._mine()
        return self.handle

    def alloc(self, nbytes, stream=None):
        """The address (int) of a block of nbytes for use on stream; None for 0."""
        out = ctypes.c_void_p()
        call = "mp_pool_alloc(%s)" % _shown(nbytes)
        nbytes = _word(nbytes, "nbytes", call)
        with _use(self, stream):
            _check(_lib.lib().mp_pool_alloc(self.handle, nbytes, _stream_handle(stream),
                                            ctypes.byref(out)), call)
        return out.value

    def free(self, ptr, stream=None):
        """Frees ptr; with stream, ordered after the work queued on it too
        (mp_pool_free_async). None (what alloc(0) returns) is the C NULL:
        nothing is freed, as for free(NULL)."""
        call = "mp_pool_free" if stream is None else "mp_pool_free_async"
        ptr = _ptr_or_none(ptr, call)
        with _use(self, stream):
            if stream is None:
                _check(_lib.lib().mp_pool_free(self.handle, ptr), call)
            else:
                _check(_lib.lib().mp_pool_free_async(self.handle, ptr,
                                                     _stream_handle(stream)), call)

    def record_stream(self, ptr, stream):
        """ptr is also used on stream (like Tensor.record_stream)."""
        ptr = _word(ptr, "ptr", "mp_pool_record_stream")
        with _use(self, stream):
            _check(_lib.lib().mp_pool_record_stream(self.handle, ptr,
                                                    _stream_handle(stream)),
                   "mp_pool_record_stream")

    def trim(self, keep_bytes=0):
        """Gives cached memory back until at most keep_bytes stay free
        (torch.cuda.empty_cache() is trim(0))."""
        keep_bytes = _word(keep_bytes, "keep_bytes", "mp_pool_trim")
        with _use(self):
            _check(_lib.lib().mp_pool_trim(self.handle, keep_bytes), "mp_pool_trim")

    empty_cache = trim

    def snapshot(self, path):
        """Writes PyTorch's memory snapshot pickle to path (mp_pool_snapshot):
        open it with torch.cuda._memory_viz or the memory_viz page, or replay
        it with `mpbench replay`. Events come only from a pool made with
        history=N (history_stacks=1 adds stacks)."""
        call = "mp_pool_snapshot(%r)" % (path,)
        path = _cstr(os.fsencode(path), "path", call)
        with _use(self):
            _check(_lib.lib().mp_pool_snapshot(self.handle, path), call)

    def check(self):
        """Walks every invariant; raises Corrupt if one is broken."""
        with _use(self):
            _check(_lib.lib().mp_pool_check(self.handle), "mp_pool_check")

    def raw_stats(self):
        """The mp_stats_t itself."""
        s = Stats()
        # The sized call: the library writes only as much as Stats holds.
        with _use(self):
            _check(_lib.lib().mp_pool_get_stats_sized(self.handle, ctypes.byref(s),
                                                      ctypes.sizeof(s)),
                   "mp_pool_get_stats")
        return s

    def stats(self):
        """A dict: torch.cuda.memory_stats() names where they mean the same
        (TORCH_KEYS) and every mp_stats_t field by its own name."""
        return to_dict(self.raw_stats())

    memory_stats = stats

    def dump(self, format="text"):
        """mp_pool_dump as a string: "text" (None too, as in C), "json" or
        "torch" (one JSON object with torch.cuda.memory_stats() names,
        inactive_split_bytes included)."""
        fmt = None if format is None else _cstr(format, "format", "mp_pool_dump")
        # A file of tempfile's: in $TMPDIR (libc's tmpfile() always took
        # /tmp, which may be small or not writable), unnamed or unlinked at
        # once, and closed here whatever happens.
        with tempfile.TemporaryFile() as tf:
            f = _stdio_open(tf.fileno())
            try:
                with _use(self):
                    _check(_lib.lib().mp_pool_dump(self.handle, f, fmt), "mp_pool_dump")
            finally:
                flushed = _libc().fclose(f) == 0
            if not flushed:
                raise OSError("mp_pool_dump: writing the temporary file failed")
            tf.seek(0)
            return tf.read().decode()

    def pause(self, keep_content=True):
        """Gives every mapped byte back to the device and keeps the pool's
        addresses (mp_pool_pause); with keep_content the live blocks are
        copied to page-locked host memory first and come back byte for byte
        on resume, without it their content is undefined afterwards. While
        paused every call but resume, stats, reset_peaks, dump, snapshot and
        destroy raises Busy.
        A pool with plain segments (virtual=0, or a device without virtual
        memory) raises NotSupported; paused already: Busy."""
        with _use(self):
            _check(_lib.lib().mp_pool_pause(self.handle, 1 if keep_content else 0),
                   "mp_pool_pause")

    def resume(self):
        """Maps the memory again at the same addresses (mp_pool_resume). If
        the device has no room the pool stays paused, nothing lost, and
        resume may be tried again; not paused: InvalidArgument."""
        with _use(self):
            _check(_lib.lib().mp_pool_resume(self.handle), "mp_pool_resume")

    def reset_peaks(self):
        with _use(self):
            _check(_lib.lib().mp_pool_reset_peaks(self.handle), "mp_pool_reset_peaks")

    def destroy(self):
        """Busy while a call on the pool runs on another thread."""
        with self._ending("Pool.destroy") as there:
            if not there:
                return
            status, gone = _destroy(self.handle)
            if gone:  # also when status says a free failed after it went
                self.handle = None
                self._finalizer.detach()
            _check(status, "mp_pool_destroy")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        _exit_closing(self.destroy, exc_type)


def default_pool_stats():
    """stats() of the calling thread's device's default pool (mp_default_pool),
    the one mp_malloc and mp_torch_malloc use for that device: with
    PyTorch, its current device (torch.cuda.set_device). Each other device
    PyTorch allocates on has a pool of its own, not counted here."""
    L = _default_pools("mp_default_pool")
    h = L.mp_default_pool()
    if not h:
        # NULL, not a status: the status of the reason it gives.
        raise _error(L.mp_last_status(), _s(L.mp_last_error()), "mp_default_pool")
    s = Stats()
    _check(L.mp_pool_get_stats_sized(h, ctypes.byref(s), ctypes.sizeof(s)),
           "mp_pool_get_stats")
    return to_dict(s)


class PreloadNotFound(MempoolError):
    """mempool_preload_pause/resume called in a process without
    libmempool_preload.so (LD_PRELOAD)."""


def _preload_call(name, *args):
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except AttributeError:
        raise PreloadNotFound(-1, "MP_UNKNOWN", "the shim is not loaded",
                              "%s: start the process with "
                              "LD_PRELOAD=libmempool_preload.so" % name, name) from None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_uint] * len(args)
    st = fn(*args)
    if st != 0:
        # The shim links its own copy of the library: the status names are
        # the same, its last error is its own (it says it on stderr).
        raise _error(st, "see the shim's message on stderr", name)


def preload_pause(keep_content=True):
    """In a process running under the shim (LD_PRELOAD=libmempool_preload.so),
    pauses every device's pool the shim serves cudaMalloc & co. from, all or
    none (mempool_preload_pause): the program's device memory goes back to
    the driver, its addresses stay reserved. While paused the program's
    allocations and frees fail and change nothing. Raises PreloadNotFound
    without the shim, Busy when paused already, NotSupported for pools
    without virtual memory, InvalidArgument when the shim passes calls
    through (no pool)."""
    _preload_call("mempool_preload_pause", 1 if keep_content else 0)


def preload_resume():
    """Maps every paused pool of the shim again at the same addresses
    (mempool_preload_resume), content back if it was kept."""
    _preload_call("mempool_preload_resume")


def __getattr__(name):
    """mempool.torch after a plain `import mempool` (PEP 562): the submodule
    is imported on first use, so that PyTorch's module is looked for only by
    those who route PyTorch through mempool."""
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
