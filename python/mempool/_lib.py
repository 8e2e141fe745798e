"""Loading libmempool.so and declaring the C functions the package calls.

The library is looked for, first match wins:
  1. $MEMPOOL_LIBRARY (a path to the .so),
  2. next to this package (a libmempool.so* copied into mempool/),
  3. the build tree of the repository this package sits in
     (<repo>/build*/src/libmempool.so, "build" first),
  4. the system's library path (ctypes.util.find_library("mempool")).
"""
import ctypes
import ctypes.util
import glob
import os
import threading

_here = os.path.dirname(os.path.abspath(__file__))


class LibraryNotFound(OSError):
    """No libmempool.so could be found or loaded, or the one found lacks a
    function this package calls."""


def _candidates():
    env = os.environ.get("MEMPOOL_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path must not be
        # papered over by another library found elsewhere. Made absolute:
        # dlopen searches the loader's path for a bare name (not the
        # working directory it was found in), and a relative path given to
        # mempool.torch.use() would name another file once the process
        # changed directory.
        return [("$MEMPOOL_LIBRARY", os.path.abspath(env))]
    out = [("package", p) for p in sorted(glob.glob(os.path.join(_here, "libmempool.so*")))]
    repo = os.path.dirname(os.path.dirname(_here))
    builds = sorted(glob.glob(os.path.join(repo, "build*", "src", "libmempool.so")),
                    key=lambda p: (os.path.basename(os.path.dirname(os.path.dirname(p))) != "build", p))
    out += [("build tree", p) for p in builds]
    sysname = ctypes.util.find_library("mempool")
    if sysname:
        out.append(("system", sysname))
    return out


def find_library():
    """The libmempool.so this package would load, without loading it: a
    path, or, for one left to the dynamic loader's search (no
    MEMPOOL_LIBRARY, none beside the package or in the repository's build
    tree), the name it asks the loader
    for (such as libmempool.so.0). library_path() gives the file the
    loader opened."""
    tried = []
    for where, path in _candidates():
        if where == "system" or os.path.exists(path):
            return path
        tried.append("%s: %s" % (where, path))
    raise LibraryNotFound(
        "libmempool.so not found (set MEMPOOL_LIBRARY to its path, copy it into %s, "
        "or install it where the dynamic loader finds it)%s"
        % (_here, "; tried " + ", ".join(tried) if tried else ""))


_c = ctypes.c_void_p
_st = ctypes.c_int  # mp_status_t: a C enum
_sz = ctypes.c_size_t


def error_state():
    """Room for an mp_error_state_t (status.h), as mp_error_save fills it
    and mp_error_restore puts it back: mp_error_state_size() bytes, the
    library's own size, 8-byte aligned (a uint64_t array). Opaque here: no
    field of it is mirrored, and a size written here could not drift from
    the library's (status.h lets the struct's version grow into reserved
    room, never its size)."""
    L = lib()
    words = (L.mp_error_state_size() + 7) // 8
    return (ctypes.c_uint64 * words)()


# name: (restype, argtypes)
_PROTOTYPES = {
    "mp_status_string": (ctypes.c_char_p, [_st]),
    "mp_status_name": (ctypes.c_char_p, [_st]),
    "mp_last_error": (ctypes.c_char_p, []),
    "mp_last_status": (_st, []),
    "mp_error_state_size": (_sz, []),
    "mp_error_save": (None, [_c]),  # an error_state()
    "mp_error_restore": (None, [_c]),
    "mp_device_open": (_st, [ctypes.c_char_p, ctypes.POINTER(_c)]),
    "mp_device_spec_canonical": (_st, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
    "mp_device_close_ex": (_st, [_c]),
    "mp_device_close_checked": (_st, [_c, ctypes.POINTER(ctypes.c_int)]),
    "mp_device_name": (ctypes.c_char_p, [_c]),
    "mp_device_mem_info": (_st, [_c, ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
    "mp_device_synchronize": (_st, [_c]),
    "mp_stream_create": (_st, [_c, ctypes.POINTER(_c)]),
    "mp_stream_destroy": (_st, [_c, _c]),
    "mp_stream_synchronize": (_st, [_c, _c]),
    "mp_pool_config_init": (None, [_c]),
    "mp_pool_config_init_sized": (_st, [_c, _sz]),
    "mp_pool_config_sizeof": (_sz, []),
    "mp_pool_config_parse": (_st, [_c, ctypes.c_char_p]),
    "mp_pool_create": (_st, [_c, _c, ctypes.POINTER(_c)]),
    "mp_pool_destroy": (_st, [_c]),
    "mp_pool_destroy_ex": (_st, [_c, ctypes.POINTER(ctypes.c_int)]),
    "mp_pool_alloc": (_st, [_c, _sz, _c, ctypes.POINTER(_c)]),
    "mp_pool_free": (_st, [_c, _c]),
    "mp_pool_free_async": (_st, [_c, _c, _c]),
    "mp_pool_record_stream": (_st, [_c, _c, _c]),
    "mp_pool_trim": (_st, [_c, _sz]),
    "mp_pool_snapshot": (_st, [_c, ctypes.c_char_p]),
    "mp_pool_check": (_st, [_c]),
    "mp_pool_get_stats_sized": (_st, [_c, _c, _sz]),
    "mp_pool_reset_peaks": (_st, [_c]),
    "mp_pool_dump": (_st, [_c, _c, ctypes.c_char_p]),
    "mp_pool_pause": (_st, [_c, ctypes.c_uint]),
    "mp_pool_resume": (_st, [_c]),
    "mp_default_pool": (_c, []),
    "mp_default_pool_made": (ctypes.c_int, []),
    "mp_torch_init": (None, [ctypes.c_int]),
    "mp_torch_reset": (None, []),
    "mp_torch_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "mp_torch_memory_fraction_ex": (_st, [ctypes.c_double, ctypes.c_int]),
    "mp_torch_record_stream": (None, [_c, _c]),
    "mp_torch_record_stream_ex": (_st, [_c, _c]),
    "mp_torch_base_alloc": (_c, [_c, ctypes.POINTER(_sz)]),
}

_lib = None
_path = None
_load_lock = threading.Lock()


def lib():
    """The loaded library, its functions declared (loaded on first use)."""
    global _lib, _path
    if _lib is None:
        with _load_lock:  # one load, whichever thread comes first
            if _lib is None:
                handle, path = _load()
                # _path first: a thread that finds _lib set (without the
                # lock) must find its path too.
                _path = path
                _lib = handle
    return _lib


def _load():
    """The library found, opened and its functions declared, and its path."""
    path = find_library()
    try:
        handle = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryNotFound("cannot load %s: %s" % (path, e)) from e
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:
            raise LibraryNotFound(
                "%s is not a libmempool this package can use: it lacks %s "
                "(another library, or an older build)" % (path, name)) from None
        fn.restype = res
        fn.argtypes = args
    if os.sep not in path:
        path = _opened_file(handle, path)
    return handle, path


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _opened_file(handle, name):
    """The file the dynamic loader opened for a bare library name (what
    ctypes.util.find_library gives: "libmempool.so.0"), found by dladdr on
    one of its functions; the name itself where dladdr cannot say."""
    addr = ctypes.cast(handle.mp_status_string, ctypes.c_void_p)
    for dl in (None, ctypes.util.find_library("dl")):
        try:
            dladdr = ctypes.CDLL(dl).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
    return name


def library_path():
    """The path of the loaded libmempool.so (loads it if needed): for one
    found on the system's library path, the file the loader opened, not
    the bare name find_library() gives."""
    lib()
    return _path
