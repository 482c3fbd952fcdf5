"""Paired comparison of two runs on the same instances: is model B better than model A, and by how much?

Two models scored on the same instances are compared pair by pair, which is far more sensitive than comparing
two means: the instance difficulty cancels out. Instances are content-hashed (task parameters, seed, length,
index, tokenizer, prompt format, data), so two runs of one suite with the same seed and tokenizer share their
`instance_id`s and are matched on them; anything else matches nothing, and `compare_scores` says so.

Per family × task × length, and pooled per family (`task = "overall"`):
- `mean_a`, `mean_b`: mean scores ×100 over the matched instances (failed rows count 0, as everywhere);
- `diff` = mean_b − mean_a (×100);
- `ci_low`, `ci_high`: a paired percentile bootstrap 95 % interval of the difference (pairs resampled with
  replacement, 10,000 resamples by default, a seeded `numpy.random.Generator` per row, so deterministic);
- `p_value`: two-sided, from an exact McNemar test when every score of the row is 0 or 1 (a binomial sign
  test on the discordant pairs, `scipy.stats.binomtest`) and from a paired permutation test otherwise (random
  sign flips of the differences; exact enumeration up to 16 non-zero differences). `test` names the one used.

The bootstrap and the permutation test are our own rather than `scipy.stats.bootstrap` and
`scipy.stats.permutation_test`, deliberately (tests/stats/test_compare.py checks they agree with scipy's):
- speed on large rows: a pooled row has tens of thousands of pairs. With few distinct differences (0/1 scores
  have at most three) a resample's mean only depends on how often each value was drawn, so we draw those
  counts from a multinomial: 3 ms for 40,000 binary pairs × 10,000 resamples where scipy's bootstrap, which
  draws every index, takes 4 s. Our Monte Carlo permutation test multiplies a ±1 `int8` sign matrix by the
  differences: 1.7 s for 20,000 pairs × 10,000 resamples where scipy's, which permutes a stacked float
  array of (d, −d), takes 24 s. Both are drawn in chunks so memory stays bounded.
- exact symmetry: both resample the sorted differences in a canonical orientation (`_canonical`), so
  swapping A and B negates the interval exactly and the order of the pairs does not matter.
- ties: the permutation test counts a sign pattern whose |sum| equals the observed one up to 1e-9 of the
  summed |differences|; scipy's tolerance is relative to the observed statistic, so when that sum is 0 in
  exact arithmetic (common for scores on a 0.1 grid) float rounding loses ties and p drops below 1.
- the Monte Carlo p-value is (1 + #{|sum| ≥ observed}) / (1 + resamples), never 0; scipy's two-sided one
  is twice the smaller one-sided estimate, equal in exact mode but noisier by Monte Carlo.

p-values are per row and not adjusted for multiple comparisons: read many small p-values across rows as
evidence, one small p-value among eighty rows as chance.

Everything here is a pure function of its inputs; reading run roots is the caller's business.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import stats

from longeval.errors import LongevalError

__all__ = [
    "COMPARISON_SCHEMA",
    "MCNEMAR",
    "PERMUTATION",
    "CompareError",
    "Comparison",
    "Matched",
    "PairedDiff",
    "compare_scores",
    "match_scores",
    "mcnemar_exact",
    "paired_bootstrap_ci",
    "paired_difference",
    "permutation_test",
]

MCNEMAR = "mcnemar"
"""Exact two-sided McNemar test (a sign test on the discordant pairs), for 0/1 scores."""
PERMUTATION = "permutation"
"""Two-sided paired permutation test (random sign flips of the differences), for continuous scores."""

OVERALL = "overall"
_EXACT_PERMUTATION_MAX = 16  # 2**16 sign patterns enumerated exactly; beyond, Monte Carlo
_MULTINOMIAL_MAX_VALUES = 256  # few distinct differences: resample their counts instead of the pairs
_CHUNK_ELEMENTS = 2_000_000  # resamples are drawn in chunks so memory stays bounded for large rows
_KEYS = ("instance_id", "family", "task", "target_length", "score")

COMPARISON_SCHEMA = pa.schema([
    ("family", pa.string()), ("task", pa.string()), ("target_length", pa.int64()), ("n", pa.int64()),
    ("mean_a", pa.float64()), ("mean_b", pa.float64()), ("diff", pa.float64()), ("ci_low", pa.float64()),
    ("ci_high", pa.float64()), ("p_value", pa.float64()), ("test", pa.string()),
])
"""One row per family × task × length, then a pooled `overall` row per family (`target_length` null)."""


class CompareError(LongevalError):
    """Two runs cannot be compared (no instance in common, or no scores)."""


@dataclass(frozen=True)
class PairedDiff:
    """The paired comparison of one group; means, difference and interval ×100 (2 decimals)."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    test: str


@dataclass(frozen=True)
class Matched:
    """The score pairs of the instances both runs scored, and how many each run had."""

    pairs: pa.Table
    """Columns `instance_id, family, task, target_length, score_a, score_b` (0..1, failures as 0)."""
    n_a: int
    n_b: int

    @property
    def n(self) -> int:
        return self.pairs.num_rows

    def describe(self) -> str:
        """One line for people: how many matched, how many were left out on each side."""
        return (f"matched {self.n} instance(s) by instance_id: {self.n_a - self.n} of A's {self.n_a} and "
                f"{self.n_b - self.n} of B's {self.n_b} have no partner and are left out")


@dataclass(frozen=True)
class Comparison:
    """`compare_scores`' result: the table (`COMPARISON_SCHEMA`) and the matching it rests on."""

    table: pa.Table
    matched: Matched
    resamples: int
    seed: int


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Scores as float64 with nulls and NaNs as 0: a failed row scores 0 and stays in, as in the summaries."""
    array = np.asarray(values, dtype=np.float64)
    return np.nan_to_num(array, nan=0.0, posinf=0.0, neginf=0.0)


def _canonical(d: np.ndarray) -> tuple[np.ndarray, int]:
    """The sorted differences in an orientation both A−B and B−A map to, and the sign that maps back.

    Resampling the canonical array makes swapping A and B negate the interval exactly (the same draws are
    used, only the sign changes) and makes the result independent of the order of the pairs. Sign 0 marks
    a symmetric set of differences (d and −d are the same multiset): its bootstrap is symmetrised.
    """
    v = np.sort(d)
    w = -v[::-1]
    differ = np.flatnonzero(v != w)
    if differ.size == 0:
        return v, 0
    i = differ[0]
    return (v, 1) if v[i] < w[i] else (w, -1)


def _bootstrap_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `resamples` bootstrap samples of `values` (vectorised, chunked to bound memory)."""
    n = values.size
    distinct, counts = np.unique(values, return_counts=True)
    if distinct.size <= _MULTINOMIAL_MAX_VALUES:
        # The mean of a resample only depends on how often each distinct value was drawn: draw those counts.
        drawn = rng.multinomial(n, counts / n, size=resamples)
        return drawn @ distinct / n
    chunk = max(1, _CHUNK_ELEMENTS // n)
    out = np.empty(resamples)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        out[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return out


def paired_bootstrap_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                        resamples: int = 10_000, rng: np.random.Generator, level: float = 0.95
                        ) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(b − a) over pairs, on the scores' own scale (0..1).

    Pairs are resampled together, so what the two models share (an instance's difficulty) stays paired.
    """
    a, b = _clean(a), _clean(b)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"need two non-empty score arrays of one length, got {a.size} and {b.size}")
    values, sign = _canonical(b - a)
    means = _bootstrap_means(values, resamples, rng)
    tail = (1.0 - level) / 2
    if sign == 0:  # the differences are symmetric about 0, so is their bootstrap: use both halves
        high = float(np.quantile(np.concatenate([means, -means]), 1.0 - tail))
        return -high, high
    low, high = (float(q) for q in np.quantile(means, [tail, 1.0 - tail]))
    return (low, high) if sign > 0 else (-high, -low)


def mcnemar_exact(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Exact two-sided McNemar p-value for paired 0/1 scores: a binomial(k, 1/2) test on the k pairs that
    disagree, since pairs where both models are right (or both wrong) say nothing about which is better."""
    a, b = _clean(a), _clean(b)
    only_a = int(np.sum((a == 1) & (b == 0)))
    only_b = int(np.sum((a == 0) & (b == 1)))
    if only_a + only_b == 0:
        return 1.0
    # The smaller count first, so swapping A and B gives the same p-value to the last bit.
    return float(stats.binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue)


def permutation_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                     resamples: int = 10_000, rng: np.random.Generator) -> float:
    """Two-sided paired permutation p-value: under "no difference" each pair's difference is as likely
    negative as positive, so flip signs at random and count how often |sum| reaches the observed one.

    Exact (every sign pattern) with at most 16 non-zero differences; otherwise `resamples` random patterns
    and the (1 + hits) / (1 + resamples) estimate, which is never 0.
    """
    values, _ = _canonical(_clean(b) - _clean(a))
    z = values[values != 0]
    k = z.size
    if k == 0:
        return 1.0
    observed = abs(z.sum())
    tol = 1e-9 * max(1.0, float(np.abs(z).sum()))
    if k <= _EXACT_PERMUTATION_MAX:
        signs = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1) * 2 - 1
        return float(np.mean(np.abs(signs @ z) >= observed - tol))
    hits, chunk = 0, max(1, _CHUNK_ELEMENTS // k)
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        signs = rng.integers(0, 2, size=(size, k), dtype=np.int8) * 2 - 1
        hits += int(np.sum(np.abs(signs @ z) >= observed - tol))
    return (1 + hits) / (1 + resamples)


def _is_binary(values: np.ndarray) -> bool:
    return bool(np.all((values == 0) | (values == 1)))


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                      resamples: int = 10_000, seed: int = 0, key: str = "") -> PairedDiff:
    """Means, difference (b − a), bootstrap interval and p-value of paired scores (0..1), reported ×100.

    The random generator is seeded with (`seed`, a hash of `key`), so each row of a comparison gets its own
    stream and a row's result does not depend on which other rows were compared.
    """
    a, b = _clean(a), _clean(b)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"need two non-empty score arrays of one length, got {a.size} and {b.size}")
    rng = np.random.default_rng([seed, zlib.crc32(key.encode("utf-8"))])
    low, high = paired_bootstrap_ci(a, b, resamples=resamples, rng=rng)
    if _is_binary(a) and _is_binary(b):
        test, p = MCNEMAR, mcnemar_exact(a, b)
    else:
        test, p = PERMUTATION, permutation_test(a, b, resamples=resamples, rng=rng)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    return PairedDiff(n=int(a.size), mean_a=_pct(mean_a), mean_b=_pct(mean_b), diff=_pct(mean_b - mean_a),
                      ci_low=_pct(low), ci_high=_pct(high), p_value=p, test=test)


def _pct(x: float) -> float:
    return round(100.0 * x, 2) + 0.0  # + 0.0 turns -0.0 into 0.0


def match_scores(a: pa.Table, b: pa.Table) -> Matched:
    """Pair two runs' score rows by `instance_id` (the first row of an id on each side), in A's order.

    Args:
        a, b: score tables with at least `instance_id, family, task, target_length, score`.
    """
    for name, table in (("A", a), ("B", b)):
        missing = [c for c in _KEYS if c not in table.column_names]
        if missing:
            raise CompareError(f"the scores of {name} lack column(s) {', '.join(missing)}; "
                               "rescore that run root with `longeval score` and its overrides")
    a, b = _first_per_id(a), _first_per_id(b)
    where = pc.index_in(a["instance_id"], value_set=b["instance_id"])
    found = pc.is_valid(where)
    left, right = a.filter(found), b.take(where.filter(found))
    pairs = pa.table({
        "instance_id": left["instance_id"], "family": left["family"], "task": left["task"],
        "target_length": left["target_length"].cast(pa.int64()),
        "score_a": _clean(left["score"].to_numpy(zero_copy_only=False)),
        "score_b": _clean(right["score"].to_numpy(zero_copy_only=False)),
    })
    return Matched(pairs=pairs, n_a=a.num_rows, n_b=b.num_rows)


def _first_per_id(table: pa.Table) -> pa.Table:
    ids = table["instance_id"].to_pylist()
    first: dict[str, int] = {}
    for i, iid in enumerate(ids):
        first.setdefault(iid, i)
    if len(first) == len(ids):
        return table
    return table.take(pa.array(sorted(first.values()), pa.int64()))


def no_match_message(n_a: int, n_b: int, provenance: Mapping[str, tuple[object, object]] | None = None,
                     names: tuple[str, str] = ("A", "B")) -> str:
    """Why two runs share no instance, naming the settings that differ when the caller knows them."""
    a, b = names
    text = (f"no instance in common between {a} ({n_a} scores) and {b} ({n_b} scores). Instance ids hash each "
            "instance's content: task parameters, seed, length, index, tokenizer, prompt format (chat template, "
            "answer prefix, system prompt, reasoning) and data files, so two runs share them only when all of "
            "these agree; two models with different tokenizers never do")
    differ = [f"{key} {was!r} vs {now!r}" for key, (was, now) in (provenance or {}).items() if was != now]
    if differ:
        text += ". Here they differ in: " + "; ".join(differ)
    return text + (". Evaluate B with A's suite, seed and prompt format on a model with the same tokenizer, "
                   "or compare the summaries side by side with `longeval report A B -o report.html`")


def compare_scores(a: pa.Table, b: pa.Table, *, resamples: int = 10_000, seed: int = 0,
                   provenance: Mapping[str, tuple[object, object]] | None = None,
                   names: tuple[str, str] = ("A", "B")) -> Comparison:
    """The paired comparison of B against A per family × task × length, plus a pooled row per family.

    Args:
        a, b: score tables (`SCORE_SCHEMA` or at least `instance_id, family, task, target_length, score`).
        resamples: bootstrap (and Monte Carlo permutation) resamples per row.
        seed: the base seed; each row derives its own generator from it.
        provenance: settings of both runs that decide instance ids, `{key: (a's, b's)}`, only used to
            explain an empty match.
        names: how to call the runs in messages.

    Raises:
        CompareError: no instance is in both runs (the message says why that happens and what differs).
    """
    if resamples < 1:
        raise CompareError(f"resamples must be at least 1, got {resamples}")
    matched = match_scores(a, b)
    if matched.n == 0:
        raise CompareError(no_match_message(a.num_rows, b.num_rows, provenance, names))
    rows = matched.pairs.to_pydict()
    groups: dict[tuple[str, str, int | None], list[int]] = {}
    for i, (family, task, length) in enumerate(zip(rows["family"], rows["task"], rows["target_length"], strict=True)):
        groups.setdefault((family, task, length), []).append(i)
        groups.setdefault((family, OVERALL, None), []).append(i)
    score_a, score_b = np.asarray(rows["score_a"]), np.asarray(rows["score_b"])
    out = []
    for family, task, length in sorted(groups, key=lambda k: (k[0], k[1] == OVERALL, k[1], k[2] or 0)):
        index = np.asarray(groups[(family, task, length)])
        result = paired_difference(score_a[index], score_b[index], resamples=resamples, seed=seed,
                                   key=f"{family}/{task}/{length}")
        out.append({"family": family, "task": task, "target_length": length, **result.__dict__})
    return Comparison(table=pa.Table.from_pylist(out, schema=COMPARISON_SCHEMA), matched=matched,
                      resamples=resamples, seed=seed)
