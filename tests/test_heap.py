"""longeval.heap: freed memory handed back to the system."""

from __future__ import annotations

import pytest


def test_releasing_freed_memory_gives_the_heaps_free_pages_back() -> None:
    """What `release_freed_memory` is for, in a fresh process: 64 MB of freed 512 KiB buffers that glibc kept in its
    heap (behind one still in use) leave the process's resident memory when it runs."""
    import subprocess
    import sys

    from longeval.heap import malloc_trim

    if malloc_trim() is None:
        pytest.skip("no malloc_trim: not glibc")
    code = """
from pathlib import Path
from longeval.heap import release_freed_memory
def rss():
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) << 10
first = bytearray(600 << 10); del first  # glibc now serves buffers this size from its heap, not mmap
held = [bytearray(512 << 10) for _ in range(128)]
last = bytearray(512 << 10)  # in use, above the others: the heap cannot shrink from its top
del held
before = rss(); release_freed_memory(); print(before - rss())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 32 << 20, out.stdout  # most of the 64 MB


def test_releasing_freed_memory_gives_back_what_arrows_reading_threads_freed() -> None:
    """Arrow's default allocator (mimalloc in the wheels: a process that imported pyarrow before longeval keeps it)
    keeps what threads freed, after they are gone: such a driver that read 816 shards' metadata with a thread pool
    kept 19 MiB (benchmarks/README.md). 50 MB of Arrow buffers filled and freed by a pool's threads leave the
    process's resident memory when it runs."""
    import os
    import subprocess
    import sys

    code = """
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import numpy as np
import pyarrow as pa
from longeval.heap import release_freed_memory
def rss():
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) << 10
def fill(_):
    buffers = [pa.allocate_buffer(256 << 10) for _ in range(50)]
    for buffer in buffers:
        np.frombuffer(buffer, dtype=np.uint8)[:] = 1
with ThreadPoolExecutor(4) as pool:
    list(pool.map(fill, range(4)))
before = rss(); release_freed_memory(); print(pa.default_memory_pool().backend_name, before - rss())
"""
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}  # else inherited from a test that imported longeval
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    backend, released = out.stdout.split()
    # A third of the 50 MB at least: how much comes back varies with what else the machine runs (24 MiB in one
    # clean-clone run beside the other tests, more alone); without the release, none of it does.
    assert backend == "mimalloc" and int(released) > 16 << 20, out.stdout
