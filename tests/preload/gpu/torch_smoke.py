"""torch_smoke.py - PyTorch on mempool through the pluggable allocator.

    python3 torch_smoke.py /path/to/libmempool.so

Trains a small model for a few steps with every CUDA tensor allocated by
mp_torch_malloc / mp_torch_free, then reads the default pool's statistics
through the mempool Python package (python/) to show that the pool served
them. Prints "ok ..." and exits
0; exits 77 when torch or a GPU is missing (the ctest skip code)."""
from torch_common import start

torch, mempool = start()

# Equivalent to torch.cuda.memory.CUDAPluggableAllocator(lib_path,
# "mp_torch_malloc", "mp_torch_free") and change_current_allocator.
mempool.torch.use()

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


stats = mempool.default_pool_stats()
assert stats["allocation.all.allocated"] > 0, "the pool served nothing"
print("ok loss=%.4f pool allocs=%d frees=%d peak_reserved=%d" % (
    loss.item(), stats["allocation.all.allocated"],
    stats["allocation.all.freed"], stats["reserved_bytes.all.peak"]))
