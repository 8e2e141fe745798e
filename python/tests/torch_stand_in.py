"""A stand-in for PyTorch's torch.cuda.memory, for tests of
mempool.torch.use() without torch: what use() would install goes to
change_current_allocator, a function of the test's."""
import types


def modules(change_current_allocator):
    """{name: module} for sys.modules: torch, torch.cuda, torch.cuda.memory."""
    torch = types.ModuleType("torch")
    torch.cuda = types.ModuleType("torch.cuda")
    torch.cuda.memory = types.ModuleType("torch.cuda.memory")
    torch.cuda.memory.CUDAPluggableAllocator = lambda *a: ("allocator", a)
    torch.cuda.memory.change_current_allocator = change_current_allocator
    return {"torch": torch, "torch.cuda": torch.cuda,
            "torch.cuda.memory": torch.cuda.memory}
