"""torch_common.py - what the PyTorch GPU scripts (torch_smoke.py,
torch_graph.py) start with: exit 77 (the ctest skip code) without torch or
a GPU, then the mempool package of this checkout on the library given as
the first argument. Returns (torch, mempool)."""
import os
import sys


def start():
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("skip: no GPU")
        sys.exit(77)
    os.environ["MEMPOOL_LIBRARY"] = sys.argv[1]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "..", "python"))
    import mempool
    import mempool.torch  # noqa: F401
    return torch, mempool
