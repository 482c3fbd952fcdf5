"""Handing memory a process freed back to the system, for the processes that build or hold long prompts and
the driver that reads a stage's metadata.

glibc serves a big buffer from its heap once a buffer of that size has been freed before, and keeps what such
buffers free: a process that handles one long prompt after another keeps the high-water mark of all of them, not
of the one it holds now. Arrow's default allocator (mimalloc in the wheels, which `import longeval` replaces with
the C library's unless pyarrow was imported first or the environment chose it) keeps what the threads that read a
stage freed in their heaps, after those threads are gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import pyarrow as pa


def release_freed_memory() -> None:
    """Hand the free pages of Arrow's allocator and of the C heap back to the system (`malloc_trim` on glibc).

    Measured: a replica of a long-prompt pool peaked at its window plus what the window before it left in the
    heap; a generation actor kept about 150 MiB after each shard of ten 1M-token prompts; a process on mimalloc
    that read the metadata of 816 shards kept 19 MiB in Arrow's heaps (benchmarks/README.md)."""
    pa.default_memory_pool().release_unused()
    trim = malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS): then only Arrow's pool is
    released."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None
