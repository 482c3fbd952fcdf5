"""The report's figures: pure functions from summary tables to matplotlib figures, and figures to SVG.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas and never through pyplot, so nothing
global changes (no backend switch, no figure registry) and building them is safe anywhere. Text is drawn as
paths, so an SVG looks the same on any machine, fonts installed or not, and a report needs no network.

Every function takes one table per run (`{run label: table}`, in report order) and the runs' colours, so a
run has the same colour in every figure. A function returns None when its tables hold nothing to draw.
"""

from __future__ import annotations

import functools
import io
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import ParamSpec, TypeVar

import matplotlib
import pyarrow as pa
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from longeval.records import ErrorKind
from longeval.report.table import format_length

__all__ = [
    "breakdown_bars",
    "comparison_forest",
    "cumulative_curves",
    "error_bars",
    "figure_png",
    "figure_svg",
    "heatmaps",
    "ladder_curves",
    "length_curves",
    "run_colors",
    "task_curves",
]

Series = Mapping[str, pa.Table]
P = ParamSpec("P")
R = TypeVar("R")

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf")
_RC = {"svg.fonttype": "path", "svg.hashsalt": "longeval", "font.size": 8.0, "axes.titlesize": 9.0,
       "axes.spines.top": False, "axes.spines.right": False}
_RUNGS = {"retrieval": "-", "tracking": "--", "global": ":"}
_ERROR_COLORS = {"no_answer": "#9e9e9e", "invalid_path": "#d62728", "suboptimal_path": "#ff7f0e",
                 "wrong_answer": "#9467bd", "invalid_words": "#8c564b", "null": "#bdbdbd",
                 ErrorKind.PROMPT_TOO_LONG.value: "#1f1f1f", ErrorKind.ENGINE_ERROR.value: "#e377c2"}
_BREAKDOWN_GROUPS = ("overall", "easy", "hard", "short", "medium", "long")


def run_colors(labels: Sequence[str]) -> dict[str, str]:
    """A fixed colour per run, in report order (the palette repeats after ten runs)."""
    return {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(labels)}


def _styled(build: Callable[P, R]) -> Callable[P, R]:
    """Build a figure under the report's style: rcParams are read when artists are made, not when saved."""

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context(_RC):
            return build(*args, **kwargs)

    return wrapper


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas: no pyplot, no global backend
    return fig


def figure_svg(fig: Figure) -> bytes:
    """The figure as a standalone SVG document (text as paths; no date, so the same figure gives the same
    bytes)."""
    buf = io.BytesIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def figure_png(fig: Figure, *, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (for places that cannot show SVG)."""
    buf = io.BytesIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _grid(fig: Figure, panels: int, *, columns: int = 4):
    cols = max(1, min(columns, panels))
    rows = math.ceil(panels / cols)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[panels:]:
        ax.set_visible(False)
    return flat[:panels]


def _by_task(series: Series) -> tuple[dict[str, dict[str, list[dict]]], list[str], list[int]]:
    """Rows grouped by task, then by run; the sorted tasks and every length any run has."""
    cells: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for label, table in series.items():
        for row in table.to_pylist():
            cells[row["task"]][label].append(row)
    lengths = sorted({r["target_length"] for by_run in cells.values() for rows in by_run.values() for r in rows})
    return cells, sorted(cells), lengths


def _panel_figure(panels: int, *, columns: int = 4, width: float = 2.9, height: float = 2.3) -> tuple[Figure, list]:
    cols = max(1, min(columns, panels))
    fig = _figure(width * cols + 0.4, height * math.ceil(panels / cols) + 0.5)
    return fig, _grid(fig, panels, columns=columns)


def _length_axis(ax, lengths: Sequence[int]) -> None:
    """A log2 length axis labelled as RULER writes lengths (4K, 128K, 1M)."""
    ticks = sorted(set(lengths))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [format_length(n) for n in ticks])
    ax.minorticks_off()
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)
    else:
        ax.set_xlim(ticks[0] / 1.2, ticks[-1] * 1.2)
    ax.grid(True, alpha=0.25, linewidth=0.6)


def _score_axis(ax, *, label: str = "score") -> None:
    ax.set_ylim(-2, 102)
    ax.set_ylabel(label)


def _legend(fig: Figure, handles: list, labels: list[str]) -> None:
    """One legend above the panels, with as many columns as fit the figure's width (never clipped)."""
    if handles:
        entry = 0.5 + 0.065 * max(len(label) for label in labels)  # inches: marker, gap and text at 8 pt
        cols = max(1, min(len(labels), int(fig.get_figwidth() // entry)))
        fig.legend(handles, labels, loc="outside upper center", ncols=cols, frameon=False)


def _unique_handles(axes) -> tuple[list, list[str]]:
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen)


@_styled
def task_curves(series: Series, *, colors: Mapping[str, str], threshold: float | None = None,
                title: str = "") -> Figure | None:
    """Score against length per task with the 95 % interval as a band, one panel per task, one line per run.

    Args:
        series: `summary/tasks` rows of one family per run (`task, target_length, score, ci_low, ci_high`).
        threshold: drawn as a dotted line when given (RULER's 85.6 bar).
    """
    cells, tasks, lengths = _by_task(series)
    if not cells:
        return None
    fig, axes = _panel_figure(len(tasks))
    for ax, task in zip(axes, tasks, strict=True):
        for i, label in enumerate(series):
            rows = sorted(cells[task].get(label, []), key=lambda r: r["target_length"])
            if not rows:
                continue
            xs, ys = [r["target_length"] for r in rows], [r["score"] for r in rows]
            color = colors.get(label, _PALETTE[0])
            if len(rows) > 1:
                ax.fill_between(xs, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], color=color,
                                alpha=0.15, linewidth=0)
            else:  # a band needs two lengths: one length gets a whisker, runs side by side
                xs = [xs[0] * 2 ** (0.06 * (i - (len(series) - 1) / 2))]
                ax.errorbar(xs, ys, yerr=[[ys[0] - rows[0]["ci_low"]], [rows[0]["ci_high"] - ys[0]]], color=color,
                            alpha=0.6, capsize=3, linewidth=1)
            ax.plot(xs, ys, marker="o", markersize=3.5, color=color, label=label)
        if threshold is not None:
            ax.axhline(threshold, color="#555555", linestyle=":", linewidth=0.8, label=f"threshold {threshold:g}")
        ax.set_title(task)
        _length_axis(ax, lengths)
        _score_axis(ax)
    _legend(fig, *_unique_handles(axes))
    if title:
        fig.suptitle(title)
    return fig


@_styled
def length_curves(series: Series, *, colors: Mapping[str, str], threshold: float | None = None) -> Figure | None:
    """RULER's per-length score (the mean over tasks) against length, one line per run, with the threshold
    that defines the effective length."""
    if not any(t.num_rows for t in series.values()):
        return None
    fig = _figure(5.6, 3.2)
    ax = fig.subplots()
    lengths: list[int] = []
    for label, table in series.items():
        rows = sorted(table.to_pylist(), key=lambda r: r["target_length"])
        if rows:
            xs = [r["target_length"] for r in rows]
            lengths += xs
            ax.plot(xs, [r["score"] for r in rows], marker="o", markersize=4, color=colors.get(label), label=label)
    if threshold is not None:
        ax.axhline(threshold, color="#555555", linestyle=":", linewidth=0.9, label=f"threshold {threshold:g}")
    _length_axis(ax, lengths)
    _score_axis(ax, label="mean over tasks")
    ax.set_xlabel("context length (tokens)")
    ax.legend(frameon=False, fontsize=7)
    return fig


@_styled
def cumulative_curves(series: Series, *, colors: Mapping[str, str],
                      chance: Mapping[str, float] | None = None) -> Figure | None:
    """Michelangelo's curves: per task, the cumulative score "up to L" (solid) and the pointwise score at L
    (faint, dashed) against length, with the task's chance rate as a grey dotted line."""
    cells, tasks, lengths = _by_task(series)
    if not cells:
        return None
    fig, axes = _panel_figure(len(tasks), columns=3, width=3.3, height=2.5)
    for ax, task in zip(axes, tasks, strict=True):
        for label in series:
            rows = sorted(cells[task].get(label, []), key=lambda r: r["target_length"])
            if not rows:
                continue
            xs = [r["target_length"] for r in rows]
            color = colors.get(label, _PALETTE[0])
            ax.plot(xs, [r["score_upto"] for r in rows], marker="o", markersize=3.5, color=color,
                    label=f"{label}: up to L")
            ax.plot(xs, [r["score_at"] for r in rows], linestyle="--", linewidth=0.9, alpha=0.55, color=color,
                    label=f"{label}: at L")
        if chance and task in chance:
            ax.axhline(chance[task], color="#777777", linestyle=":", linewidth=0.9, label="chance")
        ax.set_title(task)
        _length_axis(ax, lengths)
        _score_axis(ax, label="cumulative average score")
    _legend(fig, *_unique_handles(axes))
    return fig


@_styled
def ladder_curves(series: Series, *, colors: Mapping[str, str]) -> Figure | None:
    """SYNC's ladder: per domain, the retrieval, tracking and global scores on the same contexts against
    length (line style = rung, colour = run); the gap between rungs is the task's doing."""
    domains: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    rungs: list[str] = []
    for label, table in series.items():
        rungs += [c for c in table.column_names if c not in ("model_id", "domain", "target_length")]
        for row in table.to_pylist():
            domains[row["domain"]][label].append(row)
    if not domains:
        return None
    rungs = list(dict.fromkeys(rungs))
    fig, axes = _panel_figure(len(domains), columns=2, width=4.2, height=2.8)
    lengths = sorted({r["target_length"] for d in domains.values() for rows in d.values() for r in rows})
    for ax, domain in zip(axes, sorted(domains), strict=True):
        for label in series:
            rows = sorted(domains[domain].get(label, []), key=lambda r: r["target_length"])
            for rung in rungs:
                points = [(r["target_length"], r[rung]) for r in rows if r.get(rung) is not None]
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", markersize=3.5, color=colors.get(label),
                            linestyle=_RUNGS.get(rung, "-."), label=f"{label} · {rung}")
        ax.set_title(domain)
        _length_axis(ax, lengths)
        _score_axis(ax)
    _legend(fig, *_unique_handles(axes))
    return fig


@_styled
def error_bars(series: Series) -> Figure | None:
    """Kinds of failure (SYNC's Table 5): for each run, task and length a bar of the share of instances
    that failed each way, stacked; the rest of the bar's 100 % answered correctly or scored partly."""
    bars: list[tuple[str, dict[str, float]]] = []
    kinds: list[str] = []
    for label, table in series.items():
        groups: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
        for row in table.to_pylist():
            groups[(row["task"], row["target_length"])][row["error_type"]] = row["share"]
            kinds.append(row["error_type"])
        bars += [(f"{label} · {task} · {format_length(n)}", shares) for (task, n), shares in sorted(groups.items())]
    if not bars:
        return None
    kinds = sorted(set(kinds), key=lambda k: (list(_ERROR_COLORS).index(k) if k in _ERROR_COLORS else 99, k))
    fig = _figure(7.5, 0.9 + 0.22 * len(bars))
    ax = fig.subplots()
    ys = list(range(len(bars)))[::-1]
    left = [0.0] * len(bars)
    extra = iter(_PALETTE)
    for kind in kinds:
        widths = [shares.get(kind, 0.0) for _, shares in bars]
        ax.barh(ys, widths, left=left, height=0.7, label=kind, color=_ERROR_COLORS.get(kind) or next(extra))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(ys, [name for name, _ in bars])
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of instances")
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    return fig


@_styled
def breakdown_bars(series: Series, *, colors: Mapping[str, str]) -> Figure | None:
    """LongBench v2's Table 2 as grouped bars: accuracy overall, by difficulty and by length per run, with
    the compensated accuracy (an unparseable answer counts 0.25) as a black tick on each bar."""
    values: dict[str, dict[str, dict]] = {}
    for label, table in series.items():
        values[label] = {r["group"]: r for r in table.to_pylist() if r["split"] != "domain"}
    groups = [g for g in _BREAKDOWN_GROUPS if any(g in v and v[g]["n"] for v in values.values())]
    if not groups:
        return None
    fig = _figure(max(4.5, 0.9 * len(groups) * max(1, len(values)) ** 0.5 + 2), 3.0)
    ax = fig.subplots()
    width = 0.8 / max(1, len(values))
    for i, (label, by_group) in enumerate(values.items()):
        xs = [g + (i - (len(values) - 1) / 2) * width for g in range(len(groups))]
        acc = [(by_group.get(g) or {}).get("accuracy") or 0.0 for g in groups]
        comp = [(by_group.get(g) or {}).get("compensated_accuracy") or 0.0 for g in groups]
        ax.bar(xs, acc, width=width * 0.95, color=colors.get(label), label=label)
        ax.scatter(xs, comp, marker="_", s=120, color="black", zorder=3,
                   label="compensated" if i == 0 else None)
    ax.set_xticks(range(len(groups)), groups)
    _score_axis(ax, label="accuracy (%)")
    ax.axhline(25, color="#777777", linestyle=":", linewidth=0.8, label="chance (25)")
    ax.legend(frameon=False, fontsize=7)
    return fig


@_styled
def heatmaps(series: Series) -> Figure | None:
    """TAIL's Figure 5: accuracy by depth (rows) and length (columns), one panel per run, numbers in cells;
    empty cells are grey."""
    panels = {label: table.to_pylist() for label, table in series.items() if table.num_rows}
    if not panels:
        return None
    depths = sorted({r["depth"] for rows in panels.values() for r in rows})
    lengths = sorted({r["target_length"] for rows in panels.values() for r in rows})
    cols = min(3, len(panels))
    cell_w = max(0.55, 3.6 / max(1, len(lengths)))
    fig = _figure(cols * (1.3 + cell_w * len(lengths)) + 0.8,
                  math.ceil(len(panels) / cols) * (0.9 + 0.28 * len(depths)) + 0.3)
    axes = _grid(fig, len(panels), columns=3)
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="#dddddd")
    image = None
    for ax, (label, rows) in zip(axes, panels.items(), strict=True):
        grid = [[math.nan] * len(lengths) for _ in depths]
        for r in rows:
            grid[depths.index(r["depth"])][lengths.index(r["target_length"])] = r["accuracy"]
        image = ax.imshow(grid, cmap=cmap, vmin=0, vmax=100, aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if not math.isnan(grid[i][j]):
                    dark = grid[i][j] > 80 or grid[i][j] < 15  # the colour map's dark ends: white numbers
                    ax.text(j, i, f"{grid[i][j]:.0f}", ha="center", va="center", fontsize=7.5,
                            color="white" if dark else "black")
        ax.set_xticks(range(len(lengths)), [format_length(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("length")
        ax.set_ylabel("depth (%)")
        ax.set_title(label)
        for side in ("top", "right"):
            ax.spines[side].set_visible(True)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy (%)")
    return fig


@_styled
def comparison_forest(table: pa.Table, *, title: str = "") -> Figure | None:
    """A paired comparison as a forest plot: B − A per task and length with its 95 % bootstrap interval,
    green where the interval is above 0, red where below, grey where it contains 0."""
    rows = table.to_pylist()
    if not rows:
        return None
    fig = _figure(6.5, 0.9 + 0.21 * len(rows))
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        color = "#2ca02c" if r["ci_low"] > 0 else "#d62728" if r["ci_high"] < 0 else "#7f7f7f"
        ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=color, linewidth=1.6)
        ax.plot([r["diff"]], [y], marker="D" if r["target_length"] is None else "o", color=color, markersize=4)
    names = [f"{r['family']} · {r['task']}" + (f" · {format_length(r['target_length'])}"
                                                if r["target_length"] is not None else " · all lengths")
             for r in rows]
    ax.set_yticks(ys, names)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("difference B − A (points, 95 % bootstrap CI)")
    ax.grid(True, axis="x", alpha=0.25)
    if title:
        ax.set_title(title)
    return fig


_DECISION_MARK = {"above": "✓", "below": "✗", "undecided": "?", "presumed_below": "✗?"}


@_styled
def adaptive_samples(series: Series) -> Figure | None:
    """Where an adaptive run's samples went: instances per task (rows) and length (columns) as a share of the
    cap, one panel per run, with the cell's decision (✓ above, ✗ below, ✗? presumed below, ? open; ~ near the
    threshold)."""
    panels = {label: table.to_pylist() for label, table in series.items() if table.num_rows}
    if not panels:
        return None
    tasks = sorted({r["task"] for rows in panels.values() for r in rows})
    lengths = sorted({r["target_length"] for rows in panels.values() for r in rows})
    cols = min(2, len(panels))
    cell_w = max(0.6, 4.2 / max(1, len(lengths)))
    fig = _figure(cols * (2.2 + cell_w * len(lengths)) + 0.8,
                  math.ceil(len(panels) / cols) * (0.9 + 0.3 * len(tasks)) + 0.3)
    axes = _grid(fig, len(panels), columns=2)
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="#dddddd")
    image = None
    for ax, (label, rows) in zip(axes, panels.items(), strict=True):
        grid = [[math.nan] * len(lengths) for _ in tasks]
        marks: dict[tuple[int, int], str] = {}
        for r in rows:
            i, j = tasks.index(r["task"]), lengths.index(r["target_length"])
            grid[i][j] = 100 * r["instances"] / r["cap"] if r["cap"] else math.nan
            near = "~" if r.get("near_threshold") else ""  # absent in roots written before the flag
            marks[(i, j)] = f"{_DECISION_MARK.get(r['decision'], '')}{near} {r['instances']}"
        image = ax.imshow(grid, cmap=cmap, vmin=0, vmax=100, aspect="auto")
        for (i, j), text in marks.items():
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if grid[i][j] > 60 else "black")
        ax.set_xticks(range(len(lengths)), [format_length(n) for n in lengths])
        ax.set_yticks(range(len(tasks)), [t.split("/")[-1] for t in tasks])
        ax.set_xlabel("length")
        ax.set_title(label)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="instances (% of the cap)")
    return fig
