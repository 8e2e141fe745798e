"""Bad arguments from Python are refused before they reach the library,
where ctypes would change them silently: ints outside a C size_t or
pointer wrapped (2**64 + p freed p), a NUL byte ended a string early (the
library took a prefix), and closing a device under a live pool crashed the
interpreter."""
import math
import subprocess
import sys

import pytest

import mempool
import mempool.torch


def test_out_of_range_sizes_and_pointers_are_refused_and_change_nothing(pool):
    p = pool.alloc(4096)
    before = pool.stats()
    for bad in (2**64 + p, -p, 2**70):
        with pytest.raises(mempool.InvalidArgument):
            pool.free(bad)
        with pytest.raises(mempool.InvalidArgument):
            pool.free(bad, stream=None)
        with pytest.raises(mempool.InvalidArgument):
            pool.record_stream(bad, None)
    for bad in (2**64, 2**64 + 4096, -1):
        with pytest.raises(mempool.InvalidArgument):
            pool.alloc(bad)
    with pytest.raises(mempool.InvalidArgument):
        pool.trim(-1)
    with pytest.raises(mempool.InvalidArgument):
        pool.alloc(4096, stream=2**64)
    with pytest.raises(TypeError):
        pool.alloc(4096.0)
    with pytest.raises(TypeError):
        pool.free(True)
    after = pool.stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.freed"] == before["allocation.all.freed"]
    pool.free(p)  # still live: nothing above freed it
    pool.check()


def test_a_destroyed_stream_is_refused_not_taken_for_the_default_stream(device, pool):
    # A destroyed Stream's handle is None, which ctypes passes as NULL: the
    # default stream, so an allocation, a record and a free on it went
    # through on another stream than asked, and its synchronize synchronized
    # the default stream.
    st = device.stream()
    st.destroy()
    _stream_calls_are_refused(pool, st, "stream is destroyed")
    st.destroy()  # twice: nothing to do
    pool.check()


def _stream_calls_are_refused(pool, st, match):
    """An allocation, a record and a free on st, and its synchronize, each
    raise InvalidArgument matching match, and the pool is unchanged."""
    p = pool.alloc(4096)
    before = pool.stats()
    with pytest.raises(mempool.InvalidArgument, match=match):
        pool.alloc(4096, stream=st)
    with pytest.raises(mempool.InvalidArgument, match=match):
        pool.record_stream(p, st)
    with pytest.raises(mempool.InvalidArgument, match=match):
        pool.free(p, stream=st)
    with pytest.raises(mempool.InvalidArgument):
        st.synchronize()
    after = pool.stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    pool.free(p)  # still live: the refused free did not free it


def test_a_nul_byte_in_a_string_is_refused(device, tmp_path):
    with pytest.raises(mempool.InvalidArgument):
        mempool.Device("host\0capacity=junk")
    with pytest.raises(mempool.InvalidArgument):
        mempool.Pool(device, "max_bytes=1G\0bogus_key=1")
    with mempool.Pool(device, "max_bytes=16M") as p:
        with pytest.raises(mempool.InvalidArgument):
            p.snapshot(str(tmp_path / "nul_snap\0.pickle"))
        with pytest.raises(mempool.InvalidArgument):
            p.dump("text\0json")
    assert list(tmp_path.iterdir()) == [], "a file was written"


def test_a_lone_surrogate_in_a_string_is_refused_by_name(device):
    # "\udcff" (what os.fsdecode makes of a byte that is not UTF-8) cannot
    # be encoded: it raised the codec's UnicodeEncodeError, which names
    # neither the call nor the argument.
    with pytest.raises(mempool.InvalidArgument, match="spec .* offset 4"):
        mempool.Device("host\udcff")
    with pytest.raises(mempool.InvalidArgument, match="options .* offset 0"):
        mempool.Pool(device, "\udcffmax_bytes=1G")
    with mempool.Pool(device, "max_bytes=16M") as p:
        with pytest.raises(mempool.InvalidArgument, match="format"):
            p.dump("te\udcffxt")


def test_record_stream_of_the_wrong_kind_is_type_error():
    # As Tensor.record_stream(1): TypeError, not the AttributeError of
    # reading a cuda_stream or data_ptr the argument does not have.
    class Tensor:
        def data_ptr(self):
            return 0

    class Stream:
        cuda_stream = None

    with pytest.raises(TypeError, match="stream must be"):
        mempool.torch.record_stream(Tensor(), 7)
    with pytest.raises(TypeError, match="tensor must be"):
        mempool.torch.record_stream(object(), Stream())


def test_closing_a_device_under_a_live_pool_is_busy_and_keeps_both(device):
    p = mempool.Pool(device, "max_bytes=16M")
    with pytest.raises(mempool.Busy) as e:
        device.close()
    assert e.value.name == "MP_EBUSY" and e.value.status != 1  # 1 is MP_EINVAL
    a = p.alloc(4096)  # the device is still open: the pool works
    p.free(a)
    p.destroy()
    device.close()
    assert device.handle is None


def test_leaving_a_with_block_that_raised_keeps_its_exception(device):
    # Device.__exit__ closed the device under a live pool: Busy replaced
    # the block's own exception (the KeyError only its __context__).
    with pytest.warns(ResourceWarning, match="MP_EBUSY.*KeyError"):
        with pytest.raises(KeyError, match="the block's own"):
            with device:
                p = mempool.Pool(device, "max_bytes=16M")
                raise KeyError("the block's own")
    assert device.handle is not None  # refused, as close() refuses it
    p.destroy()
    with device:  # no exception: close() as ever, and it goes through
        pass
    assert device.handle is None
    with pytest.raises(mempool.Busy):  # and without one, Busy is raised
        with mempool.Device("host:capacity=64M") as d:
            q = mempool.Pool(d, "max_bytes=16M")
    q.destroy()
    d.close()


def test_integers_past_the_digit_limit_are_refused_by_the_package(pool):
    # Formatting the value for the message raised Python's own ValueError
    # ("Exceeds the limit (4300 digits) for integer string conversion"),
    # which MempoolError handlers do not catch.
    huge = 10**5000
    for call in (lambda: pool.alloc(huge), lambda: pool.free(huge),
                 lambda: pool.alloc(-huge), lambda: pool.record_stream(huge, None)):
        with pytest.raises(mempool.InvalidArgument, match="-bit integer"):
            call()


def test_pool_options_may_be_bytes_as_a_device_spec_may(device):
    p = mempool.Pool(device, b"max_bytes=16M")
    assert p.alloc(4096) is not None
    p.destroy()
    with pytest.raises(mempool.InvalidArgument, match="UTF-8"):
        mempool.Pool(device, b"max_bytes=\xff")


@pytest.mark.parametrize("fraction, dev", [(2.0, 0), (-1.0, 0), (math.nan, 0),
                                           pytest.param(10**400, 0, id="10**400"),
                                           pytest.param(-10**400, 0, id="-10**400"),
                                           (0.5, -3), (0.5, 1.5), (0.5, True),
                                           (0.5, 2**31), (0.5, 2**32)])
def test_set_memory_fraction_refuses_what_the_c_hook_would_ignore(fraction, dev):
    # A device past a C int was wrapped by ctypes: 2**32 capped device 0.
    # An int past a double's range raised float()'s OverflowError.
    with pytest.raises(ValueError):
        mempool.torch.set_memory_fraction(fraction, dev)


def test_set_memory_fraction_of_the_wrong_type_is_type_error_and_sets_nothing(monkeypatch):
    # float() took a str ("0.5") and a bool (True as 1.0), so the cap was
    # set from something that is no fraction (PyTorch's own call refuses
    # them with TypeError); None and a list raised float()'s message.
    calls = []
    monkeypatch.setattr(mempool._lib.lib(), "mp_torch_memory_fraction_ex",
                        lambda *a: calls.append(a) or 0)
    for bad in ("0.5", b"0.5", True, False, None, [0.5], 0.5j):
        with pytest.raises(TypeError, match="fraction"):
            mempool.torch.set_memory_fraction(bad, 0)
    assert calls == []
    mempool.torch.set_memory_fraction(0, 0)  # numbers still go through
    mempool.torch.set_memory_fraction(0.25, 0)
    assert calls == [(0.0, 0), (0.25, 0)]
    # device None, as PyTorch's call takes it: the current device (0
    # without torch); it was refused as "not a device number".
    mempool.torch.set_memory_fraction(0.5, None)
    mempool.torch.set_memory_fraction(0.5)
    current = mempool.torch._current_device("set_memory_fraction")
    assert calls[2:] == [(0.5, current), (0.5, current)]


def test_copying_or_pickling_a_device_pool_or_stream_is_refused(device, pool):
    # A copy shared the C handle: destroying one left the other dangling,
    # and its next call (or destroy) crashed the interpreter. A pickle
    # would carry a raw address into another process.
    import copy
    import pickle
    st = device.stream()
    for obj in (device, pool, st):
        name = type(obj).__name__
        for make in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="mempool.%s .*cannot be copied or pickled" % name):
                make(obj)
    p = pool.alloc(4096)  # all three still work
    pool.free(p)
    st.synchronize()
    st.destroy()
    pool.check()


def test_arguments_of_the_wrong_type_raise_type_error_and_change_nothing(device, pool):
    # A float, bool or str stream was turned into a handle (2.5 -> 0x2, the
    # per-thread stream on CUDA; True -> 0x1, the legacy stream); a non-str
    # spec, format or options, or a non-Device, failed with AttributeError
    # from inside the package.
    p = pool.alloc(4096)
    before = pool.stats()
    for bad in (2.5, True, "5"):
        with pytest.raises(TypeError, match="stream"):
            pool.alloc(4096, stream=bad)
        with pytest.raises(TypeError, match="stream"):
            pool.free(p, stream=bad)
        with pytest.raises(TypeError, match="stream"):
            pool.record_stream(p, bad)
    with pytest.raises(TypeError, match="spec"):
        mempool.Device(123)
    with pytest.raises(TypeError, match="format"):
        pool.dump(5)
    with pytest.raises(TypeError, match="options"):
        mempool.Pool(device, 5)
    for not_a_device in (None, "host", pool):
        with pytest.raises(TypeError, match="device"):
            mempool.Pool(not_a_device)
        with pytest.raises(TypeError, match="device"):
            mempool.Stream(not_a_device)
    after = pool.stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["allocation.all.freed"] == before["allocation.all.freed"]
    pool.free(p)
    pool.check()


def test_a_keyword_option_holding_a_separator_is_refused(device):
    # Pool(dev, max_bytes="16M,arenas=2") set arenas too: the value was
    # pasted into the option string, where its ',' starts another option.
    for kwargs in ({"max_bytes": "16M,arenas=2"}, {"history": "8,history_stacks=1"},
                   {"max_bytes,arenas": "2"}, {"max_bytes=16M,arenas": "2"}):
        with pytest.raises(mempool.InvalidArgument, match="max_bytes|history"):
            mempool.Pool(device, **kwargs)
    with mempool.Pool(device, max_bytes="16M") as p:  # a plain one still works
        p.free(p.alloc(4096))


def test_a_trailing_comma_is_refused_with_or_without_keywords(device):
    # The library refuses "max_bytes=8M," (a trailing ','); the package
    # dropped the ',' when a keyword option followed, so the same string was
    # accepted there and refused alone.
    with pytest.raises(mempool.InvalidArgument, match="trailing ','"):
        mempool.Pool(device, "max_bytes=8M,")
    for options in ("max_bytes=8M,", "max_bytes=8M,,", ","):
        with pytest.raises(mempool.InvalidArgument, match="not key=value"):
            mempool.Pool(device, options, align=4096)
    with mempool.Pool(device, "max_bytes=8M", align=4096) as p:
        a = p.alloc(1)
        assert a % 4096 == 0
        with pytest.raises(mempool.OutOfMemory):
            p.alloc(16 << 20)  # the cap held too
        p.free(a)


def test_a_stream_of_a_closed_device_is_refused_by_the_package(pool):
    # Closing a device frees its streams; a Stream kept past it passed its
    # freed handle on, which a stream made since may have taken over (the
    # call then ran on that stream instead of failing).
    other = mempool.Device("host:capacity=16M")
    st = other.stream()
    other.close()
    _stream_calls_are_refused(pool, st, "device is closed")
    st.destroy()  # nothing left to destroy: no error


class _IntLike:
    """An integer that is not an int subclass, as numpy's int64 is: it
    converts through __index__ (and refuses to be a float's stand-in)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_an_integer_that_is_not_an_int_is_taken_as_python_takes_it(device, pool):
    # pool.alloc(np.prod(shape) * 4) raised TypeError ("not int64"), where
    # Python's own size arguments (bytearray(n), os.read(fd, n)) take any
    # integer through __index__; the range checks still apply to its value.
    p = pool.alloc(_IntLike(4096))
    assert pool.stats()["requested_bytes.all.current"] == 4096
    st = device.stream()
    pool.record_stream(_IntLike(p), st)
    pool.free(_IntLike(p), stream=st)
    st.synchronize()
    q = pool.alloc(4096, stream=_IntLike(0))  # a raw handle: the NULL stream
    pool.free(q)
    pool.trim(_IntLike(0))
    assert pool.stats()["allocation.all.current"] == 0
    with pytest.raises(mempool.InvalidArgument):
        pool.alloc(_IntLike(-1))
    with pytest.raises(mempool.InvalidArgument):
        pool.free(_IntLike(2**64 + p))
    st.destroy()
    pool.check()
