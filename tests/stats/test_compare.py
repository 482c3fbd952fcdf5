"""Paired comparison statistics: known values, and properties that must hold for any scores."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from longeval.stats.compare import (
    COMPARISON_SCHEMA,
    MCNEMAR,
    PERMUTATION,
    CompareError,
    compare_scores,
    match_scores,
    mcnemar_exact,
    paired_bootstrap_ci,
    paired_difference,
    permutation_test,
)

binary = st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=60)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_subnormal=False)


@st.composite
def pairs(draw, *, continuous: bool | None = None) -> tuple[list[float], list[float]]:
    """Two equally long score lists, binary or in [0, 1]."""
    kind = draw(st.booleans()) if continuous is None else continuous
    n = draw(st.integers(min_value=1, max_value=50))
    values = unit if kind else st.sampled_from([0.0, 1.0])
    return draw(st.lists(values, min_size=n, max_size=n)), draw(st.lists(values, min_size=n, max_size=n))


FAST = settings(max_examples=60, deadline=None)


def _scores(rows: list[tuple[str, str, int, float]], *, family: str = "ruler") -> pa.Table:
    return pa.table({
        "instance_id": [r[0] for r in rows], "family": [family] * len(rows), "task": [r[1] for r in rows],
        "target_length": pa.array([r[2] for r in rows], pa.int64()), "score": [r[3] for r in rows],
    })


# -- properties -------------------------------------------------------------------------------------


@FAST
@given(pairs())
def test_identical_runs_differ_by_nothing(data) -> None:
    a, _ = data
    result = paired_difference(a, a, resamples=500)
    assert result.diff == 0.0
    assert result.ci_low == result.ci_high == 0.0
    assert result.p_value == 1.0


@FAST
@given(pairs(), st.integers(min_value=0, max_value=2**32 - 1))
def test_swapping_a_and_b_negates_the_difference_and_its_interval(data, seed) -> None:
    a, b = data
    ab = paired_difference(a, b, resamples=300, seed=seed, key="t")
    ba = paired_difference(b, a, resamples=300, seed=seed, key="t")
    assert ba.diff == -ab.diff
    assert (ba.ci_low, ba.ci_high) == (-ab.ci_high, -ab.ci_low)
    assert ba.p_value == ab.p_value
    assert (ba.mean_a, ba.mean_b) == (ab.mean_b, ab.mean_a)


@FAST
@given(pairs())
def test_interval_is_ordered_and_inside_the_range_of_differences(data) -> None:
    a, b = data
    d = 100 * (np.asarray(b) - np.asarray(a))
    result = paired_difference(a, b, resamples=300)
    assert result.ci_low <= result.ci_high
    assert d.min() - 0.01 <= result.ci_low and result.ci_high <= d.max() + 0.01
    assert 0.0 < result.p_value <= 1.0


@FAST
@given(pairs(), st.randoms(use_true_random=False))
def test_the_order_of_the_pairs_does_not_matter(data, rnd) -> None:
    a, b = data
    order = list(range(len(a)))
    rnd.shuffle(order)
    shuffled = paired_difference([a[i] for i in order], [b[i] for i in order], resamples=300, seed=3)
    assert shuffled == paired_difference(a, b, resamples=300, seed=3)


@FAST
@given(pairs(continuous=False))
def test_binary_scores_use_mcnemar_and_continuous_ones_the_permutation_test(data) -> None:
    a, b = data
    assert paired_difference(a, b, resamples=100).test == MCNEMAR
    assert paired_difference([*a, 0.5], [*b, 0.25], resamples=100).test == PERMUTATION


def test_the_same_seed_gives_the_same_result_and_another_seed_may_not() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random(200), rng.random(200)
    first = paired_difference(a, b, seed=1, resamples=2000)
    assert paired_difference(a, b, seed=1, resamples=2000) == first
    assert paired_bootstrap_ci(a, b, rng=np.random.default_rng(5), resamples=2000) != \
        paired_bootstrap_ci(a, b, rng=np.random.default_rng(6), resamples=2000)


# -- known values -----------------------------------------------------------------------------------


def test_mcnemar_is_the_exact_binomial_test_on_discordant_pairs() -> None:
    # 10 pairs only A got right, 2 only B got right, 5 both right: p = 2 * P(X <= 2), X ~ Bin(12, 1/2)
    a = [1] * 10 + [0] * 2 + [1] * 5
    b = [0] * 10 + [1] * 2 + [1] * 5
    assert mcnemar_exact(a, b) == pytest.approx(2 * (1 + 12 + 66) / 2**12)
    assert mcnemar_exact([1, 0], [0, 1]) == 1.0  # balanced: capped at 1
    assert mcnemar_exact([1, 1], [1, 1]) == 1.0  # no discordant pair


def test_mcnemar_stays_finite_for_large_samples() -> None:
    a = np.array([1] * 15_200 + [0] * 14_800)
    b = 1 - a
    p = mcnemar_exact(a, b)
    assert 0.01 < p < 0.05  # z = 400 / sqrt(30000) = 2.31, two-sided 0.021


def test_permutation_test_is_exact_for_few_differences() -> None:
    # four equal positive differences: only all-plus and all-minus reach |sum| -> 2 / 16
    assert permutation_test([0.0] * 4, [0.1] * 4, rng=np.random.default_rng(0)) == 0.125
    assert permutation_test([0.3, 0.3], [0.3, 0.3], rng=np.random.default_rng(0)) == 1.0


def test_permutation_test_by_monte_carlo_is_never_zero() -> None:
    p = permutation_test([0.0] * 40, [0.1] * 40, resamples=1000, rng=np.random.default_rng(0))
    assert p == 1 / 1001


def test_bootstrap_interval_of_a_constant_difference_is_that_difference() -> None:
    low, high = paired_bootstrap_ci([0.2, 0.4, 0.6], [0.3, 0.5, 0.7], rng=np.random.default_rng(0))
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)


def test_bootstrap_interval_is_close_to_the_normal_one_for_a_large_sample() -> None:
    rng = np.random.default_rng(11)
    a = (rng.random(4000) < 0.6).astype(float)
    b = np.where(rng.random(4000) < 0.8, a, 1 - a)
    d = b - a
    half = 1.96 * d.std(ddof=1) / np.sqrt(d.size)
    low, high = paired_bootstrap_ci(a, b, rng=rng)
    assert low == pytest.approx(d.mean() - half, abs=0.004)
    assert high == pytest.approx(d.mean() + half, abs=0.004)


def test_large_rows_are_fast() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, 40_000), rng.integers(0, 2, 40_000)
    c, d = rng.random(3_000), rng.random(3_000)
    start = time.perf_counter()
    paired_difference(a, b)
    paired_difference(c, d, resamples=2_000)
    assert time.perf_counter() - start < 5.0


# -- agreement with scipy (ours is kept for speed and exact symmetry: see the module docstring) ---------


def _scipy_permutation_p(a, b, resamples: float) -> float:
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    d = d[d != 0]
    return stats.permutation_test((d,), lambda x, axis: np.sum(x, axis=axis), permutation_type="samples",
                                  vectorized=True, n_resamples=resamples, rng=np.random.default_rng(0)).pvalue


@pytest.mark.parametrize("seed", range(6))
def test_exact_permutation_p_is_scipys(seed) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 15))
    quarters = seed % 2 == 0  # differences on a binary grid (exact sums, many ties) or continuous
    a = rng.integers(0, 5, n) / 4 if quarters else rng.random(n)
    b = rng.integers(0, 5, n) / 4 if quarters else rng.random(n)
    if np.count_nonzero(b - a) < 2:
        b = b.copy()
        b[:2] = a[:2] + 0.25
    ours = permutation_test(a, b, rng=np.random.default_rng(0))
    assert ours == pytest.approx(_scipy_permutation_p(a, b, np.inf), abs=1e-12)


def test_monte_carlo_permutation_p_is_close_to_scipys() -> None:
    rng = np.random.default_rng(4)
    a = rng.random(60)
    b = np.clip(a + rng.normal(0.04, 0.2, 60), 0, 1)
    ours = permutation_test(a, b, resamples=20_000, rng=np.random.default_rng(1))
    assert 0.01 < ours < 0.9  # a p-value that Monte Carlo noise could move
    assert ours == pytest.approx(_scipy_permutation_p(a, b, 20_000), abs=0.015)


def test_permutation_p_counts_float_ties_scipy_loses() -> None:
    # equal means on a 0.1 grid: the differences sum to 0 exactly, so every sign pattern reaches it
    a = [0.6, 0.3, 0.6, 0.8, 0.5, 0.5, 0.9, 0.8, 0.8, 0.7]
    b = [0.9, 1.0, 0.9, 0.5, 0.5, 0.9, 0.1, 0.9, 0.2, 0.6]
    assert permutation_test(a, b, rng=np.random.default_rng(0)) == 1.0


@pytest.mark.parametrize(("n", "binary"), [(50, True), (400, True), (80, False), (500, False)])
def test_bootstrap_interval_is_close_to_scipys(n, binary) -> None:
    rng = np.random.default_rng(n)
    a = rng.integers(0, 2, n).astype(float) if binary else rng.random(n)
    b = np.where(rng.random(n) < 0.7, a, rng.integers(0, 2, n) if binary else rng.random(n))
    ours = paired_bootstrap_ci(a, b, resamples=20_000, rng=np.random.default_rng(2))
    theirs = stats.bootstrap((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), paired=True, vectorized=True,
                             method="percentile", n_resamples=20_000, rng=np.random.default_rng(3))
    width = theirs.confidence_interval.high - theirs.confidence_interval.low
    assert width > 0
    assert ours == pytest.approx(tuple(theirs.confidence_interval), abs=0.03 * width + 1e-3)


def test_empty_or_unequal_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        paired_difference([], [])
    with pytest.raises(ValueError, match="one length"):
        paired_difference([1.0], [1.0, 0.0])


# -- matching and the table -------------------------------------------------------------------------


def test_match_pairs_rows_by_instance_id_and_counts_the_rest() -> None:
    a = _scores([("x", "vt", 4096, 1.0), ("y", "vt", 4096, 0.0), ("z", "vt", 4096, 1.0)])
    b = _scores([("y", "vt", 4096, 1.0), ("x", "vt", 4096, None), ("w", "vt", 4096, 1.0), ("x", "vt", 4096, 1.0)])
    matched = match_scores(a, b)
    assert matched.pairs["instance_id"].to_pylist() == ["x", "y"]
    assert matched.pairs["score_a"].to_pylist() == [1.0, 0.0]
    assert matched.pairs["score_b"].to_pylist() == [0.0, 1.0]  # a null score is a failure: 0; first row of "x"
    assert (matched.n, matched.n_a, matched.n_b) == (2, 3, 3)
    assert "matched 2" in matched.describe() and "1 of A's 3" in matched.describe()


def test_compare_gives_a_row_per_task_and_length_and_an_overall_row_per_family() -> None:
    rows = [(f"{t}{n}{i}", t, n, float(i % 2)) for t in ("vt", "cwe") for n in (4096, 8192) for i in range(6)]
    a = _scores(rows)
    b = _scores([(iid, t, n, 1.0) for iid, t, n, _ in rows])
    result = compare_scores(a, b, resamples=500, seed=1)
    table = result.table
    assert table.schema == COMPARISON_SCHEMA
    keys = [(r["task"], r["target_length"]) for r in table.to_pylist()]
    assert keys == [("cwe", 4096), ("cwe", 8192), ("vt", 4096), ("vt", 8192), ("overall", None)]
    overall = table.to_pylist()[-1]
    assert (overall["n"], overall["mean_a"], overall["mean_b"], overall["diff"]) == (24, 50.0, 100.0, 50.0)
    assert overall["ci_low"] > 0 and overall["p_value"] < 0.001 and overall["test"] == MCNEMAR
    assert compare_scores(a, b, resamples=500, seed=1).table.equals(table)  # deterministic


def test_no_shared_instance_is_an_error_that_says_why() -> None:
    a = _scores([("x", "vt", 4096, 1.0)])
    b = _scores([("y", "vt", 4096, 1.0)])
    with pytest.raises(CompareError) as err:
        compare_scores(a, b, provenance={"tokenizer_fingerprint": ("aaa", "bbb"), "suite.seed": (42, 42)},
                       names=("runs/a", "runs/b"))
    text = str(err.value)
    assert "no instance in common between runs/a (1 scores) and runs/b (1 scores)" in text
    assert "tokenizer" in text and "tokenizer_fingerprint 'aaa' vs 'bbb'" in text
    assert "suite.seed" not in text  # only settings that differ are named


def test_missing_columns_are_named() -> None:
    with pytest.raises(CompareError, match="lack column"):
        match_scores(pa.table({"instance_id": ["x"]}), _scores([("x", "vt", 4096, 1.0)]))
