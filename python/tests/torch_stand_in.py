"""A stand-in for PyTorch's torch.cuda.memory, for tests of
mempool.torch.use() without torch: what use() would install goes to
change_current_allocator, a function of the test's. torch.device and
torch.cuda.device are stand-ins too (a type and an index; an idx), and
torch.cuda's current device is 2."""
import types


class device:
    """torch.device("cuda:1"), torch.device("cuda", 1), torch.device("cuda")."""

    def __init__(self, type, index=None):
        if ":" in type:
            type, index = type.split(":")
            index = int(index)
        self.type, self.index = type, index

    def __repr__(self):
        return "device(type=%r%s)" % (self.type, "" if self.index is None
                                      else ", index=%d" % self.index)


class cuda_device:
    """torch.cuda.device(1): the context manager, its index as idx."""

    def __init__(self, idx):
        self.idx = idx


def modules(change_current_allocator):
    """{name: module} for sys.modules: torch, torch.cuda, torch.cuda.memory."""
    torch = types.ModuleType("torch")
    torch.device = device
    torch.cuda = types.ModuleType("torch.cuda")
    torch.cuda.device = cuda_device
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 2
    torch.cuda.memory = types.ModuleType("torch.cuda.memory")
    torch.cuda.memory.CUDAPluggableAllocator = lambda *a: ("allocator", a)
    torch.cuda.memory.change_current_allocator = change_current_allocator
    return {"torch": torch, "torch.cuda": torch.cuda,
            "torch.cuda.memory": torch.cuda.memory}
