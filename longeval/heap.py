"""Handing memory a process freed back to the system, for the processes that build or hold long prompts.

glibc serves a big buffer from its heap once a buffer of that size has been freed before, and keeps what such
buffers free: a process that handles one long prompt after another keeps the high-water mark of all of them, not
of the one it holds now.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; nothing elsewhere).

    Measured: a replica of a long-prompt pool peaked at its window plus what the window before it left in the
    heap; a generation actor kept about 150 MiB after each shard of ten 1M-token prompts (benchmarks/README.md)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None
