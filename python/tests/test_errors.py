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


@pytest.mark.parametrize("device, conf, cls, name, says", [
    ("bogus", None, mempool.InvalidArgument, "MP_EINVAL", "unknown device 'bogus'"),
    ("host:capacity=64M", "nokey=1", mempool.InvalidArgument, "MP_EINVAL", "unknown key 'nokey'"),
    ("cuda:1024", None, mempool.DeviceUnavailable, "MP_ENODEV", "cuda"),
])
def test_a_default_pool_that_cannot_be_made_raises_its_status(device, conf, cls, name, says):
    # mp_default_pool returns NULL, not a status: default_pool_stats() raised
    # the bare MempoolError with status -1 and the name MP_UNKNOWN, whatever
    # the reason, where every other refusal raises its status's class.
    import os
    import subprocess
    import sys
    env = dict(os.environ, MEMPOOL_DEVICE=device, MEMPOOL_LIBRARY=mempool.library_path())
    env.pop("MEMPOOL_CONF", None)
    if conf is not None:
        env["MEMPOOL_CONF"] = conf
    code = """if True:
        import mempool
        try:
            mempool.default_pool_stats()
        except mempool.MempoolError as e:
            print(type(e).__name__, e.name, mempool._lib.lib().mp_status_name(e.status).decode())
            print(e.detail)
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=pkg,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, detail = r.stdout.splitlines()[:2]
    assert first == "%s %s %s" % (cls.__name__, name, name), r.stdout
    assert says in detail
