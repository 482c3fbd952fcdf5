"""Experiment tracking: one Weights & Biases run per (model, suite) job, next to the run root.

Two layers. The pure one turns what the summarise stage wrote into payloads — `summary_metrics`,
`length_history`, `instance_tables`, `plot_specs`, `config_payload` — with key names built by the
`*_key` functions below, which `longeval.tracking.dashboards` uses too, so a dashboard can never ask for a key that
is not logged. The thin side-effect layer (`WandbTracker`) hands those payloads to wandb and records each
hand-over in `tracker.logged`, which is what tests check (wandb's offline files have no Python reader).

Tracking never fails or blocks an evaluation: every W&B call is guarded, and an error becomes a warning (on
the `longeval.tracking.wandb_run` logger and as a `TrackingWarning`) while the run goes on. Nothing here imports wandb
unless `tracking.backend=wandb`. No credential reaches W&B: the config, the run's name, group and tags, and every
warning pass through the run's `Redactor` (`config.redactor`, the one config.yaml and the engine records are written
through), and wandb's own capture of the command line, git remote and console is off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import netrc
import os
import re
import secrets
import tempfile
import textwrap
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longeval.config.schema import Config, redactor, to_yaml
from longeval.errors import LongevalError
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, latest_predictions
from longeval.stats.aggregate import EFFECTIVE_LENGTH_THRESHOLD, headline, length_table
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName
from longeval.tasks import FAMILIES

__all__ = [
    "COUNT_METRICS",
    "HEADLINE_METRICS",
    "INSTANCE_COLUMNS",
    "RESULT_TABLES",
    "STATE_FILE",
    "STEP_METRIC",
    "HeatmapSpec",
    "InstanceTable",
    "LineSpec",
    "Logged",
    "NullTracker",
    "Tracker",
    "TrackingError",
    "TrackingWarning",
    "WandbTracker",
    "avg_key",
    "config_payload",
    "count_key",
    "cumulative_key",
    "curve_key",
    "depth_grid",
    "family_avg_key",
    "family_metric_key",
    "grid_key",
    "has_credentials",
    "headline_key",
    "heatmap_key",
    "instance_tables",
    "instances_key",
    "length_history",
    "load_tables",
    "plot_key",
    "plot_specs",
    "result_table_key",
    "results_files",
    "sample_instances",
    "start_tracking",
    "summary_metrics",
    "task_key",
]

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
"""In the run root: the W&B run id (so a resumed job resumes its W&B run) and what was last logged."""

STEP_METRIC = "target_length"
"""The x axis of the length curves logged as history, so W&B line plots overlay runs by length."""

HEADLINE_METRICS = ("avg", "wavg_inc", "wavg_dec", "effective_length")
"""RULER's headline numbers (`aggregate.headline`), logged per suite and per family."""

COUNT_METRICS = ("instances", "nulls", "too_long", "errors")
"""Instance and failure counts over the whole job, so a broken run stands out on a leaderboard."""

INSTANCE_COLUMNS = ("instance_id", "target_length", "depth", "complexity", "input_tokens", "prompt_tail",
                    "references", "output", "parsed_answer", "score", "error_type", "finish_reason",
                    "output_tokens")
"""Columns of the per-task instance tables (instances, predictions and scores joined by instance_id)."""

RESULT_TABLES = ("headline", "lengths", "errors",
                 *(t.name for f in FAMILIES.values() for t in f.tables if t.log),
                 "adaptive", "adaptive_lengths", "adaptive_groups")
"""Small summary tables also logged as W&B tables (the per-family views of the report)."""

DEPTH_BIN = 10.0
"""Depth bins (percent) of the depth x length heatmaps computed from scores (RULER's 40 depths -> 10 bins)."""


# -- key names: the one place they are spelled ------------------------------------------------------


def slug(text: str) -> str:
    """A key part W&B keeps as is: lower case, `[a-z0-9_-]` (LongBench v2's domains have spaces)."""
    return re.sub(r"[^a-z0-9_-]+", "_", str(text).lower()).strip("_") or "_"


def task_key(family: str, task: str, length: int) -> str:
    """Score of one task at one length, e.g. `ruler/niah_single_1/4096`."""
    return f"{family}/{task}/{int(length)}"


def family_avg_key(family: str, length: int) -> str:
    """A family's per-length score (mean over its tasks), e.g. `ruler/avg/4096`."""
    return f"{family}/avg/{int(length)}"


def avg_key(length: int) -> str:
    """The suite's per-length score (mean over all its task scores), e.g. `avg/4096`."""
    return f"avg/{int(length)}"


def headline_key(metric: str, family: str | None = None) -> str:
    """`headline/avg` for the suite, `ruler/headline/avg` for one family."""
    return f"{family}/headline/{metric}" if family else f"headline/{metric}"


def count_key(metric: str) -> str:
    return f"count/{metric}"


def family_metric_key(family: str, name: str) -> str:
    """A metric of a family's own table (`SummaryTable.metrics`), each part made W&B-safe: `breakdown/Multi-Document
    QA` of LongBench v2 is `longbench_v2/breakdown/multi-document_qa`, TAIL's Table 2 `tail/tail_headline/ratio`."""
    return "/".join([family, *(slug(part) for part in name.split("/"))])


def curve_key(family: str | None = None, task: str | None = None) -> str:
    """History key of a length curve: `curve/avg`, `curve/ruler/avg` or `curve/ruler/niah_single_1`."""
    return "/".join(["curve", family or "avg", *([task or "avg"] if family else [])])


def cumulative_key(family: str, task: str) -> str:
    """History key of a cumulative ("up to length L") curve, e.g. `cumulative/michelangelo/mrcr`."""
    return f"cumulative/{family}/{task}"


def instances_key(family: str, task: str) -> str:
    return f"instances/{family}/{task}"


def plot_key(family: str, name: str) -> str:
    """A custom chart: `plots/ruler/lengths`, `plots/ruler/cumulative` or `plots/ruler/<task>`."""
    return f"plots/{family}/{name}"


def heatmap_key(family: str) -> str:
    """The depth x length heatmap image of a family, e.g. `heatmaps/tail`."""
    return f"heatmaps/{family}"


def grid_key(family: str) -> str:
    """The depth x length grid behind a heatmap, as a table."""
    return f"grids/{family}"


def result_table_key(name: str) -> str:
    return f"results/{name}"


# -- pure payload builders --------------------------------------------------------------------------


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
                m.get("input_tokens"), _tail((prompts or {}).get(iid, ""), text_chars),
                json.dumps(m.get("references") or [], ensure_ascii=False), _clip(p.get("output") or "", text_chars),
                s.get("parsed_answer") or "", s["score"], s.get("error_type") or "", p.get("finish_reason") or "",
                p.get("output_tokens"),
            ])
        out.append(InstanceTable(key=instances_key(family, task), columns=INSTANCE_COLUMNS, rows=data))
    return out


def _tail(text: str, chars: int) -> str:
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


def depth_grid(scores: pa.Table) -> pa.Table:
    """Mean score (x100) per family, length and depth bin, from score rows that have a depth (percent, >= 0).

    RULER's NIAH needles sit at 40 depths; binned by `DEPTH_BIN` they give its depth x length heatmap.
    A family with its own grid (`SummaryTable.heatmap`: TAIL's Figure 5) gets that one from `plot_specs`.
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


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


# -- the side-effect layer --------------------------------------------------------------------------


class TrackingError(LongevalError):
    """W&B cannot be used for a command that needs it (dashboards): no credentials, no network."""


class TrackingWarning(UserWarning):
    """A W&B call failed; the evaluation went on without it."""


@dataclass(frozen=True)
class Logged:
    """One hand-over to wandb: `kind` (init, config, history, summary, table, plot, image, artifact, finish,
    skip, warning), the W&B `key`, and what was handed (a dict of numbers, a table's shape, a message)."""

    kind: str
    key: str
    value: Any = None


class Tracker(Protocol):
    """What `pipeline.run` calls: `start` after provenance, `log_results` after report, `finish` at the end."""

    logged: list[Logged]
    warnings: list[str]

    def start(self) -> None: ...
    def log_results(self) -> None: ...
    def finish(self, *, failed: bool = False) -> None: ...
    def describe(self) -> str | None: ...


@dataclass
class NullTracker:
    """`tracking.backend=none`: does nothing, imports nothing."""

    logged: list[Logged] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def start(self) -> None:
        return None

    def log_results(self) -> None:
        return None

    def finish(self, *, failed: bool = False) -> None:
        return None

    def describe(self) -> str | None:
        return None


def start_tracking(cfg: Config, root: RunRoot) -> Tracker:
    """The job's tracker, started (`tracking.backend=none`: a no-op that never imports wandb)."""
    tracker: Tracker = WandbTracker(cfg, root) if cfg.tracking.backend == "wandb" else NullTracker()
    tracker.start()
    return tracker


def has_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """Whether W&B credentials are at hand: WANDB_API_KEY, an identity token file, or a `wandb login` netrc
    entry for the W&B host — checked without a network call."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        auth = netrc.netrc(env.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


class WandbTracker:
    """One W&B run for one job: started (or resumed) with the run root, fed from what report wrote.

    Every wandb call goes through `_guard`, so an error is a warning and never reaches the evaluation.
    """

    def __init__(self, cfg: Config, root: RunRoot) -> None:
        self.cfg = cfg
        self.root = root
        self.logged: list[Logged] = []
        self.warnings: list[str] = []
        self.run: Any = None
        self.run_id: str | None = None
        self.mode: str | None = None
        self.run_dir: Path | None = None
        self._redactor = redactor(cfg)
        self._finished = False

    @property
    def name(self) -> str:
        """The W&B run name: the run root's name (`<model>-<suite>-seed<seed>` by default)."""
        return self.cfg.run_root.rstrip("/").rsplit("/", 1)[-1]

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        state = _or(self._guard("read the tracking state", self._read_state), {})
        self.run_id = state.get("run_id") or _new_run_id()
        resumed = "run_id" in state
        self._guard("write the tracking state", self._write_state, {**state, "run_id": self.run_id})
        mode = self._mode()
        versions = _or(self._guard("read versions.json", self._versions), {})
        payload = _or(self._guard("build the config", config_payload, self.cfg, versions, run_root=self.root.uri),
                      None)
        run = self._guard(f"init ({mode})", self._init, mode, payload)
        if run is _FAILED and mode == "online" and _or(self._guard("look for other runs", _no_other_run), False):
            # Keep the results: the same run offline now, `wandb sync` later. A failed online init leaves its
            # run id registered in wandb's service process, so that service is restarted first.
            mode = "offline"
            run = self._guard("init (offline fallback)", self._offline_fallback, payload)
        if run is _FAILED:
            return
        self.run, self.mode = run, mode
        self.run_dir = _or(self._guard("find the run folder", lambda: Path(run.dir).parent), None)
        self._record("init", self.run_id, {"mode": mode, "resumed": resumed, "dir": str(self.run_dir),
                                           "project": self.cfg.tracking.project, "name": self.name})
        if payload is not None:
            self._record("config", "config", payload)

    def log_results(self) -> None:
        """Hand everything report wrote to the run; a part that fails is skipped with a warning."""
        if self.run is None:
            return
        tables = _or(self._guard("read the summaries", load_tables, self.root), {})
        if not tables:
            return
        metrics = _or(self._guard("build the summary", summary_metrics, tables), {})
        metrics |= status_metrics(_or(self._guard("read status.json", self._status), {}))
        state = _or(self._guard("read the tracking state", self._read_state), {})
        digest = _digest([metrics, self.run_id, self.cfg.tracking.project, self.cfg.tracking.entity])
        if state.get("logged") == digest:  # a rerun with the same results: curves and media are there already
            self._record("skip", "history", {"logged": digest})
        else:
            self._log_history(tables)
            self._log_media(tables)
            self._log_artifact()
        if metrics and self._guard("update the summary", self.run.summary.update, metrics) is not _FAILED:
            self._record("summary", "summary", metrics)
        self._guard("write the tracking state", self._write_state, {**state, "run_id": self.run_id, "logged": digest})

    def finish(self, *, failed: bool = False) -> None:
        """Close the run: finished, or failed (exit code 1) when a stage raised. Idempotent."""
        if self.run is None or self._finished:
            return
        self._finished = True
        exit_code = 1 if failed else 0
        if self._guard("finish", self.run.finish, exit_code=exit_code) is not _FAILED:
            self._record("finish", self.run_id or "", {"exit_code": exit_code})

    def describe(self) -> str | None:
        """Where the run went, for the end of the job's output (None when W&B could not be started)."""
        if self.run is None:
            return None
        if self.mode == "offline":
            return f"W&B run {self.run_id} (offline) in {self.run_dir}; upload it with: wandb sync {self.run_dir}"
        url = _or(self._guard("read the run URL", lambda: self.run.url), None)
        return f"W&B run {self.run_id}: {url or self.cfg.tracking.project}"

    # -- hand-overs ----------------------------------------------------------------------------------

    def _init(self, mode: str, payload: dict | None) -> Any:
        import wandb

        t = self.cfg.tracking
        settings = wandb.Settings(
            console="off",  # the evaluation's own output is not W&B's to keep
            x_disable_meta=True,  # no command line (overrides may carry credentials), no git remote
            disable_git=True,
            save_code=False,
            init_timeout=t.init_timeout,
            finish_timeout=t.finish_timeout,
        )
        hide = self._redactor.text
        tags = [hide(str(x)) for x in t.tags] or None
        run = wandb.init(
            project=t.project, entity=t.entity, group=hide(t.group) if t.group else None, tags=tags,
            name=hide(self.name), id=self.run_id, resume="allow", job_type="eval", dir=self._dir(),
            mode=mode, reinit="create_new", settings=settings,
        )
        try:
            if payload is not None:
                run.config.update(payload, allow_val_change=True)
            run.define_metric(STEP_METRIC, hidden=True)
            for prefix in ("curve", "cumulative"):
                run.define_metric(f"{prefix}/*", step_metric=STEP_METRIC, summary="none")
        except Exception:
            run.finish(exit_code=1)
            raise
        return run

    def _offline_fallback(self, payload: dict | None) -> Any:
        import wandb

        wandb.teardown()
        return self._init("offline", payload)

    def _log_history(self, tables: Mapping[str, pa.Table]) -> None:
        for row in _or(self._guard("build the length curves", length_history, tables), []):
            if self._guard("log a length curve row", self.run.log, row) is not _FAILED:
                self._record("history", f"{STEP_METRIC}={row[STEP_METRIC]}", row)

    def _log_media(self, tables: Mapping[str, pa.Table]) -> None:
        import wandb

        media: dict[str, Any] = {}
        scores = _or(self._guard("read the scores", self._scores), None)
        for table in _or(self._guard("build the instance tables", self._instance_tables, scores), []):
            obj = self._guard(f"build {table.key}", wandb.Table, columns=list(table.columns), data=table.rows)
            if obj is not _FAILED:
                media[table.key] = obj
                self._record("table", table.key, {"rows": len(table.rows), "columns": list(table.columns)})
        for spec in _or(self._guard("build the plots", plot_specs, tables, scores), []):
            if isinstance(spec, LineSpec):
                chart = self._guard(f"build {spec.key}", _line_chart, spec)
                if chart is not _FAILED:
                    media[spec.key] = chart
                    self._record("plot", spec.key, {"kind": "line_series", "series": sorted(spec.series)})
            else:
                image = self._guard(f"build {spec.key}", _heatmap_image, spec)
                grid = self._guard(f"build {spec.table_key}", _heatmap_table, spec)
                if image is not _FAILED:
                    media[spec.key] = image
                    self._record("image", spec.key, {"kind": "heatmap", "depths": spec.depths,
                                                     "lengths": spec.lengths})
                if grid is not _FAILED:
                    media[spec.table_key] = grid
                    self._record("table", spec.table_key, {"rows": len(spec.depths) * len(spec.lengths),
                                                           "columns": list(_GRID_COLUMNS)})
        for name in RESULT_TABLES:
            if name in tables and tables[name].num_rows:
                table = tables[name]
                obj = self._guard(f"build {name}", wandb.Table, columns=table.column_names,
                                  data=[list(r.values()) for r in table.to_pylist()])
                if obj is not _FAILED:
                    media[result_table_key(name)] = obj
                    self._record("table", result_table_key(name),
                                 {"rows": table.num_rows, "columns": table.column_names})
        if media and self._guard("log tables and plots", self.run.log, media) is _FAILED:
            self.logged[:] = [e for e in self.logged if e.key not in media or e.kind == "warning"]

    def _log_artifact(self) -> None:
        import wandb

        names = _or(self._guard("list the results", results_files, self.root), [])
        if not names:
            return
        artifact_name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"results-{self.name}")
        metadata = {"run_root": self._redactor.text(self.root.uri), "model": self.cfg.model.name,
                    "suite": self.cfg.suite.name, "files": names}

        def log_artifact() -> None:
            artifact = wandb.Artifact(artifact_name, type="results", metadata=metadata,
                                      description="longeval results: Parquet summaries and scores of one job")
            local = self.root.local_path()
            with tempfile.TemporaryDirectory(prefix="longeval-artifact-") as staging:
                for name in names:
                    if local is not None:
                        path = local / name
                    else:  # s3:// run roots: staged through the run root's own filesystem layer
                        path = Path(staging, name)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(self.root.read_bytes(name))
                    artifact.add_file(str(path), name=name)  # copied into wandb's staging area now
                self.run.log_artifact(artifact)

        if self._guard("log the results artifact", log_artifact) is not _FAILED:
            self._record("artifact", artifact_name, {"type": "results", "files": names})

    # -- helpers -------------------------------------------------------------------------------------

    def _instance_tables(self, scores: pa.Table | None) -> list[InstanceTable]:
        t = self.cfg.tracking
        if scores is None or scores.num_rows == 0 or t.table_rows <= 0:
            return []
        columns = ["instance_id", "family", "task", "target_length", "input_tokens", "references", "complexity",
                   "seed", "shard_index"]
        instances = self.root.read_stage("instances", INSTANCE_SCHEMA, columns=columns)
        predictions = latest_predictions(self.root.read_stage("predictions", PREDICTION_SCHEMA))
        sample = sample_instances(scores, rows=t.table_rows, seed=self.cfg.suite.seed)
        wanted = {i for ids in sample.values() for i in ids}
        prompts = self._prompt_tails(instances, wanted) if t.text_chars > 0 else {}
        return instance_tables(scores, instances, predictions, rows=t.table_rows, seed=self.cfg.suite.seed,
                               prompts=prompts, text_chars=t.text_chars)

    def _prompt_tails(self, instances: pa.Table, wanted: set[str]) -> dict[str, str]:
        """Tails of the sampled prompts, reading only the prompt column of the shards that hold them."""
        import pyarrow.parquet as pq

        if not wanted:
            return {}
        fs, paths = self.root.stage_files("instances")
        picked = instances.filter(pc.is_in(instances["instance_id"], pa.array(sorted(wanted), pa.string())))
        bases = {ShardName.of(r).prefix for r in picked.to_pylist()}
        out: dict[str, str] = {}
        chars = self.cfg.tracking.text_chars
        for path in paths:
            name = path.rsplit("/", 1)[-1].removesuffix(".parquet")
            if ShardName.parse(name).prefix not in bases:  # a shard, or its follow-ups
                continue
            table = pq.read_table(path, filesystem=fs, columns=["instance_id", "prompt"])
            for iid, prompt in zip(table["instance_id"].to_pylist(), table["prompt"].to_pylist(), strict=True):
                if iid in wanted:
                    out[iid] = _tail(prompt or "", chars)
        return out

    def _scores(self) -> pa.Table:
        return self.root.read_stage("scores", SCORE_SCHEMA)

    def _status(self) -> dict:
        return self.root.read_json("status.json") if self.root.exists("status.json") else {}

    def _versions(self) -> dict:
        return self.root.read_json("versions.json") if self.root.exists("versions.json") else {}

    def _read_state(self) -> dict:
        return self.root.read_json(STATE_FILE) if self.root.exists(STATE_FILE) else {}

    def _write_state(self, state: dict) -> None:
        self.root.write_json(STATE_FILE, {**state, "backend": "wandb", "project": self.cfg.tracking.project,
                                          "entity": self.cfg.tracking.entity})

    def _mode(self) -> str:
        mode = self.cfg.tracking.mode
        if mode == "online" and not has_credentials():
            self._warn("tracking.mode=online but no W&B credentials (set WANDB_API_KEY or run `wandb login`); "
                       "logging offline instead: `wandb sync` the run folder later")
            return "offline"
        return mode

    def _dir(self) -> str | None:
        """W&B's local folder: tracking.dir, $WANDB_DIR, a local run root, else wandb's default (cwd)."""
        if self.cfg.tracking.dir:
            return self.cfg.tracking.dir
        if os.environ.get("WANDB_DIR"):
            return os.environ["WANDB_DIR"]
        local = self.root.local_path()
        return str(local) if local is not None else None

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, or `_FAILED` after a warning: W&B must never fail the evaluation."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._warn(f"W&B {what} failed ({type(exc).__name__}: {_first_line(exc)}); the evaluation goes on "
                       "without it")
            return _FAILED

    def _warn(self, message: str) -> None:
        message = self._redactor.text(message)
        log.warning("%s", message)
        warnings.warn(message, TrackingWarning, stacklevel=3)
        self.warnings.append(message)
        self.logged.append(Logged("warning", "", message))

    def _record(self, kind: str, key: str, value: Any = None) -> None:
        self.logged.append(Logged(kind, key, value))


_FAILED: Any = object()
"""What `_guard` returns when the call raised (None is a legitimate result)."""


def _or(value: Any, default: Any) -> Any:
    return default if value is _FAILED else value

_GRID_COLUMNS = ("depth", "target_length", "n", "score")


def _no_other_run() -> bool:
    """Whether this process has no other live W&B run (restarting wandb's service would end it)."""
    import wandb

    return wandb.run is None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _new_run_id() -> str:
    """A W&B-style run id: 8 characters of [a-z0-9]."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _line_chart(spec: LineSpec) -> Any:
    import wandb

    names = list(spec.series)
    return wandb.plot.line_series(xs=[spec.series[n][0] for n in names], ys=[spec.series[n][1] for n in names],
                                  keys=names, title=spec.title, xname=spec.x_name)


def _heatmap_table(spec: HeatmapSpec) -> Any:
    import wandb

    data = [[d, n, spec.counts[i][j], spec.values[i][j]] for i, d in enumerate(spec.depths)
            for j, n in enumerate(spec.lengths)]
    return wandb.Table(columns=list(_GRID_COLUMNS), data=data)


def _heatmap_image(spec: HeatmapSpec) -> Any:
    """The heatmap drawn with matplotlib's object API (no pyplot, no global backend state)."""
    import wandb
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = np.array([[np.nan if v is None else v for v in row] for row in spec.values], dtype=float)
    fig = Figure(figsize=(max(5.0, 1.6 + 0.8 * len(spec.lengths)), max(3.0, 1.2 + 0.3 * len(spec.depths))), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(values, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(spec.lengths)), [str(n) for n in spec.lengths], fontsize=8)
    ax.set_yticks(range(len(spec.depths)), [f"{d:g}" for d in spec.depths], fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("depth (%)")
    ax.set_title("\n".join(textwrap.wrap(spec.title, 60)), fontsize=9)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if not np.isnan(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.0f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    canvas.draw()
    return wandb.Image(np.asarray(canvas.buffer_rgba())[..., :3].copy(), caption=spec.title)
