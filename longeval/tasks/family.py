"""What a benchmark family declares, so that core code loops over families and never names one.

A family is one package under `longeval/tasks/` with a `FAMILY`: its tasks (each with its judge bound), the
summary tables its paper reports besides the common ones (built from the family's scores, written under
`summary/<name>`, shown in the terminal, logged to W&B with their summary metrics), the words the HTML report
puts above its section, its own views in the W&B dashboards, and the skill group of each task (which adaptive
runs report an effective length for). Registering it in
`longeval.tasks.FAMILIES` is the only other step (plus its `conf/suite` files).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from longeval.stats.aggregate import EFFECTIVE_LENGTH_THRESHOLD
from longeval.tasks.base import TaskSpec

ScoreRows = Mapping[str, list[dict[str, Any]]]
"""A family's score rows per model id, each with its instance's `meta` JSON under "meta"."""


@dataclass(frozen=True)
class Threshold:
    """The score (points, 0-100) a length must exceed to count toward a family's effective length, and where it
    comes from: the report prints `source` beside every effective length the threshold decides."""

    value: float
    source: str


RULER_THRESHOLD = Threshold(EFFECTIVE_LENGTH_THRESHOLD, "RULER's threshold: Llama-2-7B's mean score at 4K "
                                                        "(RULER §4, Table 3)")


def borrowed_threshold(title: str) -> Threshold:
    """RULER's threshold for a family whose paper sets none, saying so wherever it is printed."""
    return Threshold(EFFECTIVE_LENGTH_THRESHOLD, f"RULER's threshold (Llama-2-7B at 4K, RULER §4), borrowed: the "
                                                 f"{title} paper defines no effective-length threshold")


@dataclass(frozen=True)
class SummaryTable:
    """One of a family's own tables (SYNC's ladder, LongBench v2's Table 2, TAIL's grid ...).

    `build(tasks, rows)` gets the run's per task x length summary (`summary/tasks`, this family's rows) and the
    family's score rows with meta; it is pure. `render` says how the terminal shows it after the results: one of
    the layouts `longeval.report` draws (`LAYOUTS`: "ladder", "heatmap", "breakdown"), so a family needs no
    report code, or the family's own function of the table to a rich renderable; None prints nothing. `log` sends
    the table to W&B as `results/<name>`.
    """

    name: str
    title: str
    build: Callable[[pa.Table, ScoreRows], pa.Table]
    render: str | Callable[[pa.Table], Any] | None = None
    log: bool = True
    metrics: Callable[[pa.Table], dict[str, float]] | None = None
    """The table's W&B summary metrics by name under the family: `breakdown/hard` is logged as
    `longbench_v2/breakdown/hard` (each `/`-separated part made W&B-safe by `tracking.family_metric_key`)."""
    heatmap: Callable[[pa.Table], list[dict[str, Any]]] | None = None
    """Set when the table is the family's own depth x length grid (TAIL's Figure 5): its cells, each with
    `target_length`, `depth`, `n` and `score` (%). W&B shows them as the family's heatmap instead of the one
    binned from the scores."""


@dataclass(frozen=True)
class Panel:
    """One of a family's own views in its section of the W&B dashboards (`longeval.tracking.dashboards`)."""

    title: str = ""
    """Shown after the family's title (`LongBench v2: accuracy by domain (%)`); unused for a table."""
    metrics: tuple[str, ...] = ()
    """Bars of these summary metrics, named as the family's `SummaryTable.metrics` name them."""
    table: str | None = None
    """Instead, a logged result table (`results/<table>`): one of the family's or a common one (`errors`)."""


@dataclass(frozen=True)
class ReportSection:
    """One of a family's own sections of the HTML report, as `Panel` is one of its W&B views: the family names the
    summary tables and the words, `longeval.report` draws them in a layout it knows, so no family needs report code.

    Every family with `has_depth` also gets a depth x length heatmap binned from its scores, unless it declares
    its own grid (`layout="heatmap"`).
    """

    layout: str
    """How the report draws `table`: "ladder" (each rung's score per domain against length, and the ladder's
    rows), "errors" (stacked shares of each kind of failure, and their rows), "cumulative" (cumulative and
    pointwise curves per task), "breakdown" (accuracy by split and group, bars and rows) or "heatmap" (the
    family's own depth x length grid, with `depth`, `target_length` and `accuracy` columns)."""
    title: str
    table: str
    """The summary table drawn: one of the family's `SummaryTable` names, or a common one (`cumulative`,
    `errors`)."""
    caption: str = ""
    alt: str = ""
    """The figure's text alternative (what it shows, for a reader who cannot see it)."""
    rows: str | None = None
    """A second summary table shown under the figure: `chance` rates (columns task, chance, paper, model) under
    "cumulative", a `headline` table (shortest, longest, avg, wavg_inc, wavg_dec, ratio) under "heatmap"."""
    rows_caption: str = ""


@dataclass(frozen=True)
class Sampling:
    """A paper's way of spreading instances over lengths, chosen by `suite.subsets` (Michelangelo §3.2: stacked
    "up to" subsets, each length weighted by 1 / (subsets containing it) in cumulative curves)."""

    choices: tuple[str, ...]
    counts: Callable[[Sequence[int], Sequence[str], int], dict[int, int]]
    """(lengths, subsets, samples) -> instances per length."""
    weights: Callable[[Sequence[int], Sequence[str]], dict[int, float]]
    """(lengths, subsets) -> each length's weight in the cumulative curves."""


@dataclass(frozen=True)
class SampleData:
    """Where a family's sample data files are, once written: what `Family.sample_data` returns."""

    data: Mapping[str, str] = field(default_factory=dict)
    """`DataPaths` field -> path (`squad_path`, `longbench_v2_path`, ...)."""
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Task key, bare name or family -> parameter overrides, as `suite.params` (TAIL's `dataset`): how a family
    that reads a data file of its own is pointed at it."""


@dataclass(frozen=True)
class Family:
    """A benchmark family, as its paper defines it."""

    name: str
    """The `family` column of every record (`ruler`, `sync`, ...)."""
    title: str
    """How the report names it (`RULER`, `LongBench v2`)."""
    tasks: tuple[TaskSpec, ...]
    intro: str = ""
    """The paragraph above the family's section of the HTML report: how to read its numbers. Required:
    `longeval.tasks.register` refuses a family without one."""
    tables: tuple[SummaryTable, ...] = ()
    skill_groups: Mapping[str, str] = field(default_factory=dict)
    """Task name -> skill group (RULER §3: retrieval, multi-hop tracking, aggregation, QA); a task not listed
    is in a group named after the family."""
    sampling: Sampling | None = None
    """How `suite.subsets` spreads instances over lengths, for the family whose paper defines it."""
    has_depth: bool = True
    """Its instances put the information at a depth of the context; False for whole documents (LongBench v2),
    whose dashboards then show no depth x length heatmap."""
    cumulative_curves: bool = False
    """Its paper reads cumulative "up to length L" curves (Michelangelo's Figures 1-8): the dashboards show one
    per task."""
    panels: tuple[Panel, ...] = ()
    """Its own views in the dashboards, after its headline bars and length curves."""
    report: tuple[ReportSection, ...] = ()
    """Its own sections of the HTML report, after its curves and per-run tables (`ReportSection`)."""
    task_curves_caption: str = "Score per task against length; the shaded band is the 95 % interval."
    """The caption under the report's per-task curves."""
    threshold_on_task_curves: bool = False
    """Draw the effective-length threshold on the per-task curves too (RULER reads each task against it)."""
    sample_data: Callable[[Path], SampleData] | None = None
    """For a family whose tasks read data files (`TaskSpec.needs`, or a parameter naming a file): writes small
    synthetic files in the real format under the given folder and says where they are. The tests over every
    registered family generate from them (`tests/task_instances.py`), so such a family adds its sample here, in
    its own package, not in a test file; a user can also try the family with it before downloading anything."""

    threshold: Threshold | None = None
    """The bar its effective length is read against (`suite.effective_threshold` overrides it for a run). Each
    built-in family declares one; unset reads as `borrowed_threshold(title)`."""

    def skill_group(self, task: str) -> str:
        return self.skill_groups.get(task, self.name)

    @property
    def effective_threshold(self) -> Threshold:
        return self.threshold or borrowed_threshold(self.title)
