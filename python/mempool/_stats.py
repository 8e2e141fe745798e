"""mp_stats_t (include/mempool/stats.h) in ctypes, and its dictionary views.

This is the one Python declaration of the struct; tests/test_stats_layout.py
checks its field names, order, offsets and size against the C header, so a
header change without a change here fails the suite."""
import ctypes

_S = ctypes.c_size_t
_U = ctypes.c_uint64


class Stats(ctypes.Structure):
    _fields_ = [
        ("reserved_bytes", _S), ("peak_reserved_bytes", _S),
        ("allocated_bytes", _S), ("peak_allocated_bytes", _S),
        ("requested_bytes", _S), ("peak_requested_bytes", _S),
        ("largest_free_bytes", _S),
        ("alloc_count", _U), ("free_count", _U),
        ("device_alloc_count", _U), ("device_free_count", _U),
        ("oom_count", _U),
        # Appended fields.
        ("free_bytes", _S), ("segment_count", _S),
        ("live_blocks", _U), ("free_blocks", _U),
        ("defrag_count", _U), ("moved_bytes", _U),
        ("alloc_retry_count", _U),
        ("struct_size", _S),  # the bytes the library wrote (stats.h "Growing")
    ]


# torch.cuda.memory_stats() key -> mp_stats_t field, only where the two mean
# the same thing (PyTorch's meanings: the docstring of
# torch.cuda.memory_stats); the C library's mp_pool_dump(..., "torch")
# writes the same keys (a test compares them) plus inactive_split*, which
# need a walk of the pool. Keys PyTorch has and mempool cannot say
# (active_*, the per-pool small_pool/large_pool splits) are left out
# rather than guessed.
TORCH_KEYS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "allocated_bytes.all.peak": "peak_allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
    "requested_bytes.all.current": "requested_bytes",
    "requested_bytes.all.peak": "peak_requested_bytes",
    "allocation.all.current": "live_blocks",
    "allocation.all.allocated": "alloc_count",
    "allocation.all.freed": "free_count",
    "segment.all.current": "segment_count",
    "num_device_alloc": "device_alloc_count",
    "num_device_free": "device_free_count",
    "num_ooms": "oom_count",
    "num_alloc_retries": "alloc_retry_count",
}


def to_dict(s):
    """PyTorch's keys (TORCH_KEYS) and every mp_stats_t field by its own name."""
    own = {name: int(getattr(s, name)) for name, _ in Stats._fields_}
    out = {k: own[v] for k, v in TORCH_KEYS.items()}
    out.update(own)
    return out
