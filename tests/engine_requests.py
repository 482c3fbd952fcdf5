"""Requests for engine tests that watch what the engine keeps."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

from longeval.engines.vllm_engine import Request


def requests_that_report_their_predecessors(n: int, alive: list[int]) -> Iterator[Request]:
    """`n` requests; before making each, records how many earlier ones anything still holds."""
    refs: list[weakref.ref] = []

    def make(i: int) -> Request:
        gc.collect()
        alive.append(sum(ref() is not None for ref in refs))
        request = Request(f"instance-{i}", [1, 2, 3, 4 + i], 2, ("42",))
        refs.append(weakref.ref(request))
        return request

    for i in range(n):
        yield make(i)

