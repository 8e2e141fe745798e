"""Pool.dump writes the library's dump to a temporary file and reads it
back: that file goes where $TMPDIR says (as every tempfile of Python's
does; libc's tmpfile() always used /tmp), and nothing of it is left."""
import ctypes
import os
import struct
import tempfile

import mempool

_IN_OPEN = 0x20
_IN_CREATE = 0x100


def _watch(path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    assert libc.inotify_add_watch(fd, os.fsencode(path), _IN_OPEN | _IN_CREATE) >= 0
    return fd


def _events(fd):
    """The names of files opened or made in the watched directory since."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return []
    names, i = [], 0
    while i < len(data):
        _, mask, _, n = struct.unpack_from("iIII", data, i)
        if mask & (_IN_OPEN | _IN_CREATE) and n:
            names.append(data[i + 16:i + 16 + n].rstrip(b"\0"))
        i += 16 + n
    return names


def _fds():
    return sorted(os.listdir("/proc/self/fd"))


def test_dump_writes_its_temporary_file_under_tmpdir(pool, tmp_path, monkeypatch):
    where = tmp_path / "tmpdir"
    where.mkdir()
    monkeypatch.setenv("TMPDIR", str(where))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read $TMPDIR again
    pool.free(pool.alloc(4096))
    fd = _watch(where)
    try:
        text = pool.dump()
        seen = _events(fd)
    finally:
        os.close(fd)
    assert text
    assert seen, "no file was opened under $TMPDIR"
    assert os.listdir(where) == []  # and none is left there


def test_dump_leaves_no_file_or_descriptor_behind(pool):
    before = _fds()
    for fmt in ("text", "json", "torch"):
        assert pool.dump(fmt)
    try:
        pool.dump("no-such-format")
    except mempool.MempoolError:
        pass
    assert _fds() == before
