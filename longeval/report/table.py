"""RULER-style results tables for the terminal: tasks by lengths, then the headline numbers.

Null answers and failed prompts are shown next to the scores because a low score from a model that answered
and a low score from a run that broke are different findings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from rich.console import Group
from rich.table import Table
from rich.text import Text

from longeval.errors import ConfigError

__all__ = ["LAYOUTS", "format_length", "render_breakdown", "render_comparison", "render_declared", "render_errors",
           "render_heatmap", "render_ladder", "render_results"]

_MISSING = "–"


def format_length(n: int) -> str:
    """A token length as RULER writes it: 4096 -> "4K", 131072 -> "128K", 1048576 -> "1M".

    Only powers of two get a suffix; any other length (e.g. 100000) is printed in full so nobody mistakes
    it for a binary multiple.
    """
    if n <= 0 or n & (n - 1):
        return str(n)
    if n >= 1 << 20:
        return f"{n >> 20}M"
    if n >= 1 << 10:
        return f"{n >> 10}K"
    return str(n)


def render_results(summary: pa.Table, length_tbl: pa.Table, head: pa.Table, *, incomplete: bool = False) -> Group:
    """One table per (model_id, family), as returned by `summarise`, `length_table` and `headline`.

    Rows are tasks, columns are lengths, cells are scores (×100); a `nulls` column totals the empty answers
    of each task over all lengths, and an `Avg` row gives the per-length score. Below each table, one line
    with Avg, wAvg(inc), wAvg(dec) and the effective length, plus any prompts too long or engine errors.
    Each cell carries its instance count and 95 % interval (0.00 of 2 instances is not 0.00 of 500); a cell
    whose every instance failed before the model answered says how, instead of a score; `incomplete` marks the
    title of a run with work still to do.
    """
    cells: dict[tuple[str, str], dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for row in summary.to_pylist():
        cells[(row["model_id"], row["family"])][row["task"]][row["target_length"]] = row
    averages: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for row in length_tbl.to_pylist():
        averages[(row["model_id"], row["family"])][row["target_length"]] = row["score"]
    headlines = {(row["model_id"], row["family"]): row for row in head.to_pylist()}

    renderables: list[Table | Text] = []
    for key in sorted(cells.keys() | averages.keys()):
        tasks = cells.get(key, {})
        scored = {length for by_length in tasks.values() for length in by_length}
        lengths = sorted(scored | averages[key].keys())
        renderables.append(_model_table(key, tasks, lengths, averages[key], incomplete=incomplete))
        renderables.append(_headline_line(headlines.get(key), tasks))
    return Group(*renderables)


def _model_table(
    key: tuple[str, str], tasks: dict[str, dict[int, dict]], lengths: list[int], averages: dict[int, float], *,
    incomplete: bool = False,
) -> Table:
    model_id, family = key
    title = Text(f"{model_id} · {family}")
    if incomplete:
        title.append("  INCOMPLETE RUN: partial results", style="bold yellow")
    table = Table(title=title, title_justify="left",
                  caption=Text("cells: score ×100, 95 % interval [low–high] and n instances"), caption_justify="left")
    table.add_column("task")
    for length in lengths:
        table.add_column(format_length(length), justify="right")
    table.add_column("nulls", justify="right")

    for task in sorted(tasks):
        by_length = tasks[task]
        scores = [_result_cell(by_length.get(length)) for length in lengths]
        nulls = sum(row["nulls"] for row in by_length.values())
        table.add_row(task, *scores, str(nulls))
    table.add_section()
    nulls_total = sum(row["nulls"] for by_length in tasks.values() for row in by_length.values())
    table.add_row(
        "Avg",
        *[_score_cell(averages.get(length)) for length in lengths],
        str(nulls_total),
        style="bold",
    )
    return table


def _headline_line(row: dict | None, tasks: dict[str, dict[int, dict]]) -> Text:
    if row is None:
        return Text("no headline numbers (no per-length scores)")
    effective = row["effective_length"]
    threshold = f"{row['threshold']:g}"
    effective_text = (
        f"effective length {format_length(effective)} (> {threshold})"
        if effective is not None
        else f"effective length: none (no length > {threshold})"
    )
    if row.get("effective_length_high") is not None:  # intervals: absent from summaries written before them
        low = row.get("effective_length_low")
        effective_text += f", 95% CI {format_length(low) if low is not None else 'none'}–" \
                          f"{format_length(row['effective_length_high'])}"
    parts = [
        f"Avg {row['avg']:.2f}{_interval(row, 'avg')}",
        f"wAvg(inc) {row['wavg_inc']:.2f}{_interval(row, 'wavg_inc')}",
        f"wAvg(dec) {row['wavg_dec']:.2f}{_interval(row, 'wavg_dec')}",
        effective_text,
    ]
    too_long = sum(r["too_long"] for by_length in tasks.values() for r in by_length.values())
    errors = sum(r["errors"] for by_length in tasks.values() for r in by_length.values())
    if too_long:
        parts.append(f"{too_long} prompt(s) too long (scored 0)")
    if errors:
        parts.append(f"{errors} engine error(s) (scored 0)")
    return Text(" · ".join(parts))


def _interval(row: dict, name: str) -> str:
    """" [low, high]" when the headline row has the number's interval, else ""."""
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    return "" if low is None or high is None else f" [{low:.2f}, {high:.2f}]"


FAILURES = {"too_long": "all too long", "errors": "all engine errors"}
"""Failure columns of `summarise` that, covering every instance of a cell, mean the model was never asked."""


def _result_cell(row: dict | None) -> Text | str:
    """Score, interval and n of one task x length; a cell whose every instance failed says how."""
    if row is None:
        return _MISSING
    for column, label in FAILURES.items():
        if row["n"] and row.get(column) == row["n"]:
            return Text(f"{label}\nn={row['n']}", style="bold red")
    low, high = row.get("ci_low"), row.get("ci_high")
    interval = f"[{low:.0f}–{high:.0f}] " if low is not None and high is not None else ""
    return Text(f"{row['score']:.2f}\n") + Text(f"{interval}n={row['n']}", style="dim")


def _score_cell(score: float | None) -> str:
    return _MISSING if score is None else f"{score:.2f}"


def render_ladder(ladder: pa.Table) -> Table:
    """Scores of the tasks that share one context, rung by rung (SYNC: retrieval, tracking, global)."""
    rungs = [c for c in ladder.column_names if c not in ("model_id", "domain", "target_length")]
    table = Table(title="same context, harder questions (SYNC)", title_justify="left")
    for col in ("model", "domain", "length", *rungs):
        table.add_column(col, justify="right" if col in (*rungs, "length") else "left")
    for row in ladder.to_pylist():
        table.add_row(row["model_id"], row["domain"], format_length(row["target_length"]),
                      *[_score_cell(row[r]) for r in rungs])
    return table


def render_errors(errors: pa.Table) -> Table:
    """How answers failed, per task and length: counts and shares of each kind (SYNC's Table 5)."""
    kinds = sorted(set(errors["error_type"].to_pylist()))
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for row in errors.to_pylist():
        cells[(row["model_id"], row["task"], row["target_length"])][row["error_type"]] = row
    table = Table(title="kinds of failure (% of instances)", title_justify="left")
    for col in ("model", "task", "length", *kinds):
        table.add_column(col, justify="left" if col in ("model", "task") else "right")
    for (model_id, task, length), by_kind in sorted(cells.items()):
        table.add_row(model_id, task, format_length(length),
                      *[f"{by_kind[k]['share']:.1f}" if k in by_kind else _MISSING for k in kinds])
    return table


def render_breakdown(breakdown: pa.Table) -> Table:
    """LongBench v2's Table 2 layout: overall, by difficulty, by length, by domain; accuracy and the
    compensated accuracy of its Table 5 (an unparseable answer counts as a 0.25 guess)."""
    table = Table(title="LongBench v2 (accuracy / compensated, % invalid)", title_justify="left")
    for col in ("model", "split", "group", "n", "accuracy", "compensated", "invalid"):
        table.add_column(col, justify="right" if col in ("n", "accuracy", "compensated", "invalid") else "left")
    for row in breakdown.to_pylist():
        table.add_row(row["model_id"], row["split"], row["group"], str(row["n"]), _score_cell(row["accuracy"]),
                      _score_cell(row["compensated_accuracy"]), _score_cell(row["invalid_rate"]))
    return table


def render_heatmap(grid: pa.Table) -> Table:
    """TAIL's depth × length accuracy (its Figure 5) as a table: depths down, lengths across, per model."""
    cells: dict[str, dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in grid.to_pylist():
        cells[row["model_id"]][row["depth"]][row["target_length"]] = row["accuracy"]
    lengths = sorted({row["target_length"] for row in grid.to_pylist()})
    table = Table(title="TAIL accuracy by depth (rows, %) and length", title_justify="left")
    for col in ("model", "depth", *[format_length(n) for n in lengths]):
        table.add_column(col, justify="left" if col == "model" else "right")
    for model_id, by_depth in sorted(cells.items()):
        for depth in sorted(by_depth):
            table.add_row(model_id, f"{depth:g}", *[_score_cell(by_depth[depth].get(n)) for n in lengths])
    return table


def render_comparison(comparison: pa.Table, *, title: str = "B − A, paired on shared instances") -> Table:
    """`longeval compare`'s table (`compare.COMPARISON_SCHEMA`): per family, task and length the means of A and
    B, the difference with its 95 % bootstrap interval and the paired test's p-value; a pooled `overall` row
    closes each family. Green: the interval lies above 0; red: below."""
    table = Table(title=title, title_justify="left")
    for col in ("family", "task", "length", "n", "A", "B", "B − A", "95% CI", "p", "test"):
        text = col in ("family", "task", "test")
        table.add_column(col, justify="left" if text else "right", no_wrap=not text)  # numbers never wrap
    for row in comparison.to_pylist():
        overall = row["target_length"] is None
        style = "green" if row["ci_low"] > 0 else "red" if row["ci_high"] < 0 else ""
        p = row["p_value"]
        table.add_row(row["family"], row["task"], "all" if overall else format_length(row["target_length"]),
                      str(row["n"]), f"{row['mean_a']:.2f}", f"{row['mean_b']:.2f}",
                      Text(f"{row['diff']:+.2f}", style=style), Text(f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]",
                                                                      style=style),
                      "< 0.001" if p < 0.001 else f"{p:.3f}", row["test"], style="bold" if overall else None,
                      end_section=overall)
    return table


LAYOUTS: dict[str, Callable[[pa.Table], Table]] = {
    "ladder": render_ladder,
    "heatmap": render_heatmap,
    "breakdown": render_breakdown,
}
"""The table layouts a family may declare by name (`SummaryTable.render`): its table in, a rich table out."""


def render_declared(render: str | Callable[[pa.Table], Any] | None, table: pa.Table) -> Any:
    """A family's table as its declaration says (`SummaryTable.render`): a layout by name, its own function, or
    nothing (None)."""
    if render is None:
        return None
    if isinstance(render, str):
        if render not in LAYOUTS:
            raise ConfigError(f"a family's table declares render={render!r}; layouts: {', '.join(sorted(LAYOUTS))}")
        return LAYOUTS[render](table)
    return render(table)
