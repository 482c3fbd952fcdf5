"""Context stratification (§3.2): the three subsets, and how to stack them without skewing lengths.

The paper provides, for each task, "a distribution of samples up to 32K context, a distribution of
samples up to 128K context, and a distribution of samples up to 1M context"; each measures cumulative
performance, and they "can be stacked together and normalized by bucket ... we divide by the number of
repetitions of each bucket in order to keep a similar histogram profile of the context lengths. For
instance, when considering all three subsets (32K, 128K, and 1M), we divide the 32K bucket by 3 since it
shows up three times, and the 128K bucket by 2 since it shows up twice."

The paper does not publish the histogram inside a subset (its plots start at 512 or 2K tokens). Ours:
the powers of two from `min_length` (default 4096, MRCR's smallest length) up to the subset's limit,
with the samples split evenly over them (uniform in log-length). A length's weight when subsets are
stacked is 1 / (number of stacked subsets that contain it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

SUBSETS: dict[str, int] = {"32k": 32_768, "128k": 131_072, "1m": 1_048_576}
ALL_SUBSETS: tuple[str, ...] = tuple(SUBSETS)
DEFAULT_MIN_LENGTH = 4096


def _limit(subset: str) -> int:
    try:
        return SUBSETS[subset.lower()]
    except KeyError:
        raise ValueError(f"unknown Michelangelo subset {subset!r}; known: {', '.join(SUBSETS)}") from None


def length_grid(subset: str, *, min_length: int = DEFAULT_MIN_LENGTH) -> tuple[int, ...]:
    """The target lengths of a subset: min_length, 2 x min_length, ... up to the subset's limit."""
    if min_length <= 0:
        raise ValueError(f"min_length must be positive, got {min_length}")
    lengths, length = [], min_length
    while length <= _limit(subset):
        lengths.append(length)
        length *= 2
    return tuple(lengths)


def lengths_for(subset: str, samples: int, *, min_length: int = DEFAULT_MIN_LENGTH) -> list[tuple[int, int]]:
    """(target_length, count) pairs for `samples` instances of one subset, spread evenly over its grid
    (the remainder goes to the shortest lengths, which are cheapest)."""
    grid = length_grid(subset, min_length=min_length)
    if not grid:
        return []
    base, extra = divmod(max(samples, 0), len(grid))
    counts = [base + (1 if i < extra else 0) for i in range(len(grid))]
    return [(length, count) for length, count in zip(grid, counts, strict=True) if count]


def bucket_weights(lengths: Iterable[int], subsets: Sequence[str] = ALL_SUBSETS, *,
                   min_length: int = DEFAULT_MIN_LENGTH) -> dict[int, float]:
    """§3.2's normalisation: each length's scores count 1 / (stacked subsets containing it) times.

    A length no stacked subset contains was not repeated and keeps weight 1.
    """
    limits = [_limit(s) for s in subsets]
    weights = {}
    for length in lengths:
        repeats = sum(1 for top in limits if min_length <= length <= top)
        weights[int(length)] = 1.0 / repeats if repeats else 1.0
    return weights


def pointwise_average(scores: Mapping[int, Sequence[float]]) -> list[tuple[int, float]]:
    """Mean score at each length, shortest first (weights cancel within a length)."""
    return [(int(length), sum(vals) / len(vals)) for length, vals in sorted(scores.items()) if len(vals)]


def cumulative_average(scores: Mapping[int, Sequence[float]], subsets: Sequence[str] | None = ALL_SUBSETS, *,
                       min_length: int = DEFAULT_MIN_LENGTH) -> list[tuple[int, float]]:
    """The paper's curve: at each length x, the bucket-weighted mean of every score at lengths <= x.

    Args:
        scores: per target length, the instance scores (0..1) of the stacked subsets.
        subsets: the subsets that were stacked, for the weights; None weighs every instance alike.
    """
    weights = bucket_weights(scores, subsets, min_length=min_length) if subsets else {}
    out, weighted_sum, weighted_n = [], 0.0, 0.0
    for length, vals in sorted(scores.items()):
        if not len(vals):
            continue
        w = weights.get(int(length), 1.0)
        weighted_sum += w * sum(vals)
        weighted_n += w * len(vals)
        out.append((int(length), weighted_sum / weighted_n))
    return out


def stacked_counts(lengths: Sequence[int], subsets: Sequence[str], samples: int) -> dict[int, int]:
    """Instances per length when the "up to" subsets are stacked over a suite's length grid.

    Each subset spreads `samples` evenly over the suite's lengths within its limit (the remainder to the
    shortest, as `lengths_for`); a length's count is the sum over the subsets that contain it.
    """
    counts: dict[int, int] = {int(n): 0 for n in lengths}
    for subset in subsets:
        grid = sorted(int(n) for n in lengths if n <= _limit(subset))
        if not grid:
            continue
        base, extra = divmod(max(samples, 0), len(grid))
        for i, length in enumerate(grid):
            counts[length] += base + (1 if i < extra else 0)
    return {n: c for n, c in counts.items() if c}


def stacked_weights(lengths: Sequence[int], subsets: Sequence[str]) -> dict[int, float]:
    """§3.2's normalisation over a suite's grid: 1 / (number of stacked subsets containing the length)."""
    return bucket_weights(lengths, subsets, min_length=min(lengths)) if lengths else {}
