"""mempool.torch without PyTorch: a clear error, nothing installed."""
import importlib.util
import os

import pytest

import mempool.torch


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed (tests/preload/gpu/torch_smoke.py covers it)")
def test_use_without_torch_says_what_is_missing():
    before = os.environ.get("MEMPOOL_DEVICE")
    with pytest.raises(mempool.torch.TorchUnavailable) as e:
        mempool.torch.use(device=1)
    assert "needs PyTorch" in str(e.value)
    assert isinstance(e.value, ImportError)
    assert os.environ.get("MEMPOOL_DEVICE") == before  # nothing changed
