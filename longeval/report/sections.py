"""The HTML report's sections, built from the runs' summary tables: the runs, the leaderboard, each family's
curves and tables (and the sections it declares, `Family.report`), the adaptive runs and the paired comparisons.

Pure: summary tables in, view model (`longeval.report.view`) out; sections appear only where their summary tables
exist, so a RULER-only run shows no TAIL heatmap. See docs/results.md for what each table and figure shows and how
it maps to the papers.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import partial

import pyarrow as pa
from matplotlib.figure import Figure

from longeval.errors import ConfigError
from longeval.report import plots
from longeval.report.adaptive import effective_length_text, schedule_text
from longeval.report.runs import RunData, family_rows, has_rows
from longeval.report.table import format_length
from longeval.report.view import Block, Cell, FigureBlock, PairView, Row, Section, TableBlock, TextBlock
from longeval.stats.aggregate import DEPTH_BIN
from longeval.stats.compare import OVERALL
from longeval.tasks import FAMILIES
from longeval.tasks.family import Family, ReportSection

__all__ = ["REPORT_LAYOUTS", "adaptive_section", "comparison_sections", "families", "family_sections",
           "figure_block", "leaderboard_section", "runs_section"]

_MISSING = "–"


# -- cells ------------------------------------------------------------------------------------------


def _num(value: float | None, *, digits: int = 2, cls: str = "num", title: str = "", key: str = "") -> Cell:
    if value is None:
        return Cell(_MISSING, cls="missing", key=key)
    return Cell(f"{value:.{digits}f}", cls=cls, title=title, key=key)


def _score(value: float | None, *, title: str = "", key: str = "") -> Cell:
    """A score cell shaded by its decile, so a table reads like a heatmap."""
    if value is None:
        return Cell(_MISSING, cls="missing", key=key)
    return _num(value, cls=f"num h{min(9, max(0, int(value // 10)))}", title=title, key=key)


def _text(value: object, *, cls: str = "label", href: str = "") -> Cell:
    return Cell("" if value is None else str(value), cls=cls, href=href)


def _length(n: int | None) -> str:
    return _MISSING if n is None else format_length(int(n))


def _anchor(*parts: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else "-" for ch in p.lower()) for p in parts)


def figure_block(name: str, fig: Figure | None, *, alt: str, caption: str = "") -> FigureBlock | None:
    """A figure as an inline SVG image block (None when there was nothing to draw)."""
    if fig is None:
        return None
    svg = base64.b64encode(plots.figure_svg(fig)).decode("ascii")
    return FigureBlock(name=name, src=f"data:image/svg+xml;base64,{svg}", alt=alt, caption=caption)


def _blocks(*items: Block | None) -> list[Block]:
    return [b for b in items if b is not None]


# -- sections ---------------------------------------------------------------------------------------


def families(runs: Sequence[RunData]) -> list[str]:
    """The families any run scored, in the order they are registered (`longeval.tasks.FAMILIES`)."""
    present = {f for r in runs if has_rows(r.tables, "tasks") for f in r.tables["tasks"]["family"].to_pylist()}
    return [f for f in FAMILIES if f in present] + sorted(present - set(FAMILIES))


def _title(family: str) -> str:
    """How the report names a family: its declared title (`Family.title`), else its name."""
    return FAMILIES[family].title if family in FAMILIES else family


def _family_table(run: RunData, name: str, family: str) -> pa.Table | None:
    if not has_rows(run.tables, name):
        return None
    table = family_rows(run.tables[name], family)
    return table if table.num_rows else None


def _series(runs: Sequence[RunData], name: str, family: str) -> dict[str, pa.Table]:
    out = {}
    for run in runs:
        table = _family_table(run, name, family)
        if table is not None:
            out[run.label] = table
    return out


def runs_section(runs: Sequence[RunData], links: Mapping[str, Mapping[str, tuple[str, str]]]) -> Section:
    """Which run roots the report reads, what each claimed, and where its per-instance data are."""
    columns = ("config.yaml", "scores/", "predictions/", "instances/", "summary/", "per-instance CSV")
    rows = []
    for run in runs:
        mine = links.get(run.label, {})
        cells = [_text(run.label), _text(run.model), _text(run.suite),
                 Cell(_length(run.claimed_length), cls="num", key=f"run/{run.label}/claimed"), _text(run.uri)]
        for column in columns:
            text, href = mine.get(column, ("", ""))
            cells.append(_text(text, href=href))
        rows.append(Row(cells))
    computed = [r.label for r in runs if r.computed]
    incomplete = [r for r in runs if r.incomplete]
    note = ("Per-instance data: Parquet folders of each run root (instances with prompts and references, "
            "predictions with raw outputs, scores) and a CSV per run beside this page with references, output, "
            "parsed answer and score for every instance.")
    if computed:
        note += f" Summaries computed from the scores while building this page: {', '.join(computed)}."
    note += "".join(f" {n}" for run in runs for n in run.notes)
    for run in incomplete:
        note += f" INCOMPLETE RUN {run.label}: {run.problem}."
    return Section("runs", "Runs", blocks=[TableBlock(
        header=["run", "model", "suite", "claimed length", "run root", *columns], rows=rows, id="runs-table",
        note=note)])


def leaderboard_section(runs: Sequence[RunData], fams: Sequence[str]) -> Section | None:
    """RULER's Table 3 layout per family: claimed and effective length, score per length, Avg, wAvg."""
    blocks: list[Block] = []
    for family in fams:
        heads = {r.label: _family_table(r, "headline", family) for r in runs}
        per_length = {r.label: _family_table(r, "lengths", family) for r in runs}
        entries = [(r, heads[r.label].to_pylist()[0]) for r in runs if heads[r.label] is not None]
        if not entries:
            continue
        lengths = sorted({n for t in per_length.values() if t is not None for n in t["target_length"].to_pylist()})
        threshold = entries[0][1]["threshold"]
        entries.sort(key=lambda e: -(e[1]["avg"] if e[1]["avg"] is not None else -1))
        rank_inc = _ranks([e[1]["wavg_inc"] for e in entries])
        rank_dec = _ranks([e[1]["wavg_dec"] for e in entries])
        rows = []
        for i, (run, head) in enumerate(entries):
            key = f"{family}/{run.label}"
            scores = {}
            if per_length[run.label] is not None:
                scores = dict(zip(per_length[run.label]["target_length"].to_pylist(),
                                  per_length[run.label]["score"].to_pylist(), strict=True))
            effective = head["effective_length"]
            shortest = f"< {_length(lengths[0])}" if lengths else _MISSING
            effective_text = _length(effective) if effective is not None else shortest
            cells = [_text(run.label), Cell(_length(run.claimed_length), cls="num", key=f"{key}/claimed"),
                     Cell(effective_text, cls="num", key=f"{key}/effective", title=_effective_interval(head))]
            for n in lengths:
                value = scores.get(n)
                cls = "num pass" if value is not None and value > head["threshold"] else "num"
                cells.append(_num(value, cls=cls, key=f"{key}/L{n}"))
            cells += [_num(head["avg"], title=_interval(head, "avg").removeprefix("; "), key=f"{key}/avg"),
                      _num(head["wavg_inc"], title=f"rank {rank_inc[i]} of {len(entries)}{_interval(head, 'wavg_inc')}",
                           key=f"{key}/wavg_inc"),
                      _num(head["wavg_dec"], title=f"rank {rank_dec[i]} of {len(entries)}{_interval(head, 'wavg_dec')}",
                           key=f"{key}/wavg_dec")]
            rows.append(Row(cells))
        blocks.append(TableBlock(
            header=["model", "claimed length", "effective length", *[_length(n) for n in lengths], "Avg",
                    "wAvg (inc)", "wAvg (dec)"],
            rows=rows, id=f"leaderboard-{_anchor(family)}", caption=_title(family),
            note=f"Effective length: the largest length whose score exceeds {threshold:g} (underlined; "
                 f"{_threshold_source(family, threshold)}); "
                 "claimed length: the run's model.max_model_len. Avg is the mean over lengths; wAvg (inc) weighs "
                 "lengths 1..L from short to long, wAvg (dec) the reverse (hover for ranks). Sorted by Avg."))
    if not blocks:
        return None
    return Section("leaderboard", "Leaderboard", intro="One row per run, laid out as RULER's Table 3: the "
                   "per-length score is the unweighted mean over the family's tasks at that length.", blocks=blocks)


def _threshold_source(family: str, threshold: float) -> str:
    """Where a family's threshold comes from: its own declaration, or the run's `suite.effective_threshold`."""
    declared = FAMILIES[family].effective_threshold if family in FAMILIES else None
    if declared is not None and declared.value == threshold:
        return declared.source
    return "the run's suite.effective_threshold"


def _interval(head: dict, name: str) -> str:
    """The headline number's bootstrap interval for a tooltip ("" for summaries written without one)."""
    low, high = head.get(f"{name}_ci_low"), head.get(f"{name}_ci_high")
    return "" if low is None or high is None else f"; 95% CI {low:.2f}–{high:.2f}"


def _effective_interval(head: dict) -> str:
    high = head.get("effective_length_high")
    if high is None:
        return ""
    low = head.get("effective_length_low")
    return f"95% CI {_length(low) if low is not None else 'none'}–{_length(high)}"


def _ranks(values: Sequence[float | None]) -> list[int]:
    order = sorted(range(len(values)), key=lambda i: -(values[i] if values[i] is not None else -1e9))
    ranks = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        ranks[i] = rank
    return ranks


def _task_table(run: RunData, family: str) -> TableBlock | None:
    tasks = _family_table(run, "tasks", family)
    if tasks is None:
        return None
    cells: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in tasks.to_pylist():
        cells[row["task"]][row["target_length"]] = row
    lengths = sorted({n for by in cells.values() for n in by})
    rows = []
    for task in sorted(cells):
        by = cells[task]
        row_cells = [_text(task)]
        for n in lengths:
            r = by.get(n)
            title = (f"95% CI {r['ci_low']:.2f}–{r['ci_high']:.2f} ({r.get('ci_method') or 'wilson'}), n={r['n']}, "
                     f"nulls {r['nulls']}, too long {r['too_long']}, engine errors {r['errors']}") if r else ""
            failed = _all_failed(r)
            key = f"{family}/{run.label}/{task}/L{n}"
            row_cells.append(Cell(failed, cls="failed", title=title, key=key) if failed
                             else _score(r and r["score"], key=key, title=title))
        counts = sorted({r["n"] for r in by.values()})
        row_cells.append(Cell(str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}", cls="num"))
        row_cells += [Cell(str(sum(r["nulls"] for r in by.values())), cls="num"),
                      Cell(str(sum(r["too_long"] + r["errors"] for r in by.values())), cls="num")]
        rows.append(Row(row_cells))
    averages = _family_table(run, "lengths", family)
    if averages is not None and len(cells) > 1:
        avg = dict(zip(averages["target_length"].to_pylist(), averages["score"].to_pylist(), strict=True))
        rows.append(Row([_text("Avg"), *[_num(avg.get(n)) for n in lengths], Cell(""), Cell(""), Cell("")],
                        cls="total"))
    partial = " INCOMPLETE RUN: partial results." if run.incomplete else ""
    return TableBlock(header=["task", *[_length(n) for n in lengths], "n", "nulls", "failed"], rows=rows,
                      caption=f"{run.label}: score per task and length (×100; n instances per cell; hover for the "
                              f"95 % interval){partial}")


def _all_failed(row: dict | None) -> str:
    """"all too long" / "all engine errors" for a cell whose every instance failed before the model answered
    (a score of 0 there is no finding about the model), else ""."""
    if not row or not row["n"]:
        return ""
    if row["too_long"] == row["n"]:
        return "all too long"
    if row["errors"] == row["n"]:
        return "all engine errors"
    return ""


def _slice_table(run: RunData, family: str) -> TableBlock | None:
    slices = _family_table(run, "slices", family)
    if slices is None:
        return None
    cells: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for row in slices.to_pylist():
        cells[(row["task"], row["complexity"])][row["target_length"]] = row
    lengths = sorted({n for by in cells.values() for n in by})
    rows = [Row([_text(task), _text(complexity),
                 *[_score(by[n]["score"] if n in by else None, title=(
                     f"95% CI {by[n]['ci_low']:.2f}–{by[n]['ci_high']:.2f}, n={by[n]['n']}") if n in by else "")
                   for n in lengths]])
            for (task, complexity), by in sorted(cells.items())]
    return TableBlock(header=["task", "configuration", *[_length(n) for n in lengths]], rows=rows,
                      caption=f"{run.label}: by instance configuration")


def _error_table(runs: Sequence[RunData], family: str, *, caption: str) -> TableBlock | None:
    series = _series(runs, "errors", family)
    if not series:
        return None
    kinds = sorted({k for t in series.values() for k in t["error_type"].to_pylist()})
    rows = []
    for label, table in series.items():
        groups: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
        for r in table.to_pylist():
            groups[(r["task"], r["target_length"])][r["error_type"]] = r
        for (task, n), by in sorted(groups.items()):
            total = next(iter(by.values()))["n"]
            rows.append(Row([_text(label), _text(task), Cell(_length(n), cls="num"), Cell(str(total), cls="num"),
                             *[_num(by[k]["share"], digits=1, title=f"{by[k]['count']} of {total}")
                               if k in by else Cell(_MISSING, cls="missing") for k in kinds]]))
    return TableBlock(header=["run", "task", "length", "n", *kinds], rows=rows, caption=caption,
                      note="Share of the instances (%) that failed each way; hover for counts. Failed rows score 0 "
                           "and stay in every mean.")


def _ladder_table(series: Mapping[str, pa.Table], *, id: str, caption: str) -> TableBlock | None:
    """A ladder's rows (domain, length, one column per rung), for every run."""
    if not series:
        return None
    rungs = list(dict.fromkeys(c for t in series.values() for c in t.column_names
                               if c not in ("model_id", "domain", "target_length")))
    rows = [Row([_text(label), _text(r["domain"]), Cell(_length(r["target_length"]), cls="num"),
                 *[_score(r.get(rung)) for rung in rungs]])
            for label, table in series.items() for r in table.to_pylist()]
    return TableBlock(header=["run", "domain", "length", *rungs], rows=rows, id=id, caption=caption)


def _chance(runs: Sequence[RunData], name: str | None) -> dict[str, float]:
    for run in runs:
        if name and has_rows(run.tables, name):
            return dict(zip(run.tables[name]["task"].to_pylist(), run.tables[name]["chance"].to_pylist(),
                            strict=True))
    return {}


def _chance_table(runs: Sequence[RunData], name: str | None, *, caption: str) -> TableBlock | None:
    for run in runs:
        if name and has_rows(run.tables, name):
            rows = [Row([_text(r["task"]), _num(r["chance"]), _num(r["paper"]), _text(r["model"])])
                    for r in run.tables[name].to_pylist()]
            return TableBlock(header=["task", "chance (ours)", "chance (paper)", "random model"], rows=rows,
                              caption=caption)
    return None


def _breakdown_table(series: Mapping[str, pa.Table], family: str, *, id: str, caption: str) -> TableBlock | None:
    """Accuracy by split and group (LongBench v2's Table 2 layout), the runs side by side."""
    if not series:
        return None
    groups: list[tuple[str, str]] = []
    values: dict[str, dict[tuple[str, str], dict]] = {}
    for label, table in series.items():
        values[label] = {(r["split"], r["group"]): r for r in table.to_pylist()}
        groups += [k for k in values[label] if k not in groups]
    header = ["split", "group"]
    for label in series:
        header += [f"{label}: n", f"{label}: accuracy", f"{label}: compensated", f"{label}: invalid %"]
    rows = []
    for split, group in groups:
        cells = [_text(split), _text(group)]
        for label in series:
            r = values[label].get((split, group)) or {}
            cells += [Cell(str(r.get("n", _MISSING)), cls="num"),
                      _score(r.get("accuracy"), key=f"{family}/{label}/{group}/accuracy"),
                      _num(r.get("compensated_accuracy")), _num(r.get("invalid_rate"))]
        rows.append(Row(cells, cls="total" if split == "overall" else ""))
    return TableBlock(header=header, rows=rows, id=id, caption=caption)


def _headline_rows(runs: Sequence[RunData], name: str | None, family: str, *, id: str,
                   caption: str) -> TableBlock | None:
    """A family's own headline table (TAIL's Table 2 layout: shortest, longest, Avg, wAvg, ratio), per run."""
    rows = []
    for run in runs:
        if name and has_rows(run.tables, name):
            for r in run.tables[name].to_pylist():
                rows.append(Row([_text(run.label), Cell(_length(r["shortest"]), cls="num"),
                                 Cell(_length(r["longest"]), cls="num"),
                                 _num(r["avg"], key=f"{family}/{run.label}/avg"),
                                 _num(r["wavg_inc"]), _num(r["wavg_dec"]), _num(r["ratio"])]))
    if not rows:
        return None
    return TableBlock(header=["run", "shortest", "longest", "Avg", "wAvg (inc)", "wAvg (dec)",
                              "longest / shortest (%)"], rows=rows, id=id, caption=caption)


def _declared_section(runs: Sequence[RunData], family: str, declared: ReportSection,
                      colors: Mapping[str, str]) -> Section | None:
    """A section a family declares (`Family.report`), drawn in its layout; None when its table has no rows."""
    fid = _anchor(family)
    name = f"{fid}-{declared.layout}"
    figure = partial(figure_block, alt=declared.alt, caption=declared.caption)
    if declared.layout == "errors":
        series = _series(runs, declared.table, family)
        blocks = _blocks(figure(f"{family}-errors", plots.error_bars(series)) if series else None,
                         _error_table(runs, family, caption=declared.rows_caption or declared.title))
    elif declared.layout == "cumulative":
        series = _series(runs, declared.table, family)
        blocks = _blocks(figure(f"{family}-cumulative", plots.cumulative_curves(
            series, colors=colors, chance=_chance(runs, declared.rows))) if series else None,
            _chance_table(runs, declared.rows, caption=declared.rows_caption) if series else None)
    else:
        series = {r.label: r.tables[declared.table] for r in runs if has_rows(r.tables, declared.table)}
        if declared.layout == "ladder":
            blocks = _blocks(figure(name, plots.ladder_curves(series, colors=colors)) if series else None,
                             _ladder_table(series, id=name, caption=declared.rows_caption))
        elif declared.layout == "breakdown":
            blocks = _blocks(figure(name, plots.breakdown_bars(series, colors=colors)) if series else None,
                             _breakdown_table(series, family, id=name, caption=declared.rows_caption))
        elif declared.layout == "heatmap":
            headline = _headline_rows(runs, declared.rows, family, id=f"{fid}-headline",
                                      caption=declared.rows_caption)
            blocks = _blocks(figure(name, plots.heatmaps(series)) if series or headline else None, headline)
        else:
            raise ConfigError(f"family {family!r} declares a report section of layout {declared.layout!r}; "
                              f"layouts: {', '.join(REPORT_LAYOUTS)}")
    return Section(f"{fid}-{declared.layout}", declared.title, level=3, blocks=blocks) if blocks else None


REPORT_LAYOUTS = ("ladder", "errors", "cumulative", "breakdown", "heatmap")
"""The layouts a family's `ReportSection` may name."""


def _depth_section(runs: Sequence[RunData], family: str, title: str) -> Section | None:
    """The depth x length heatmap binned from the scores (`stats.depth_grid`), for a family whose instances
    carry a depth and that declares no grid of its own."""
    series = {}
    for run in runs:
        grid = run.depth_grid
        if grid is not None:
            rows = family_rows(grid, family)
            if rows.num_rows:  # the heatmap plot reads `accuracy`: the mean score (%) of the cell
                series[run.label] = rows.rename_columns(["accuracy" if c == "score" else c for c in rows.column_names])
    if not series or not any(len(set(t["depth"].to_pylist())) > 1 for t in series.values()):
        return None  # one depth is no heatmap
    fid = _anchor(family)
    return Section(f"{fid}-depths", f"{title}: depth × length", level=3, blocks=_blocks(figure_block(
        f"{fid}-depths", plots.heatmaps(series),
        alt=f"{title}: score heatmap by depth of the information and context length, one panel per run",
        caption=f"Mean score (%) by depth (rows, bins of {DEPTH_BIN:g} %) and length (columns); grey: no "
                "instances.")))


def family_sections(runs: Sequence[RunData], family: str, colors: Mapping[str, str]) -> list[Section]:
    """A family's section: its curves with intervals, per-run tables, the sections it declares
    (`Family.report`), a depth x length heatmap when its instances carry a depth, and its failures."""
    declared = FAMILIES.get(family) or Family(name=family, title=family, tasks=())
    name = declared.title
    tasks = _series(runs, "tasks", family)
    if not tasks:
        return []
    lengths = {n for t in tasks.values() for n in t["target_length"].to_pylist()}
    task_names = {t for table in tasks.values() for t in table["task"].to_pylist()}
    threshold = None
    for run in runs:
        head = _family_table(run, "headline", family)
        if head is not None:
            threshold = head["threshold"][0].as_py()
            break
    fid = _anchor(family)
    blocks: list[Block] = []
    if len(task_names) > 1 and len(lengths) > 1:
        blocks += _blocks(figure_block(
            f"{family}-lengths", plots.length_curves(_series(runs, "lengths", family), colors=colors,
                                                     threshold=threshold),
            alt=f"{name}: mean score over tasks against context length, one line per run",
            caption="Mean over tasks per length (the leaderboard's columns) with the effective-length threshold."))
    blocks += _blocks(figure_block(
        f"{family}-tasks", plots.task_curves(tasks, colors=colors,
                                             threshold=threshold if declared.threshold_on_task_curves else None),
        alt=f"{name}: score per task against context length with 95% intervals",
        caption=declared.task_curves_caption))
    blocks += _blocks(*[_task_table(run, family) for run in runs])
    sections = [Section(fid, name, intro=declared.intro, blocks=blocks)]

    extra = [s for s in (_declared_section(runs, family, d, colors) for d in declared.report) if s is not None]
    layouts = {d.layout for d in declared.report}
    if declared.has_depth and "heatmap" not in layouts:
        extra += _blocks(_depth_section(runs, family, name))
    if "errors" not in layouts:
        table = _error_table(runs, family, caption=f"{name}: kinds of failure")
        if table is not None:
            extra.append(Section(f"{fid}-failures", f"{name} failures", level=3, blocks=[table]))
    slices = _blocks(*[_slice_table(run, family) for run in runs])
    if slices:
        extra.append(Section(f"{fid}-slices", f"{name} by configuration", level=3, blocks=slices))
    return sections + extra


def adaptive_section(runs: Sequence[RunData]) -> Section | None:
    """Adaptive runs (suite.adaptive): where the samples went, and the effective lengths with their intervals."""
    cells = {r.label: r.tables["adaptive"] for r in runs if has_rows(r.tables, "adaptive")}
    if not cells:
        return None
    rows = []
    for run in runs:
        if not has_rows(run.tables, "adaptive_lengths"):
            continue
        for r in run.tables["adaptive_lengths"].to_pylist():
            low, high = r["effective_length_low"], r["effective_length_high"]
            if r.get("near_threshold"):  # the range a full sweep could give, as the text says
                low, high = r["noise_low"], r["noise_high"]
            rows.append(Row([_text(run.label), _text(r["scope"]), _text(r["name"]), _text(r.get("bound") or ""),
                             Cell(effective_length_text(r), cls="num"),
                             Cell(f"{_length(low) if low else 'none'} – {_length(high) if high else 'none'}",
                                  cls="num")]))
    sampled = "".join(f" {run.label} sampled in {schedule_text(run.adaptive_schedule)}." for run in runs
                      if run.adaptive_schedule)
    return Section("adaptive", "Adaptive runs", intro=(
        "Cells stop once their anytime-valid 95 % interval clears the effective-length threshold "
        "(docs/adaptive.md)." + sampled), blocks=_blocks(
        figure_block("adaptive-samples", plots.adaptive_samples(cells),
                     alt="Adaptive runs: instances spent per task and length as a share of the cap, per run",
                     caption="Shade: instances spent (% of the cap); ✓ above, ✗ below, ✗? presumed below by the "
                             "confirmation rule, ? undecided; ~ decided within the full sweep's own noise of the "
                             "threshold."),
        TableBlock(header=["run", "scope", "name", "decided by", "effective length", "interval"], rows=rows,
                   caption="Effective length per task and skill group, with the range the intervals allow; decided "
                           "by a task's own cells, a group's averaged member bounds, or the bound on the group's "
                           "mean (suite.adaptive_target, docs/adaptive.md)")
        if rows else None))


def comparison_sections(pairs: Sequence[PairView]) -> list[Section]:
    """Each paired comparison (B against the first run A): the table and a forest plot of the differences."""
    if not pairs:
        return []
    out = [Section("comparisons", "Paired comparisons", intro=(
        "Each run is compared with the first on the instances both scored (matched by instance_id). B − A is "
        "in points (×100); the 95 % interval is a seeded paired bootstrap over instances; p is an exact McNemar "
        "test for 0/1 scores or a paired permutation test for continuous ones (column test), "
        "two-sided and unadjusted for the number of rows. Green: the interval lies above 0; red: below."))]
    for pair in pairs:
        sid = _anchor("compare", pair.a, pair.b)
        title = f"{pair.b} vs {pair.a}"
        if pair.comparison is None:
            out.append(Section(sid, title, level=3, blocks=[TextBlock(f"Not compared: {pair.error}")]))
            continue
        comparison = pair.comparison
        rows = []
        for r in comparison.table.to_pylist():
            cls = "num up" if r["ci_low"] > 0 else "num down" if r["ci_high"] < 0 else "num"
            key = f"compare/{pair.b}/{r['family']}/{r['task']}/{r['target_length'] or 'all'}"
            rows.append(Row([
                _text(r["family"]), _text(r["task"]),
                Cell(_length(r["target_length"]) if r["target_length"] is not None else "all", cls="num"),
                Cell(str(r["n"]), cls="num"), _num(r["mean_a"]), _num(r["mean_b"]),
                _num(r["diff"], cls=cls, key=f"{key}/diff"),
                Cell(f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]", cls=cls),
                Cell(_p(r["p_value"]), cls="num"), _text(r["test"]),
            ], cls="total" if r["task"] == OVERALL else ""))
        intro = (f"A = {pair.a}, B = {pair.b}: {comparison.matched.describe()}. Bootstrap: "
                 f"{comparison.resamples} resamples, seed {comparison.seed}.")
        out.append(Section(sid, title, level=3, intro=intro,
                           blocks=_blocks(
                               TableBlock(header=["family", "task", "length", "n", "A", "B", "B − A", "95% CI", "p",
                                                  "test"], rows=rows, id=f"table-{sid}"),
                               figure_block(f"compare-{_anchor(pair.b)}",
                                            plots.comparison_forest(comparison.table, title=f"{pair.b} − {pair.a}"),
                                            alt=f"difference {pair.b} minus {pair.a} per task and length with "
                                                "95% bootstrap intervals"))))
    return out


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
