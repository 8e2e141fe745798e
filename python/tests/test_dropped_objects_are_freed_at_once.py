"""A Pool, Stream or Device dropped (its last reference gone) is destroyed
right then, not when the cycle collector next runs: no reference cycle
joins a Device and its Pools or Streams (the Device knows its Pools only
weakly). The collector is off in these tests, so only reference counting
can free anything. A Device stays open while a Pool or Stream of it lives."""
import gc

import pytest

import mempool
from process_threads import left_since, tasks


@pytest.fixture
def no_collector():
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_a_dropped_pool_gives_its_memory_back_at_once(no_collector):
    d = mempool.Device("host:capacity=64M")
    free0 = d.mem_info()[0]
    p = mempool.Pool(d)
    p.free(p.alloc(8 << 20))
    p.stats()
    p.dump()
    assert d.mem_info()[0] < free0
    del p
    assert d.mem_info()[0] == free0
    d.close()


def test_a_dropped_device_closes_at_once_after_its_pool_and_stream(no_collector):
    before = tasks()
    d = mempool.Device("host:capacity=64M")
    p = mempool.Pool(d)
    st = d.stream()
    p.free(p.alloc(1 << 20, stream=st), stream=st)
    st.synchronize()
    assert tasks() - before
    del d, p, st
    assert not left_since(before)


def test_a_device_dropped_before_its_pool_stays_open_for_the_pool(no_collector):
    before = tasks()
    d = mempool.Device("host:capacity=64M")
    st = d.stream()
    p = mempool.Pool(d)
    del d  # the pool and the stream still need it
    p.free(p.alloc(1 << 20, stream=st), stream=st)
    st.synchronize()
    p.check()
    del st
    p.destroy()
    del p
    assert not left_since(before)
