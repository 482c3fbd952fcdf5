"""Key names of what a tracked run logs: the one place they are spelled.

`longeval.tracking.payloads` builds the run's payloads under these keys and `longeval.tracking.dashboards` asks for
the same ones, so a dashboard can never ask for a key that is not logged.
"""

from __future__ import annotations

import re

from longeval.tasks import FAMILIES

__all__ = [
    "COUNT_METRICS",
    "HEADLINE_METRICS",
    "RESULT_TABLES",
    "STEP_METRIC",
    "avg_key",
    "count_key",
    "cumulative_key",
    "curve_key",
    "family_avg_key",
    "family_metric_key",
    "grid_key",
    "headline_key",
    "heatmap_key",
    "instances_key",
    "plot_key",
    "result_table_key",
    "slug",
    "task_key",
]

STEP_METRIC = "target_length"
"""The x axis of the length curves logged as history, so W&B line plots overlay runs by length."""

HEADLINE_METRICS = ("avg", "wavg_inc", "wavg_dec", "effective_length")
"""RULER's headline numbers (`aggregate.headline`), logged per suite and per family."""

COUNT_METRICS = ("instances", "nulls", "too_long", "errors")
"""Instance and failure counts over the whole job, so a broken run stands out on a leaderboard."""

RESULT_TABLES = ("headline", "lengths", "errors",
                 *(t.name for f in FAMILIES.values() for t in f.tables if t.log),
                 "adaptive", "adaptive_lengths", "adaptive_groups")
"""Small summary tables also logged as W&B tables (the per-family views of the report), each under
`result_table_key(name)`."""


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
