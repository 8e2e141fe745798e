"""Routing PyTorch's CUDA allocations through mempool.

    import mempool.torch
    mempool.torch.use()          # before the first CUDA tensor

installs torch.cuda.memory.CUDAPluggableAllocator(libmempool.so,
"mp_torch_malloc", "mp_torch_free") (include/mempool/torch.h). The tensors
then come from mempool's default pool; mempool.default_pool_stats() reads
it. PyTorch accepts a new allocator only before it has allocated anything."""
import os

from . import _lib


class TorchUnavailable(ImportError):
    """PyTorch (with CUDA) is needed and missing."""


def use(device=None):
    """Installs mempool as PyTorch's CUDA allocator; returns the allocator.

    device: the device spec of the default pool ("cuda:1", "host", or an int
    N for "cuda:N"); None keeps $MEMPOOL_DEVICE or the library's choice. It
    is set as $MEMPOOL_DEVICE, which the default pool reads when it is made
    (on the first allocation)."""
    try:
        import torch
        from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator
    except ImportError as e:
        raise TorchUnavailable(
            "mempool.torch.use() needs PyTorch with CUDA (import torch failed: %s); "
            "without torch, use mempool.Pool directly" % e) from e
    if device is not None:
        os.environ["MEMPOOL_DEVICE"] = "cuda:%d" % device if isinstance(device, int) else str(device)
    del torch
    alloc = CUDAPluggableAllocator(_lib.library_path(), "mp_torch_malloc", "mp_torch_free")
    change_current_allocator(alloc)
    return alloc
