"""torch_smoke.py - PyTorch on mempool through the pluggable allocator.

    python3 torch_smoke.py /path/to/libmempool.so

Trains a small model for a few steps with every CUDA tensor allocated by
mp_torch_malloc / mp_torch_free, then reads the default pool's statistics
through ctypes to show that the pool served them. Prints "ok ..." and exits
0; exits 77 when torch or a GPU is missing (the ctest skip code)."""
import ctypes
import sys

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skip: no GPU")
    sys.exit(77)

lib_path = sys.argv[1]
# The two lines for the README:
allocator = torch.cuda.memory.CUDAPluggableAllocator(
    lib_path, "mp_torch_malloc", "mp_torch_free")
torch.cuda.memory.change_current_allocator(allocator)

model = torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(30):
    x = torch.randn(128, 256, device="cuda")
    y = torch.randint(0, 10, (128,), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
assert torch.isfinite(loss).item(), "loss is not finite"


class Stats(ctypes.Structure):
    # mempool/stats.h, the leading fields
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "reserved_bytes", "peak_reserved_bytes", "allocated_bytes",
        "peak_allocated_bytes", "requested_bytes", "peak_requested_bytes",
        "largest_free_bytes")] + [(name, ctypes.c_uint64) for name in (
            "alloc_count", "free_count", "device_alloc_count",
            "device_free_count", "oom_count")] + [("more", ctypes.c_byte * 256)]


mp = ctypes.CDLL(lib_path)
mp.mp_default_pool.restype = ctypes.c_void_p
mp.mp_pool_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(Stats)]
stats = Stats()
assert mp.mp_pool_get_stats(mp.mp_default_pool(), ctypes.byref(stats)) == 0
assert stats.alloc_count > 0, "the pool served nothing"
print("ok loss=%.4f pool allocs=%d frees=%d peak_reserved=%d" % (
    loss.item(), stats.alloc_count, stats.free_count,
    stats.peak_reserved_bytes))
