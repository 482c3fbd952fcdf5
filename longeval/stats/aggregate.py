"""From per-sample scores to RULER's tables: per task and length, per length, and the headline numbers.

Everything is a pure function over pyarrow tables. Groups are columns, so a summary is a group-by. Failed
samples (null answers, prompts too long, engine errors) score 0 and stay in every mean, as in RULER; their
counts are reported next to the score so a low number can be told apart from a broken run.

Intervals fit the score: a cell of 0/1 scores gets a Wilson interval; a cell with partial credit (MRCR's
ratio, Latent List, CWE or multi-value recall) a percentile bootstrap of its mean, for which a binomial
interval is wrong. The per-length Avg, Avg, wAvg and the effective length get intervals by resampling the
instances of every (task, length) cell and recomputing the statistic. Every bootstrap draws from a seed
derived from the cell's key, and sorts the cell's scores first, so intervals are byte-identical across runs
and row orders.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longeval.errors import ConfigError
from longeval.records import ErrorKind

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "DEPTH_BIN",
    "CI_BOOTSTRAP",
    "CI_WILSON",
    "DEFAULT_BY",
    "EFFECTIVE_LENGTH_THRESHOLD",
    "bootstrap_means",
    "depth_grid",
    "cell_seed",
    "headline",
    "length_table",
    "mean_interval",
    "summarise",
    "wilson_interval",
]

DEFAULT_BY: tuple[str, ...] = ("model_id", "family", "task", "target_length")

EFFECTIVE_LENGTH_THRESHOLD = 85.6
"""RULER's bar for the effective length: Llama-2-7B's 13-task score at 4K."""

BOOTSTRAP_RESAMPLES = 1000
"""Resamples per bootstrap: the 2.5/97.5 percentiles move by well under 0.5 points between seeds at n = 500."""
CI_WILSON = "wilson"
CI_BOOTSTRAP = "bootstrap"

_Z95 = 1.959963984540054  # two-sided 95 % normal quantile
_TAILS = (2.5, 97.5)
_DRAW_CHUNK = 1 << 21  # resampled indices drawn at once: bounds memory for very large cells
_FAILURE_COUNTS = {"nulls": "null", "too_long": ErrorKind.PROMPT_TOO_LONG.value, "errors": ErrorKind.ENGINE_ERROR.value}
_LENGTH_KEYS = ("model_id", "family", "target_length")
_MODEL_KEYS = ("model_id", "family")


def wilson_interval(p: float, n: int, *, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion `p` over `n` samples, on the 0..1 scale.

    Chosen over the normal approximation because it stays inside [0, 1] and is not degenerate at p = 0 or
    p = 1, which is where long-context scores often sit.
    """
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1.0 - p), 0.0) / n + z2 / (4 * n * n)) / denom
    return max(centre - half, 0.0), min(centre + half, 1.0)


def cell_seed(*key: object) -> int:
    """A bootstrap seed from a cell's key (model, family, task, length, ...): stable across runs and machines."""
    digest = hashlib.sha256("\x1f".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def bootstrap_means(values: Sequence[float] | np.ndarray, *, seed: int,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> np.ndarray:
    """Means of `resamples` resamples with replacement of `values` (sorted first: row order never matters)."""
    data = np.sort(np.asarray(values, dtype=np.float64))
    if data.size == 0:
        return np.zeros(resamples)
    rng = np.random.default_rng(seed)
    step = max(1, _DRAW_CHUNK // data.size)
    return np.concatenate([
        data[rng.integers(0, data.size, size=(min(step, resamples - start), data.size))].mean(axis=1)
        for start in range(0, resamples, step)
    ])


def mean_interval(values: Sequence[float] | np.ndarray, *, seed: int,
                  resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float, str]:
    """A 95 % interval for the mean of `values` on the 0..1 scale, and the method used.

    Wilson when every value is 0 or 1 (a proportion); a percentile bootstrap otherwise, since partial credit
    is not binomial: Wilson at the mean of 0.5-scores claims the spread of coin flips.
    """
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0 or bool(np.all((data == 0.0) | (data == 1.0))):
        return (*wilson_interval(float(data.mean()) if data.size else 0.0, int(data.size)), CI_WILSON)
    low, high = np.percentile(bootstrap_means(data, seed=seed, resamples=resamples), _TAILS)
    return float(low), float(high), CI_BOOTSTRAP


def summarise(scores: pa.Table, by: Sequence[str] = DEFAULT_BY) -> pa.Table:
    """Mean score per group (×100, 2 decimals, as RULER reports), a 95 % interval, failure counts.

    Args:
        scores: rows shaped like `SCORE_SCHEMA` (at least the `by` columns, `score` and `error_type`).
        by: the grouping columns; the result is sorted by them (lengths numerically).

    Returns:
        Columns `*by, n, score, ci_low, ci_high, nulls, too_long, errors, ci_method`; `ci_method` says how
        the interval was made (`wilson` for 0/1 scores, `bootstrap` for partial credit; see `mean_interval`).
    """
    by = list(by)
    _require_columns(scores, [*by, "score", "error_type"], what="scores")
    error_type = scores["error_type"]
    work = pa.table(
        {
            **{name: scores[name] for name in by},
            "score": pc.fill_null(scores["score"].cast(pa.float64()), 0.0),
            **{
                column: pc.fill_null(pc.equal(error_type, label), False).cast(pa.int64())
                for column, label in _FAILURE_COUNTS.items()
            },
        }
    )
    grouped = (
        work.group_by(by, use_threads=False)
        .aggregate([("score", "mean"), ("score", "count"), ("score", "list"),
                    *[(c, "sum") for c in _FAILURE_COUNTS]])
        .sort_by([(name, "ascending") for name in by])
    )

    means = grouped["score_mean"].to_pylist()
    counts = grouped["score_count"].to_pylist()  # nulls were filled above, so this counts every row
    keys = grouped.select(by).to_pylist()
    intervals = [mean_interval(values, seed=cell_seed(*key.values()))
                 for key, values in zip(keys, grouped["score_list"].to_pylist(), strict=True)]
    schema = pa.schema(
        [
            *[scores.schema.field(name) for name in by],
            ("n", pa.int64()),
            ("score", pa.float64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
            *[(column, pa.int64()) for column in _FAILURE_COUNTS],
            ("ci_method", pa.string()),
        ]
    )
    return pa.table(
        {
            **{name: grouped[name] for name in by},
            "n": counts,
            "score": [_percent(p) for p in means],
            "ci_low": [_percent(low) for low, _, _ in intervals],
            "ci_high": [_percent(high) for _, high, _ in intervals],
            **{column: grouped[f"{column}_sum"] for column in _FAILURE_COUNTS},
            "ci_method": [method for _, _, method in intervals],
        },
        schema=schema,
    )


def length_table(summary: pa.Table, *, scores: pa.Table | None = None,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> pa.Table:
    """RULER's per-length score: the unweighted mean of the task scores, per model, family and length.

    Args:
        summary: `summarise`'s table.
        scores: the per-instance scores behind it; with them `ci_low`, `ci_high` are a 95 % bootstrap
            interval of the per-length score (instances resampled within each task and length), else null.
        resamples: bootstrap resamples.

    Returns:
        Columns `model_id, family, target_length, score, tasks, ci_low, ci_high`; `tasks` is how many task
        scores were averaged, so a length missing some tasks is visible rather than silently comparable.
    """
    _require_columns(summary, [*_LENGTH_KEYS, "task", "score"], what="summary")
    grouped = (
        summary.select([*_LENGTH_KEYS, "score"])
        .group_by(list(_LENGTH_KEYS), use_threads=False)
        .aggregate([("score", "mean"), ("score", "count")])
        .sort_by([(name, "ascending") for name in _LENGTH_KEYS])
    )
    intervals: dict[tuple, tuple[float, float]] = {}
    for (model_id, family), (lengths, matrix) in _length_bootstrap(scores, resamples).items():
        bounds = np.percentile(matrix, _TAILS, axis=0)
        for j, length in enumerate(lengths):
            intervals[(model_id, family, length)] = (round(float(bounds[0, j]), 2), round(float(bounds[1, j]), 2))
    keys = [tuple(row.values()) for row in grouped.select(list(_LENGTH_KEYS)).to_pylist()]
    schema = pa.schema(
        [
            *[summary.schema.field(name) for name in _LENGTH_KEYS],
            ("score", pa.float64()),
            ("tasks", pa.int64()),
            ("ci_low", pa.float64()),
            ("ci_high", pa.float64()),
        ]
    )
    return pa.table(
        {
            **{name: grouped[name] for name in _LENGTH_KEYS},
            "score": [round(s, 2) for s in grouped["score_mean"].to_pylist()],
            "tasks": grouped["score_count"],
            "ci_low": [intervals[k][0] if k in intervals else None for k in keys],
            "ci_high": [intervals[k][1] if k in intervals else None for k in keys],
        },
        schema=schema,
    )


_HEADLINE_INTERVALS = ("avg_ci_low", "avg_ci_high", "wavg_inc_ci_low", "wavg_inc_ci_high", "wavg_dec_ci_low",
                       "wavg_dec_ci_high", "effective_length_low", "effective_length_high")


def headline(length_tbl: pa.Table, *, threshold: float | Mapping[str, float] = EFFECTIVE_LENGTH_THRESHOLD,
             scores: pa.Table | None = None, resamples: int = BOOTSTRAP_RESAMPLES) -> pa.Table:
    """RULER's headline numbers per model and family, from the per-length scores.

    `avg` is the plain mean over lengths; `wavg_inc` weights the lengths 1..L in ascending order (long
    contexts count more), `wavg_dec` weights them L..1; `effective_length` is the largest length whose
    score is strictly above `threshold` (null if none is): one for every family, or a family's own from a mapping
    (`tasks.effective_thresholds`; a family it lacks gets RULER's). The threshold is returned as a column so a
    report can never show a different one from the one used.

    With `scores` (the per-instance scores behind the table), each number gets a 95 % bootstrap interval:
    instances are resampled within every (task, length) cell and the number recomputed. `*_ci_low/high`
    are the 2.5/97.5 percentiles; `effective_length_low/high` are the 2.5th (rounded down) and 97.5th
    (rounded up) percentiles over the length grid, a low of null meaning that in more than 2.5 % of the
    resamples no length passes. Without `scores` these columns are null.
    """
    _require_columns(length_tbl, [*_LENGTH_KEYS, "score"], what="length table")
    per_model: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for row in length_tbl.select([*_LENGTH_KEYS, "score"]).to_pylist():
        per_model[(row["model_id"], row["family"])].append((row["target_length"], row["score"]))
    boot = _length_bootstrap(scores, resamples)

    rows = []
    for (model_id, family), points in sorted(per_model.items()):
        points.sort()
        values = [score for _, score in points]
        count = len(values)
        weights = range(1, count + 1)
        total_weight = count * (count + 1) / 2
        bar = threshold.get(family, EFFECTIVE_LENGTH_THRESHOLD) if isinstance(threshold, Mapping) else threshold
        passing = [length for length, score in points if score > bar]
        rows.append(
            {
                "model_id": model_id,
                "family": family,
                "avg": round(sum(values) / count, 2),
                "wavg_inc": round(sum(w * v for w, v in zip(weights, values, strict=True)) / total_weight, 2),
                "wavg_dec": round(
                    sum(w * v for w, v in zip(reversed(weights), values, strict=True)) / total_weight, 2
                ),
                "effective_length": max(passing) if passing else None,
                "lengths": count,
                "threshold": bar,
                **_headline_intervals(boot.get((model_id, family)), bar),
            }
        )
    schema = pa.schema(
        [
            length_tbl.schema.field("model_id"),
            length_tbl.schema.field("family"),
            ("avg", pa.float64()),
            ("wavg_inc", pa.float64()),
            ("wavg_dec", pa.float64()),
            ("effective_length", pa.int64()),
            ("lengths", pa.int64()),
            ("threshold", pa.float64()),
            *[(name, pa.int64() if name.startswith("effective") else pa.float64()) for name in _HEADLINE_INTERVALS],
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _length_bootstrap(scores: pa.Table | None, resamples: int) -> dict[tuple[str, str], tuple[list[int], np.ndarray]]:
    """Per model and family: its lengths and a (resamples x lengths) matrix of bootstrapped per-length scores.

    Each (task, length) cell is resampled on its own (`bootstrap_means`, seeded by the cell's key as in
    `summarise`); a length's score is the mean of its task means (×100), as in `length_table`.
    """
    if scores is None or scores.num_rows == 0:
        return {}
    keys = ["model_id", "family", "task", "target_length"]
    _require_columns(scores, [*keys, "score"], what="scores")
    work = pa.table({**{k: scores[k] for k in keys}, "score": pc.fill_null(scores["score"].cast(pa.float64()), 0.0)})
    cells = work.group_by(keys, use_threads=False).aggregate([("score", "list")]).sort_by(
        [(k, "ascending") for k in keys])
    means: dict[tuple[str, str], dict[int, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for row in cells.to_pylist():
        seed = cell_seed(*(row[k] for k in keys))
        means[(row["model_id"], row["family"])][row["target_length"]].append(
            bootstrap_means(row["score_list"], seed=seed, resamples=resamples))
    out = {}
    for key, by_length in means.items():
        lengths = sorted(by_length)
        out[key] = (lengths, 100.0 * np.stack([np.mean(by_length[n], axis=0) for n in lengths], axis=1))
    return out


def _headline_intervals(boot: tuple[list[int], np.ndarray] | None, threshold: float) -> dict[str, float | None]:
    """The interval columns of one headline row from its bootstrapped per-length scores (nulls without)."""
    if boot is None:
        return dict.fromkeys(_HEADLINE_INTERVALS)
    lengths, matrix = boot
    weights = np.arange(1, len(lengths) + 1, dtype=np.float64)
    stats = {"avg": matrix.mean(axis=1), "wavg_inc": matrix @ weights / weights.sum(),
             "wavg_dec": matrix @ weights[::-1] / weights.sum()}
    out: dict[str, float | None] = {}
    for name, values in stats.items():
        low, high = np.percentile(values, _TAILS)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = round(float(low), 2), round(float(high), 2)
    passing = matrix > threshold
    last = len(lengths) - 1 - np.argmax(passing[:, ::-1], axis=1)
    effective = np.where(passing.any(axis=1), np.asarray(lengths, dtype=np.int64)[last], 0)
    low = int(np.quantile(effective, _TAILS[0] / 100, method="lower"))
    high = int(np.quantile(effective, _TAILS[1] / 100, method="higher"))
    out["effective_length_low"] = low or None
    out["effective_length_high"] = high or None
    return out


def _percent(fraction: float) -> float:
    """A 0..1 value as a percentage with 2 decimals, RULER's reporting precision."""
    return round(fraction * 100, 2)


def _require_columns(table: pa.Table, columns: Sequence[str], *, what: str) -> None:
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise ConfigError(
            f"{what} table lacks column(s) {', '.join(missing)}; it has {', '.join(table.column_names)}"
        )


def cumulative(scores: pa.Table, weights: dict[int, float] | None = None) -> pa.Table:
    """Pointwise and cumulative scores against context length (Michelangelo §3.2, its Figures 1-8).

    For each model, family, task and length L: `score_at` is the mean over instances of length L and
    `score_upto` the mean over every instance of length <= L, each instance weighing the same ("up to
    128K" in the paper's sense). Failed rows count as 0, as everywhere. With `weights` (length -> weight, the
    bucket normalisation of stacked subsets, §3.2) an instance of length L weighs `weights[L]` in `score_upto`.

    Returns:
        Columns `model_id, family, task, target_length, n_at, score_at, n_upto, score_upto` (scores x100).
    """
    keys = ("model_id", "family", "task")
    _require_columns(scores, [*keys, "target_length", "score"], what="scores")
    values = pc.fill_null(scores["score"], 0.0).to_pylist()
    groups: dict[tuple, dict[int, list[float]]] = {}
    for row, value in zip(scores.select([*keys, "target_length"]).to_pylist(), values, strict=True):
        groups.setdefault(tuple(row[k] for k in keys), {}).setdefault(row["target_length"], []).append(value)
    out: dict[str, list] = {name: [] for name in
                            (*keys, "target_length", "n_at", "score_at", "n_upto", "score_upto")}
    for group in sorted(groups):
        total, count, weighed = 0.0, 0, 0.0
        for length in sorted(groups[group]):
            at = groups[group][length]
            w = (weights or {}).get(length, 1.0)
            total, count, weighed = total + w * sum(at), count + len(at), weighed + w * len(at)
            for name, value in zip(keys, group, strict=True):
                out[name].append(value)
            out["target_length"].append(length)
            out["n_at"].append(len(at))
            out["score_at"].append(_percent(sum(at) / len(at)))
            out["n_upto"].append(count)
            out["score_upto"].append(_percent(total / weighed))
    return pa.table(out, schema=pa.schema([
        *[scores.schema.field(k) for k in keys], scores.schema.field("target_length"),
        ("n_at", pa.int64()), ("score_at", pa.float64()), ("n_upto", pa.int64()), ("score_upto", pa.float64()),
    ]))


def error_table(scores: pa.Table) -> pa.Table:
    """How many answers of each task and length failed, and how (SYNC §5.4, its Table 5).

    Every non-empty `error_type` of a score row is a kind of failure: a task's own labels (SYNC's
    `no_answer`, `invalid_path`, `suboptimal_path`) and the pipeline's (`null`, `prompt_too_long`,
    `engine_error`). `share` is the percentage of the group's instances with that error.

    Returns:
        Columns `model_id, family, task, target_length, error_type, count, n, share`.
    """
    keys = ("model_id", "family", "task", "target_length")
    _require_columns(scores, [*keys, "error_type"], what="scores")
    totals = scores.group_by(list(keys), use_threads=False).aggregate([([], "count_all")])
    failed = scores.filter(pc.not_equal(pc.fill_null(scores["error_type"], ""), ""))
    counts = failed.group_by([*keys, "error_type"], use_threads=False).aggregate([([], "count_all")])
    n_of = {tuple(row[k] for k in keys): row["count_all"] for row in totals.to_pylist()}
    rows = []
    for row in counts.to_pylist():
        n = n_of[tuple(row[k] for k in keys)]
        rows.append({**{k: row[k] for k in keys}, "error_type": row["error_type"], "count": row["count_all"],
                     "n": n, "share": _percent(row["count_all"] / n)})
    rows.sort(key=lambda r: (r["model_id"], r["family"], r["task"], r["target_length"], r["error_type"]))
    return pa.Table.from_pylist(rows, schema=pa.schema([
        *[scores.schema.field(k) for k in keys], ("error_type", pa.string()),
        ("count", pa.int64()), ("n", pa.int64()), ("share", pa.float64()),
    ]))


def ladder(summary: pa.Table, rungs: dict[str, tuple[str, str]]) -> pa.Table:
    """Tasks that share a context side by side: per model, domain and length, one score per rung.

    SYNC asks retrieval, tracking and global questions of one context (its §3.3), so the fall from one
    rung to the next is the task's doing; `rungs` maps a task to its (domain, rung), e.g. SYNC's `LADDER`.

    Returns:
        Columns `model_id, domain, target_length`, then one column per rung in `rungs`' order (×100).
    """
    _require_columns(summary, ["model_id", "task", "target_length", "score"], what="summary")
    order = list(dict.fromkeys(rung for _, rung in rungs.values()))
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    for row in summary.to_pylist():
        if row["task"] in rungs:
            domain, rung = rungs[row["task"]]
            cells[(row["model_id"], domain, row["target_length"])][rung] = row["score"]
    rows = [{"model_id": m, "domain": d, "target_length": n, **{r: by.get(r) for r in order}}
            for (m, d, n), by in sorted(cells.items())]
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("model_id", pa.string()), ("domain", pa.string()), ("target_length", pa.int64()),
         *[(r, pa.float64()) for r in order]]))


DEPTH_BIN = 10.0
"""Depth bins (percent) of the depth x length heatmaps computed from scores (RULER's 40 depths -> 10 bins)."""


def depth_grid(scores: pa.Table) -> pa.Table:
    """Mean score (x100) per family, length and depth bin, from score rows that have a depth (percent, >= 0).

    RULER's NIAH needles sit at 40 depths; binned by `DEPTH_BIN` they give its depth x length heatmap.
    A family with its own grid (`SummaryTable.heatmap`: TAIL's Figure 5) shows that one instead (W&B's
    `plot_specs`, the report's `ReportSection("heatmap")`).
    """
    cells: dict[tuple[str, int, float], list[float]] = defaultdict(list)
    if scores.num_rows:
        for row in scores.select(["family", "target_length", "depth", "score"]).to_pylist():
            depth = row["depth"]
            if depth is None or not math.isfinite(depth) or depth < 0:
                continue
            binned = min(math.floor(depth / DEPTH_BIN) * DEPTH_BIN, 100.0 - DEPTH_BIN)
            cells[(row["family"], row["target_length"], binned)].append(row["score"] or 0.0)
    rows = [{"family": f, "target_length": n, "depth": d, "n": len(v), "score": round(100 * sum(v) / len(v), 2)}
            for (f, n, d), v in sorted(cells.items())]
    return pa.Table.from_pylist(rows, schema=pa.schema([("family", pa.string()), ("target_length", pa.int64()),
                                                        ("depth", pa.float64()), ("n", pa.int64()),
                                                        ("score", pa.float64())]))
