import os
import sys

import pytest

# The package under test is the one in this checkout, not an installed copy.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mempool  # noqa: E402


@pytest.fixture
def device():
    d = mempool.Device("host:capacity=64M")
    yield d
    d.close()


@pytest.fixture
def pool(device):
    p = mempool.Pool(device, "max_bytes=32M")
    yield p
    p.destroy()
