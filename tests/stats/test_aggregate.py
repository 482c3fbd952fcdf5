"""Aggregation: RULER's per-task and per-length scores and headline numbers, checked against its Table 3."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from longeval.errors import ConfigError
from longeval.records import SCORE_SCHEMA
from longeval.stats.aggregate import (
    CI_BOOTSTRAP,
    CI_WILSON,
    bootstrap_means,
    cell_seed,
    headline,
    length_table,
    mean_interval,
    summarise,
    wilson_interval,
)

LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072]


def score_rows(
    scores: list[float],
    *,
    error_types: list[str] | None = None,
    model_id: str = "m",
    task: str = "niah_single_1",
    target_length: int = 4096,
) -> list[dict]:
    error_types = error_types or [""] * len(scores)
    return [
        {
            "instance_id": f"{model_id}-{task}-{target_length}-{i}",
            "model_id": model_id,
            "family": "ruler",
            "task": task,
            "target_length": target_length,
            "depth": 0.5,
            "metric": "string_match_all",
            "score": score,
            "parsed_answer": "",
            "error_type": error_type,
            "extra": "{}",
        }
        for i, (score, error_type) in enumerate(zip(scores, error_types, strict=True))
    ]


def length_scores(model_id: str, scores: list[float]) -> pa.Table:
    return pa.table(
        {
            "model_id": [model_id] * len(scores),
            "family": ["ruler"] * len(scores),
            "target_length": pa.array(LENGTHS[: len(scores)], pa.int64()),
            "score": scores,
            "tasks": [13] * len(scores),
        }
    )


# --- Wilson interval -------------------------------------------------------------------------------------


def test_wilson_half_of_ten() -> None:
    """5/10: centre 0.5; half-width z*sqrt(0.025 + z²/400)/(1 + z²/10) = 0.26341."""
    low, high = wilson_interval(0.5, 10)
    assert low == pytest.approx(0.236593, abs=1e-6)
    assert high == pytest.approx(0.763407, abs=1e-6)


def test_wilson_at_the_edges() -> None:
    """At p = 1 the lower bound is n / (n + z²); at p = 0 the upper bound is z² / (n + z²)."""
    z2 = 1.959963984540054**2
    assert wilson_interval(1.0, 500) == pytest.approx((500 / (500 + z2), 1.0))
    assert wilson_interval(0.0, 500) == pytest.approx((0.0, z2 / (500 + z2)))


# --- summarise -------------------------------------------------------------------------------------------


def test_summarise_keeps_failures_as_zeros_and_counts_them() -> None:
    rows = score_rows([1.0, 1.0, 0.0, 0.0], error_types=["", "", "null", "prompt_too_long"])
    summary = summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))
    assert summary.to_pylist() == [
        {
            "model_id": "m",
            "family": "ruler",
            "task": "niah_single_1",
            "target_length": 4096,
            "n": 4,
            "score": 50.0,
            # Wilson for p = 0.5, n = 4: centre 0.5, half-width z*sqrt(1/16 + z²/64)/(1 + z²/4) = 0.35
            "ci_low": 15.0,
            "ci_high": 85.0,
            "nulls": 1,
            "too_long": 1,
            "errors": 0,
            "ci_method": "wilson",
        }
    ]


def test_summarise_counts_engine_errors() -> None:
    rows = score_rows([0.0, 1.0, 1.0], error_types=["engine_error", "", ""])
    (row,) = summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)).to_pylist()
    assert (row["n"], row["score"], row["errors"], row["nulls"]) == (3, 66.67, 1, 0)


def test_summarise_sorts_lengths_numerically() -> None:
    rows = [r for length in (131072, 8192, 16384, 4096) for r in score_rows([1.0], target_length=length)]
    summary = summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))
    assert summary["target_length"].to_pylist() == [4096, 8192, 16384, 131072]


def test_summarise_custom_grouping() -> None:
    rows = score_rows([1.0, 0.0], task="qa_1") + score_rows([1.0, 1.0], task="vt", target_length=8192)
    summary = summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA), by=["model_id"])
    assert summary.column_names[:3] == ["model_id", "n", "score"]
    assert summary.select(["model_id", "n", "score"]).to_pylist() == [
        {"model_id": "m", "n": 4, "score": 75.0}
    ]


def test_summarise_empty_table() -> None:
    summary = summarise(SCORE_SCHEMA.empty_table())
    assert summary.num_rows == 0
    assert "ci_high" in summary.column_names


def test_summarise_missing_column() -> None:
    with pytest.raises(ConfigError, match="depth_bucket"):
        summarise(SCORE_SCHEMA.empty_table(), by=["depth_bucket"])


# --- length_table ----------------------------------------------------------------------------------------


def test_length_table_is_unweighted_mean_over_tasks() -> None:
    """A task with 1 sample weighs as much as a task with 4: RULER averages task scores, not samples."""
    rows = score_rows([1.0], task="a") + score_rows([0.0, 0.0, 0.0, 1.0], task="b")
    rows += score_rows([1.0], task="a", target_length=8192)
    lengths = length_table(summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)))
    assert lengths.to_pylist() == [
        {"model_id": "m", "family": "ruler", "target_length": 4096, "score": 62.5, "tasks": 2, "ci_low": None,
         "ci_high": None},
        {"model_id": "m", "family": "ruler", "target_length": 8192, "score": 100.0, "tasks": 1, "ci_low": None,
         "ci_high": None},
    ]


# --- headline: RULER Table 3 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "scores", "exact", "published", "effective"),
    [
        (
            "gpt-4",
            [96.6, 96.3, 95.2, 93.2, 87.0, 81.2],
            (91.58, 89.04, 94.13),
            (91.6, 89.0, 94.1),
            65536,
        ),
        (
            "mixtral-8x22b",
            [94.9, 92.1, 92.5, 85.9, 72.4, 44.5],
            (80.38, 72.82, 87.95),
            (80.4, 72.8, 87.9),
            32768,
        ),
    ],
)
def test_headline_reproduces_ruler_table_3(
    model_id: str,
    scores: list[float],
    exact: tuple[float, float, float],
    published: tuple[float, float, float],
    effective: int,
) -> None:
    (row,) = headline(length_scores(model_id, scores)).to_pylist()
    got = (row["avg"], row["wavg_inc"], row["wavg_dec"])
    assert got == exact
    # The paper prints one decimal; 87.95 appears there as 87.9, so compare within half a unit of 0.1.
    assert got == pytest.approx(published, abs=0.05 + 1e-9)
    assert row["effective_length"] == effective
    assert (row["lengths"], row["threshold"]) == (6, 85.6)


def test_headline_weights_follow_length_order_not_row_order() -> None:
    shuffled = length_scores("m", [96.6, 96.3, 95.2, 93.2, 87.0, 81.2]).take([5, 2, 0, 4, 1, 3])
    (row,) = headline(shuffled).to_pylist()
    assert (row["wavg_inc"], row["wavg_dec"]) == (89.04, 94.13)


def test_effective_length_is_strictly_above_threshold() -> None:
    (row,) = headline(length_scores("m", [85.6, 85.6])).to_pylist()
    assert row["effective_length"] is None
    (row,) = headline(length_scores("m", [90.0, 80.0]), threshold=79.99).to_pylist()
    assert row["effective_length"] == 8192


def test_effective_length_is_largest_passing_length_even_after_a_dip() -> None:
    """Convention: the largest length above the threshold, not the end of the first passing run."""
    (row,) = headline(length_scores("m", [90.0, 80.0, 88.0])).to_pylist()
    assert row["effective_length"] == 16384


def test_headline_one_row_per_model() -> None:
    table = pa.concat_tables([length_scores("b", [90.0, 90.0]), length_scores("a", [50.0])])
    rows = headline(table).to_pylist()
    assert [(r["model_id"], r["avg"], r["lengths"]) for r in rows] == [("a", 50.0, 1), ("b", 90.0, 2)]


def test_pipeline_from_scores_to_headline() -> None:
    rows = []
    for length, (a, b) in zip(LENGTHS[:3], [(1.0, 1.0), (1.0, 0.5), (0.5, 0.0)], strict=True):
        rows += score_rows([a], task="niah_single_1", target_length=length)
        rows += score_rows([b], task="vt", target_length=length)
    lengths = length_table(summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)))
    assert lengths["score"].to_pylist() == [100.0, 75.0, 25.0]
    (row,) = headline(lengths).to_pylist()
    assert row["avg"] == round(200 / 3, 2)
    assert row["wavg_inc"] == round((100 + 2 * 75 + 3 * 25) / 6, 2)
    assert row["wavg_dec"] == round((3 * 100 + 2 * 75 + 25) / 6, 2)
    assert row["effective_length"] == 4096


def test_cumulative_scores_are_pointwise_and_up_to_each_length():
    from longeval.stats.aggregate import cumulative

    rows = [("m", "f", "t", 1024, 1.0), ("m", "f", "t", 1024, 0.0), ("m", "f", "t", 4096, 1.0),
            ("m", "f", "t", 4096, 1.0), ("m", "f", "t", 4096, None), ("m", "f", "u", 1024, 0.5)]
    table = pa.table({
        "model_id": [r[0] for r in rows], "family": [r[1] for r in rows], "task": [r[2] for r in rows],
        "target_length": pa.array([r[3] for r in rows], pa.int64()), "score": [r[4] for r in rows],
    })
    got = cumulative(table).to_pylist()
    assert [(r["task"], r["target_length"], r["n_at"], r["score_at"], r["n_upto"], r["score_upto"]) for r in got] == [
        ("t", 1024, 2, 50.0, 2, 50.0),
        ("t", 4096, 3, 66.67, 5, 60.0),  # the null score counts as 0
        ("u", 1024, 1, 50.0, 1, 50.0),
    ]


def test_error_table_counts_each_kind_of_failure_per_task_and_length():
    from longeval.stats.aggregate import error_table

    rows = score_rows([0, 0, 0, 1, 0], error_types=["invalid_path", "invalid_path", "no_answer", "", "null"],
                      task="shortest_path")
    rows += score_rows([1, 1], task="shortest_path", target_length=8192)
    got = error_table(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)).to_pylist()
    assert [(r["error_type"], r["count"], r["n"], r["share"]) for r in got] == [
        ("invalid_path", 2, 5, 40.0), ("no_answer", 1, 5, 20.0), ("null", 1, 5, 20.0),
    ]
    assert {r["target_length"] for r in got} == {4096}  # a length without failures has no rows


def test_ladder_puts_the_tasks_of_one_context_side_by_side():
    from longeval.stats.aggregate import ladder
    from longeval.tasks.sync import LADDER

    rows = []
    for task, value in (("connected_nodes", 1.0), ("shortest_path", 0.5), ("longest_path", 0.0),
                        ("single_hop_translation", 1.0), ("niah_single_1", 1.0)):
        rows += score_rows([value], task=task)
    got = ladder(summarise(pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)), LADDER).to_pylist()
    assert got == [
        {"model_id": "m", "domain": "graph", "target_length": 4096, "retrieval": 100.0, "tracking": 50.0,
         "global": 0.0},
        {"model_id": "m", "domain": "translation", "target_length": 4096, "retrieval": 100.0, "tracking": None,
         "global": None},
    ]


def test_cumulative_with_bucket_weights_discounts_repeated_lengths():
    from longeval.stats.aggregate import cumulative

    rows = score_rows([1.0, 1.0, 1.0], target_length=4096) + score_rows([0.0], target_length=8192)
    table = pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)
    plain = cumulative(table).to_pylist()[-1]
    stacked = cumulative(table, {4096: 1 / 3, 8192: 1.0}).to_pylist()[-1]
    assert plain["score_upto"] == 75.0  # 3 of 4 instances
    assert stacked["score_upto"] == 50.0  # the 4K bucket counts as one instance's worth
    assert stacked["score_at"] == plain["score_at"] == 0.0 and stacked["n_upto"] == 4


# --- intervals that fit the score ------------------------------------------------------------------------


def _table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)


def test_binary_cell_gets_the_wilson_formula() -> None:
    """7 of 20 right: Wilson by hand, centre (p + z²/2n)/(1 + z²/n), half z*sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n)."""
    (row,) = summarise(_table(score_rows([1.0] * 7 + [0.0] * 13))).to_pylist()
    z, n, p = 1.959963984540054, 20, 0.35
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert row["ci_method"] == CI_WILSON
    assert (row["ci_low"], row["ci_high"]) == (round(100 * (centre - half), 2), round(100 * (centre + half), 2))


def test_partial_credit_cell_is_bootstrapped_and_covers_the_mean() -> None:
    values = [0.5] * 30 + [0.25] * 10 + [1.0] * 10
    (row,) = summarise(_table(score_rows(values))).to_pylist()
    assert row["ci_method"] == CI_BOOTSTRAP
    assert row["ci_low"] < row["score"] == 55.0 < row["ci_high"]
    # Narrower than Wilson would claim at p = 0.55: these scores spread less than coin flips.
    low, high = wilson_interval(0.55, 50)
    assert row["ci_high"] - row["ci_low"] < 100 * (high - low) * 0.8
    # The percentile bootstrap of the mean is close to the normal interval mean ± 1.96 SE here.
    se = np.std(values) / np.sqrt(len(values)) * 100
    assert row["ci_low"] == pytest.approx(55.0 - 1.96 * se, abs=1.0)
    assert row["ci_high"] == pytest.approx(55.0 + 1.96 * se, abs=1.0)


def test_constant_partial_credit_gives_a_degenerate_interval() -> None:
    (row,) = summarise(_table(score_rows([0.5] * 8))).to_pylist()
    assert (row["ci_method"], row["ci_low"], row["score"], row["ci_high"]) == (CI_BOOTSTRAP, 50.0, 50.0, 50.0)


def test_intervals_are_deterministic_and_ignore_row_order() -> None:
    values = [0.1 * (i % 11) for i in range(60)]
    table = _table(score_rows(values))
    first = summarise(table)
    assert summarise(table).equals(first)
    assert summarise(table.take(list(reversed(range(table.num_rows))))).equals(first)
    seed = cell_seed("m", "ruler", "niah_single_1", 4096)
    assert np.array_equal(bootstrap_means(values, seed=seed), bootstrap_means(values[::-1], seed=seed))
    assert mean_interval(values, seed=seed) != mean_interval(values, seed=seed + 1)  # the seed is used


def test_bootstrap_in_chunks_equals_one_draw_for_small_cells() -> None:
    values = np.linspace(0, 1, 7)
    means = bootstrap_means(values, seed=3, resamples=50)
    idx = np.random.default_rng(3).integers(0, 7, size=(50, 7))
    assert np.allclose(means, np.sort(values)[idx].mean(axis=1))


# --- intervals of the per-length score, Avg, wAvg and the effective length -------------------------------


def _grid(cells: dict[tuple[str, int], list[float]]) -> pa.Table:
    return _table([r for (task, length), values in cells.items()
                   for r in score_rows(values, task=task, target_length=length)])


def _headline(scores: pa.Table, **kwargs: object) -> dict:
    lengths = length_table(summarise(scores), scores=scores)
    (row,) = headline(lengths, scores=scores, **kwargs).to_pylist()
    return row


def test_all_perfect_cells_give_degenerate_intervals() -> None:
    scores = _grid({(task, n): [1.0] * 20 for task in ("a", "b") for n in LENGTHS[:3]})
    lengths = length_table(summarise(scores), scores=scores)
    assert lengths["ci_low"].to_pylist() == lengths["ci_high"].to_pylist() == [100.0] * 3
    row = _headline(scores)
    for name in ("avg", "wavg_inc", "wavg_dec"):
        assert row[f"{name}_ci_low"] == row[name] == row[f"{name}_ci_high"] == 100.0
    assert row["effective_length_low"] == row["effective_length"] == row["effective_length_high"] == LENGTHS[2]


def test_headline_intervals_cover_the_point_and_follow_the_weights() -> None:
    """Noise only at the longest length: wAvg(inc) weighs it most, so its interval is the widest."""
    cells = {("a", n): [1.0] * 40 for n in LENGTHS[:2]} | {("a", LENGTHS[2]): [1.0, 0.0] * 20}
    row = _headline(_grid(cells))
    widths = {name: row[f"{name}_ci_high"] - row[f"{name}_ci_low"] for name in ("avg", "wavg_inc", "wavg_dec")}
    for name in widths:
        assert row[f"{name}_ci_low"] < row[name] < row[f"{name}_ci_high"]
    assert widths["wavg_dec"] < widths["avg"] < widths["wavg_inc"]
    # Avg moves by a third of the longest length's score, whose interval is about ±1.96 * sqrt(.25/40).
    half = 1.96 * np.sqrt(0.25 / 40) * 100 / 3
    assert row["avg_ci_low"] == pytest.approx(row["avg"] - half, abs=1.0)


def test_a_cell_near_the_threshold_widens_the_effective_length_interval() -> None:
    clear = {(task, n): [1.0] * 50 for task in ("a", "b") for n in LENGTHS[:3]}
    row = _headline(_grid(clear))
    assert row["effective_length_low"] == row["effective_length_high"] == LENGTHS[2]
    # At the longest length task b scores 72 %: the length's score is 86 %, just over 85.6.
    near = clear | {("b", LENGTHS[2]): [1.0] * 36 + [0.0] * 14}
    row = _headline(_grid(near))
    assert row["effective_length"] == LENGTHS[2]
    assert row["effective_length_low"] == LENGTHS[1] and row["effective_length_high"] == LENGTHS[2]
    # Far below at every length: no length passes in any resample.
    row = _headline(_grid({("a", n): [0.0] * 10 for n in LENGTHS[:3]}))
    assert (row["effective_length"], row["effective_length_low"], row["effective_length_high"]) == (None,) * 3


def test_headline_intervals_are_deterministic_and_null_without_scores() -> None:
    scores = _grid({("a", n): [0.1 * (i % 11) for i in range(30)] for n in LENGTHS[:4]})
    lengths = length_table(summarise(scores), scores=scores)
    assert headline(lengths, scores=scores).equals(headline(lengths, scores=scores.take(
        list(reversed(range(scores.num_rows))))))
    (bare,) = headline(lengths).to_pylist()
    assert bare["avg_ci_low"] is None and bare["effective_length_high"] is None
    assert bare["avg"] == _headline(scores)["avg"]


def test_the_headline_reads_each_family_against_its_own_threshold() -> None:
    rows = [{"model_id": "m", "family": fam, "task": "t", "target_length": n, "score": s / 100, "error_type": ""}
            for fam in ("ruler", "sync") for n, s in ((1024, 90), (2048, 70))]
    lengths = length_table(summarise(pa.Table.from_pylist(rows)))
    head = {r["family"]: r for r in headline(lengths, threshold={"ruler": 85.6, "sync": 60.0}).to_pylist()}
    assert (head["ruler"]["effective_length"], head["ruler"]["threshold"]) == (1024, 85.6)
    assert (head["sync"]["effective_length"], head["sync"]["threshold"]) == (2048, 60.0)
