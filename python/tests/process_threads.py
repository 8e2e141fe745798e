"""The process's threads (/proc/self/task), for the tests that tell a host
device's stream workers (a thread each) made and gone."""
import os
import time


def tasks():
    """The ids of the process's threads now."""
    return set(os.listdir("/proc/self/task"))


def left_since(before, timeout=30):
    """The threads not in `before` that are still listed after waiting
    (`timeout` seconds at most) for them to go. A thread the library has
    joined can stay listed a moment after the join returns (the kernel
    wakes the joiner when it clears the thread's id, and unlists the thread
    later in its exit), so a count taken right after a close was one too
    many now and then on a loaded machine. A device left open keeps its
    workers for good, which this still tells."""
    deadline = time.monotonic() + timeout
    while True:
        left = tasks() - before
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)
