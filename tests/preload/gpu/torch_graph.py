"""torch_graph.py - torch.cuda.graph on mempool's pluggable allocator.

    python3 torch_graph.py /path/to/libmempool.so

Captures a small model's forward pass with torch.cuda.graph while every
CUDA tensor comes from mp_torch_malloc / mp_torch_free (only those two are
set: what Python allows), replays it on new inputs copied into the static
input, and compares each replay with the eager output. Checks that the
capture's memory came from a graph pool (the default pool lent it a range)
and that mempool.torch.empty_cache() gives it back once the graph is gone.
Prints "ok ..." and exits 0; exits 77 when torch or a GPU is missing (the
ctest skip code)."""
import gc

from torch_common import start

torch, mempool = start()

mempool.torch.use()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.GELU(),
    torch.nn.Linear(256, 256), torch.nn.GELU(),
    torch.nn.Linear(256, 10)).cuda().eval()
static_x = torch.randn(32, 64, device="cuda")

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(side):
    for _ in range(3):  # warm-up, as PyTorch's docs ask
        model(static_x)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
lent_before = mempool.default_pool_stats()["allocated_bytes.all.current"]

g = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(g):
    static_y = model(static_x)
torch.cuda.synchronize()

out_addr = static_y.data_ptr()
for k in range(5):
    x = torch.randn(32, 64, device="cuda")
    static_x.copy_(x)
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = model(x)
    assert static_y.data_ptr() == out_addr, "the output moved"
    err = (static_y - eager).abs().max().item()
    assert err < 1e-4, "replay %d differs from eager by %g" % (k, err)

lent = mempool.default_pool_stats()["allocated_bytes.all.current"]
assert lent > lent_before, "the capture's memory did not come from the pool"
del g, static_y
gc.collect()
# The reset sees the capture has ended and releases its graph pool.
mempool.torch.empty_cache()
after = mempool.default_pool_stats()["allocated_bytes.all.current"]
assert after < lent, "the graph's memory was not given back"
print("ok replays match eager; pool lent %d bytes during the graph, %d after"
      % (lent, after))
