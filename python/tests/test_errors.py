"""MempoolError and its subclasses as Python exceptions."""
import copy
import pickle

import pytest

import mempool


def _fields(e):
    return (type(e), e.status, e.name, e.message, e.detail, e.call, str(e), e.args)


def test_an_error_survives_pickle_and_copy_with_every_field(pool):
    # multiprocessing and concurrent.futures pickle a worker's exception to
    # send it to the parent; unpickling called MempoolError(msg) without the
    # other four arguments and raised TypeError instead (copy.copy too).
    with pytest.raises(mempool.InvalidArgument) as e:
        pool.free(0x1234)
    err = e.value
    for again in (pickle.loads(pickle.dumps(err)), copy.copy(err), copy.deepcopy(err)):
        assert _fields(again) == _fields(err)
        assert isinstance(again, ValueError)
    with pytest.raises(mempool.PreloadNotFound) as e:
        mempool.preload_resume()
    again = pickle.loads(pickle.dumps(e.value))
    assert _fields(again) == _fields(e.value)
