"""Gold paragraphs at the user's depths (TAIL §3.2, Algorithm 1 line 2) and the fall-back to a preceding segment.

A depth d in [0, 1] picks the segment that holds word `floor(d * words)` of the composed document (the reference
does the same in tokens). When a gold paragraph yields no question that passes the checks after five attempts,
the paper replaces it with the preceding text chunk: `previous_segment`. Two depths never share a gold segment.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Iterable, Sequence
from itertools import accumulate

from longeval.errors import ConfigError, DataFileError

DEFAULT_DEPTHS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))
"""§4.1: 5 % to 95 % in steps of 5 %."""


def check_depths(depths: Iterable[float], *, key: str = "suite.params.tail.depths") -> tuple[float, ...]:
    """Depths as fractions in [0, 1], without repeats; a percent value (e.g. 50) is a ConfigError saying so."""
    values = tuple(float(d) for d in depths)
    if not values:
        raise ConfigError(f"{key} is empty; give depths as fractions, e.g. [0.05, 0.5, 0.95]")
    bad = [d for d in values if not 0.0 <= d <= 1.0]
    if bad:
        raise ConfigError(f"{key}: {', '.join(map(repr, bad))} not in [0, 1]; depths are fractions (0.05 = 5 %)")
    if len(set(values)) != len(values):
        raise ConfigError(f"{key} repeats a depth: {list(values)}")
    return values


def segment_at_depth(word_counts: Sequence[int], depth: float) -> int:
    """The index of the segment holding the word at `depth` of the document (depth 1.0 gives the last segment)."""
    total = sum(word_counts)
    if total <= 0:
        raise ValueError("a document without words has no depths")
    position = min(int(depth * total), total - 1)
    starts = list(accumulate(word_counts, initial=0))[:-1]
    return bisect_right(starts, position) - 1


def previous_segment(segment: int, *, taken: Collection[int] = ()) -> int | None:
    """The nearest segment before `segment` that is not `taken`, or None when there is none (Algorithm 1's fall-back).

    `taken` holds the gold segments of the other depths and those already given up on, so the fall-back never
    lands on a paragraph that has (or had) its own question.
    """
    return next((i for i in range(segment - 1, -1, -1) if i not in taken), None)


def initial_segments(word_counts: Sequence[int], depths: Sequence[float], *, domain: str = "") -> tuple[int, ...]:
    """The gold segment of each depth, in the order given; a depth whose segment is taken moves to a free neighbour
    (preceding first, as the fall-back does). More depths than segments is a DataFileError naming the domain."""
    if len(depths) > len(word_counts):
        raise DataFileError(
            f"TAIL domain {domain!r} has {len(word_counts)} segment(s) ({sum(word_counts)} words), too few for "
            f"{len(depths)} depths; add documents to the domain or ask for fewer depths"
        )
    chosen: list[int] = []
    for depth in depths:
        index = segment_at_depth(word_counts, depth)
        if index in chosen:
            before = previous_segment(index, taken=chosen)
            index = before if before is not None else next(i for i in range(index + 1, len(word_counts))
                                                            if i not in chosen)
        chosen.append(index)
    return tuple(chosen)
