"""The pure layer of tracking: what the summarise stage wrote, turned into the payloads W&B is handed.

`summary_metrics`, `status_metrics`, `length_history`, `instance_tables`, `plot_specs` and `config_payload` build
plain numbers, rows and chart specs under the key names of `longeval.tracking.keys`; `load_tables` and
`results_files` read and list the run root's results (local or s3://). Nothing here imports wandb:
`longeval.tracking.wandb_run` hands these payloads over.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longeval.config import Config, redactor, to_yaml
from longeval.stats.aggregate import DEPTH_BIN, EFFECTIVE_LENGTH_THRESHOLD, depth_grid, headline, length_table
from longeval.store.run_root import RunRoot
from longeval.tasks import FAMILIES
from longeval.tracking.keys import (
    COUNT_METRICS,
    HEADLINE_METRICS,
    STEP_METRIC,
    avg_key,
    count_key,
    cumulative_key,
    curve_key,
    family_avg_key,
    family_metric_key,
    grid_key,
    headline_key,
    heatmap_key,
    instances_key,
    plot_key,
    slug,
    task_key,
)

__all__ = [
    "DEPTH_BIN",
    "INSTANCE_COLUMNS",
    "STATUS_COUNTS",
    "HeatmapSpec",
    "InstanceTable",
    "LineSpec",
    "config_payload",
    "depth_grid",
    "instance_tables",
    "length_history",
    "load_tables",
    "plot_specs",
    "results_files",
    "sample_instances",
    "status_metrics",
    "summary_metrics",
    "text_tail",
]

INSTANCE_COLUMNS = ("instance_id", "target_length", "depth", "complexity", "input_tokens", "prompt_tail",
                    "references", "output", "parsed_answer", "score", "error_type", "finish_reason",
                    "output_tokens")
"""Columns of the per-task instance tables (instances, predictions and scores joined by instance_id)."""


def load_tables(root: RunRoot) -> dict[str, pa.Table]:
    """Every `summary/<name>.parquet` that the summarise stage wrote, by name (local or s3://)."""
    import pyarrow.parquet as pq

    return {name: pq.read_table(pa.BufferReader(root.read_bytes(f"summary/{name}.parquet")))
            for name in sorted(root.shard_names("summary"))}


def summary_metrics(tables: Mapping[str, pa.Table]) -> dict[str, float]:
    """The run's summary numbers under stable keys (see the `*_key` functions).

    Per task x length (`ruler/niah_single_1/4096`), per family and length (`ruler/avg/4096`), the suite's
    per-length mean over all task scores (`avg/4096`), RULER's headline numbers for the suite
    (`headline/avg`, `headline/wavg_inc`, `headline/wavg_dec`, `headline/effective_length`,
    `headline/threshold`) and per family (`ruler/headline/avg`, ...), counts (`count/instances`, ...), and
    the metrics of the families' own tables (`family_metric_key`: TAIL's `tail/tail_headline/ratio`, LongBench
    v2's `longbench_v2/breakdown/hard`). Scores are percentages; an effective length of 0 means no length
    scored above the threshold (RULER's "<4K" cell).
    """
    out: dict[str, float] = {}
    tasks = tables.get("tasks")
    if tasks is None or tasks.num_rows == 0:
        return out
    for row in tasks.to_pylist():
        out[task_key(row["family"], row["task"], row["target_length"])] = row["score"]
    threshold = EFFECTIVE_LENGTH_THRESHOLD
    if "headline" in tables and tables["headline"].num_rows:
        threshold = float(tables["headline"]["threshold"][0].as_py())
        for row in tables["headline"].to_pylist():
            for metric in HEADLINE_METRICS:
                out[headline_key(metric, row["family"])] = _number(row[metric])
    for row in (tables["lengths"] if "lengths" in tables else length_table(tasks)).to_pylist():
        out[family_avg_key(row["family"], row["target_length"])] = row["score"]
    suite_lengths = length_table(_as_one_family(tasks))
    for row in suite_lengths.to_pylist():
        out[avg_key(row["target_length"])] = row["score"]
    for row in headline(suite_lengths, threshold=threshold).to_pylist():
        for metric in HEADLINE_METRICS:
            out[headline_key(metric)] = _number(row[metric])
    out[headline_key("threshold")] = threshold
    out[count_key("instances")] = int(pc.sum(tasks["n"]).as_py() or 0)
    for metric in COUNT_METRICS[1:]:
        out[count_key(metric)] = int(pc.sum(tasks[metric]).as_py() or 0) if metric in tasks.column_names else 0
    for row in tables["adaptive_lengths"].to_pylist() if "adaptive_lengths" in tables else []:
        if row["decided"] and not row.get("near_threshold"):  # suite.adaptive: firm ones only (0: none passes)
            out[f"adaptive/effective_length/{row['scope']}/{slug(row['name'])}"] = row["effective_length"] or 0
        if row.get("bound") == "group mean":  # suite.adaptive_target: the range the group's bounds allow (0: none)
            for edge in ("low", "high"):
                out[f"adaptive/effective_range/{slug(row['name'])}/{edge}"] = row[f"effective_length_{edge}"] or 0
    if "adaptive" in tables and tables["adaptive"].num_rows:
        cells = tables["adaptive"]
        full = pc.sum(cells["full_tokens_est"]).as_py()
        out["adaptive/token_share"] = pc.sum(cells["tokens"]).as_py() / full if full else 0.0
        if "gpu_hours" in cells.column_names and pc.sum(cells["full_gpu_hours_est"]).as_py():
            out["adaptive/gpu_hours"] = pc.sum(cells["gpu_hours"]).as_py()
            out["adaptive/gpu_hours_share"] = out["adaptive/gpu_hours"] / pc.sum(cells["full_gpu_hours_est"]).as_py()
    for family in FAMILIES.values():
        for table in family.tables:
            if table.metrics is not None and table.name in tables:
                for name, value in table.metrics(tables[table.name]).items():
                    out[family_metric_key(family.name, name)] = value
    return out


def _as_one_family(tasks: pa.Table) -> pa.Table:
    """The task table with every family called `suite`, so `length_table` averages over all tasks."""
    index = tasks.column_names.index("family")
    return tasks.set_column(index, "family", pa.array(["suite"] * tasks.num_rows, pa.string()))


def _number(value: Any) -> float:
    """A headline cell as a number: RULER's empty effective length ("<4K", none passed) becomes 0."""
    return 0 if value is None else value


STATUS_COUNTS = ("complete", "instances", "predicted", "engine_errors", "scored", "not_scored", "stale_scores",
                 "scores_without_prediction", "unverified_scores", "outside_plan")
"""The status.json entries a tracked run's summary carries (`status_metrics`)."""


def status_metrics(status: Mapping[str, Any]) -> dict[str, float]:
    """status.json (`longeval.run.consistency`, written by the report just before) as `status/<count>` (`complete`:
    1 or 0): a dashboard shows a partial run as partial, not as a finished one with lower numbers."""
    return {f"status/{key}": float(status[key]) for key in STATUS_COUNTS if key in status}


def length_history(tables: Mapping[str, pa.Table]) -> list[dict[str, float]]:
    """One history row per length: every length curve's value there, with `target_length` as the x axis.

    Logged as W&B history with `target_length` as step metric, so a workspace line plot of
    `curve/ruler/niah_single_1` against `target_length` overlays every model's curve.
    """
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    tasks = tables.get("tasks")
    if tasks is None or tasks.num_rows == 0:
        return []
    for row in tasks.to_pylist():
        rows[row["target_length"]][curve_key(row["family"], row["task"])] = row["score"]
    for row in (tables["lengths"] if "lengths" in tables else length_table(tasks)).to_pylist():
        rows[row["target_length"]][curve_key(row["family"])] = row["score"]
    for row in length_table(_as_one_family(tasks)).to_pylist():
        rows[row["target_length"]][curve_key()] = row["score"]
    for row in tables["cumulative"].to_pylist() if "cumulative" in tables else []:
        rows[row["target_length"]][cumulative_key(row["family"], row["task"])] = row["score_upto"]
    return [{STEP_METRIC: length, **values} for length, values in sorted(rows.items())]


def sample_instances(scores: pa.Table, *, rows: int, seed: int) -> dict[tuple[str, str], list[str]]:
    """Up to `rows` scored instance ids per (family, task), spread evenly over the lengths.

    Deterministic: each task draws from its own generator seeded with the suite seed and the task's name,
    over ids sorted first, so the same scores give the same sample on any machine and rerun.
    """
    by_task: dict[tuple[str, str], dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for row in scores.select(["family", "task", "target_length", "instance_id"]).to_pylist():
        by_task[(row["family"], row["task"])][row["target_length"]].append(row["instance_id"])
    out: dict[tuple[str, str], list[str]] = {}
    for (family, task), lengths in sorted(by_task.items()):
        rng = np.random.default_rng([seed, _stable_int(f"{family}/{task}")])
        queues = [[ids[i] for i in rng.permutation(len(ids))] for _, ids in
                  sorted((length, sorted(ids)) for length, ids in lengths.items())]
        picked: list[str] = []
        while len(picked) < rows and any(queues):
            for queue in queues:  # round robin: one per length per pass
                if queue and len(picked) < rows:
                    picked.append(queue.pop(0))
        out[(family, task)] = picked
    return out


def _stable_int(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


@dataclass(frozen=True)
class InstanceTable:
    """One task's sampled instances with outputs and scores, ready for `wandb.Table(columns, data)`."""

    key: str
    columns: tuple[str, ...]
    rows: list[list[Any]]


def instance_tables(scores: pa.Table, instances: pa.Table, predictions: pa.Table, *, rows: int, seed: int,
                    prompts: Mapping[str, str] | None = None, text_chars: int = 1000) -> list[InstanceTable]:
    """Per task, `rows` sampled instances (`sample_instances`) joined with their prediction and score.

    Args:
        scores: score rows (`SCORE_SCHEMA`): which instances count, and how they scored.
        instances: instance metadata without the prompt (`target_length`, `input_tokens`, `references`, ...).
        predictions: one final prediction per instance.
        prompts: instance id -> prompt (or its tail); prompts are large, so only the sampled ones are read.
        text_chars: characters kept of a prompt (its tail, where the question is) and an output.
    """
    if rows <= 0 or scores.num_rows == 0:
        return []
    meta = {r["instance_id"]: r for r in instances.to_pylist()}
    preds = {r["instance_id"]: r for r in predictions.to_pylist()}
    score_rows = {r["instance_id"]: r for r in scores.to_pylist()}
    out = []
    for (family, task), ids in sample_instances(scores, rows=rows, seed=seed).items():
        data = []
        for iid in sorted(ids, key=lambda i: (score_rows[i]["target_length"], i)):
            s, m, p = score_rows[iid], meta.get(iid, {}), preds.get(iid, {})
            data.append([
                iid, s["target_length"], s.get("depth"), s.get("complexity") or m.get("complexity") or "",
                m.get("input_tokens"), text_tail((prompts or {}).get(iid, ""), text_chars),
                json.dumps(m.get("references") or [], ensure_ascii=False), _clip(p.get("output") or "", text_chars),
                s.get("parsed_answer") or "", s["score"], s.get("error_type") or "", p.get("finish_reason") or "",
                p.get("output_tokens"),
            ])
        out.append(InstanceTable(key=instances_key(family, task), columns=INSTANCE_COLUMNS, rows=data))
    return out


def text_tail(text: str, chars: int) -> str:
    """The last `chars` characters of a prompt, where its question is (`…` marks a cut; none for `chars <= 0`)."""
    if chars <= 0:
        return ""
    return text if len(text) <= chars else "…" + text[-chars:]


def _clip(text: str, chars: int) -> str:
    """Head and tail of a long output: the reasoning starts at the head, the answer sits at the tail."""
    if chars <= 0 or len(text) <= chars:
        return text
    half = max(1, chars // 2)
    return f"{text[:half]} […] {text[-half:]}"


@dataclass(frozen=True)
class LineSpec:
    """A line chart (`wandb.plot.line_series`): one series per name, each with its own xs."""

    key: str
    title: str
    x_name: str
    series: dict[str, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class HeatmapSpec:
    """A depth x length heatmap: `values[i][j]` at `depths[i]` and `lengths[j]` (None where empty)."""

    key: str
    table_key: str
    title: str
    depths: list[float]
    lengths: list[int]
    values: list[list[float | None]]
    counts: list[list[int]]


def plot_specs(tables: Mapping[str, pa.Table], scores: pa.Table | None = None) -> list[LineSpec | HeatmapSpec]:
    """The charts of a run: per family, every task's score against length (`plots/<family>/lengths`), the
    cumulative curves (`plots/<family>/cumulative`), per task its score with the 95 % interval
    (`plots/<family>/<task>`), and the depth x length heatmaps (a family's own grid where its tables have one,
    as TAIL's; else binned from the scores)."""
    specs: list[LineSpec | HeatmapSpec] = []
    tasks = tables.get("tasks")
    if tasks is None or tasks.num_rows == 0:
        return specs
    by_family: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in tasks.to_pylist():
        by_family[row["family"]][row["task"]].append(row)
    family_avg: dict[str, list[dict]] = defaultdict(list)
    for row in (tables["lengths"] if "lengths" in tables else length_table(tasks)).to_pylist():
        family_avg[row["family"]].append(row)
    cumulative: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in tables["cumulative"].to_pylist() if "cumulative" in tables else []:
        cumulative[row["family"]][row["task"]].append(row)
    for family, per_task in sorted(by_family.items()):
        series = {task: _xy(rows, "score") for task, rows in sorted(per_task.items())}
        series["avg"] = _xy(family_avg[family], "score")
        specs.append(LineSpec(plot_key(family, "lengths"), f"{family}: score (%) against context length",
                              STEP_METRIC, series))
        if cumulative[family]:
            curves = {task: _xy(rows, "score_upto") for task, rows in sorted(cumulative[family].items())}
            specs.append(LineSpec(plot_key(family, "cumulative"), f"{family}: cumulative score up to each length",
                                  STEP_METRIC, curves))
        for task, rows in sorted(per_task.items()):
            specs.append(LineSpec(plot_key(family, task), f"{family}/{task}: score (%) with its 95 % interval",
                                  STEP_METRIC, {c: _xy(rows, c) for c in ("score", "ci_low", "ci_high")}))
    own_grid = set()
    for family in FAMILIES.values():
        for table in family.tables:
            if table.heatmap is not None:
                own_grid.add(family.name)
                if table.name in tables and tables[table.name].num_rows:
                    specs.append(_heatmap(family.name, table.heatmap(tables[table.name]), binned=False))
    binned: dict[str, list[dict]] = defaultdict(list)
    for row in depth_grid(scores).to_pylist() if scores is not None else []:
        if row["family"] not in own_grid:
            binned[row["family"]].append(row)
    for family, rows in sorted(binned.items()):
        specs.append(_heatmap(family, rows, binned=True))
    return specs


def _xy(rows: Iterable[Mapping[str, Any]], column: str) -> tuple[list[float], list[float]]:
    points = sorted((r["target_length"], r[column]) for r in rows if r.get(column) is not None)
    return [p[0] for p in points], [p[1] for p in points]


def _heatmap(family: str, rows: list[dict], *, binned: bool) -> HeatmapSpec:
    depths = sorted({r["depth"] for r in rows})
    lengths = sorted({r["target_length"] for r in rows})
    cells = {(r["depth"], r["target_length"]): r for r in rows}
    values = [[cells[(d, n)]["score"] if (d, n) in cells else None for n in lengths] for d in depths]
    counts = [[cells[(d, n)]["n"] if (d, n) in cells else 0 for n in lengths] for d in depths]
    what = f"depth bin ({DEPTH_BIN:g} % wide)" if binned else "depth"
    return HeatmapSpec(heatmap_key(family), grid_key(family), f"{family}: score (%) by {what} and length",
                       depths, lengths, values, counts)


def config_payload(cfg: Config, versions: Mapping[str, Any] | None = None, *, run_root: str | None = None,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The W&B run config: the run root's redacted config (`config.to_yaml`), `versions.json` and the root, the
    whole passed through the run's `Redactor` again (the root and the versions may hold URLs too)."""
    from omegaconf import OmegaConf

    values: dict[str, Any] = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg, environ)), resolve=True)  # type: ignore[assignment]
    values["versions"] = dict(versions or {})
    values["run_root"] = run_root or cfg.run_root
    return redactor(cfg, environ).tree(values)


def results_files(root: RunRoot) -> list[str]:
    """Run-root files of the results artifact: the Parquet summaries and scores, config and versions."""
    names = [f"summary/{n}.parquet" for n in sorted(root.shard_names("summary"))]
    names += [f"scores/{n}.parquet" for n in sorted(root.shard_names("scores"))]
    return names + [n for n in ("config.yaml", "versions.json", "summary.json") if root.exists(n)]
