"""The report's figures: built from small tables, drawn without pyplot, and saved as deterministic SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pyarrow as pa
import pytest
from matplotlib.figure import Figure

from longeval.report import plots
from longeval.stats.aggregate import cumulative, error_table, summarise
from longeval.stats.compare import compare_scores
from longeval.tasks.sync import LADDER

SVG = "{http://www.w3.org/2000/svg}svg"


def score_rows(model: str, cells: dict[tuple[str, int], list[float]], *, family: str = "ruler",
               errors: dict[tuple[str, int], list[str]] | None = None) -> pa.Table:
    rows = []
    for (task, length), scores in cells.items():
        kinds = (errors or {}).get((task, length), [""] * len(scores))
        rows += [{"instance_id": f"{task}-{length}-{i}", "model_id": model, "family": family, "task": task,
                  "target_length": length, "score": s, "error_type": e} for i, (s, e) in enumerate(zip(scores, kinds,
                                                                                                        strict=True))]
    return pa.Table.from_pylist(rows)


CELLS = {("vt", 4096): [1, 1, 0, 1], ("vt", 8192): [1, 0, 0, 0], ("cwe", 4096): [1, 1, 1, 1],
         ("cwe", 8192): [0.5, 0.5, 0, 1], ("fwe", 4096): [1, 0, 1, 0]}
COLORS = plots.run_colors(["a", "b"])


def panels(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def test_run_colors_are_fixed_per_position() -> None:
    colors = plots.run_colors([f"r{i}" for i in range(12)])
    assert colors["r0"] == colors["r10"] != colors["r1"]
    assert len(set(colors.values())) == 10


def test_task_curves_draw_one_panel_per_task_and_one_line_per_run() -> None:
    series = {"a": summarise(score_rows("a", CELLS)), "b": summarise(score_rows("b", CELLS))}
    fig = plots.task_curves(series, colors=COLORS, threshold=85.6)
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == ["cwe", "fwe", "vt"]
    vt = axes[2]
    lines = [line for line in vt.get_lines() if line.get_label() in ("a", "b")]
    assert [list(line.get_xdata()) for line in lines] == [[4096, 8192], [4096, 8192]]
    assert list(lines[0].get_ydata()) == [75.0, 25.0]
    assert vt.collections, "the 95 % interval is drawn as a band"
    assert [t.get_text() for t in vt.get_xticklabels()] == ["4K", "8K"]
    assert any(line.get_label().startswith("threshold") for line in vt.get_lines())


def test_a_single_length_gets_a_whisker_instead_of_a_band() -> None:
    fig = plots.task_curves({"a": summarise(score_rows("a", {("fwe", 4096): [1, 0, 1, 0]}))}, colors=COLORS)
    (ax,) = panels(fig)
    assert ax.containers, "errorbar container for the single point"


def test_empty_inputs_draw_nothing() -> None:
    empty = summarise(score_rows("a", CELLS)).slice(0, 0)
    assert plots.task_curves({}, colors=COLORS) is None
    assert plots.task_curves({"a": empty}, colors=COLORS) is None
    assert plots.length_curves({"a": pa.table({"target_length": pa.array([], pa.int64())})}, colors=COLORS) is None
    assert plots.heatmaps({}) is None
    assert plots.error_bars({}) is None


def test_cumulative_curves_draw_up_to_and_at_with_chance() -> None:
    curve = cumulative(score_rows("a", CELLS, family="michelangelo"))
    fig = plots.cumulative_curves({"a": curve}, colors=COLORS, chance={"vt": 25.0})
    vt = [ax for ax in panels(fig) if ax.get_title() == "vt"][0]
    labels = [line.get_label() for line in vt.get_lines()]
    assert labels == ["a: up to L", "a: at L", "chance"]
    up_to, at = vt.get_lines()[:2]
    assert list(at.get_ydata()) == [75.0, 25.0]
    assert list(up_to.get_ydata()) == [75.0, 50.0]  # (3 + 1) / 8


def test_ladder_curves_use_a_line_style_per_rung() -> None:
    cells = {(task, n): [1, 0] for task in ("connected_nodes", "shortest_path", "longest_path") for n in (4096, 8192)}
    from longeval.stats.aggregate import ladder

    table = ladder(summarise(score_rows("a", cells, family="sync")), LADDER)
    fig = plots.ladder_curves({"a": table}, colors=COLORS)
    (ax,) = panels(fig)
    assert {line.get_linestyle() for line in ax.get_lines()} == {"-", "--", ":"}


def test_error_bars_stack_the_kinds_of_failure() -> None:
    scores = score_rows("a", {("shortest_path", 4096): [0, 0, 0, 1]}, family="sync",
                        errors={("shortest_path", 4096): ["no_answer", "invalid_path", "invalid_path", ""]})
    fig = plots.error_bars({"a": error_table(scores)})
    (ax,) = panels(fig)
    widths = {p.get_label(): p for p in ax.containers}
    assert sorted(widths) == ["invalid_path", "no_answer"]
    assert widths["invalid_path"].patches[0].get_width() == 50.0


def test_breakdown_bars_and_heatmaps() -> None:
    breakdown = pa.Table.from_pylist([
        {"model_id": "a", "split": "overall", "group": "overall", "n": 4, "accuracy": 50.0,
         "compensated_accuracy": 56.25, "invalid_rate": 25.0},
        {"model_id": "a", "split": "difficulty", "group": "easy", "n": 0, "accuracy": None,
         "compensated_accuracy": None, "invalid_rate": None}])
    fig = plots.breakdown_bars({"a": breakdown}, colors=COLORS)
    assert [t.get_text() for t in panels(fig)[0].get_xticklabels()] == ["overall"]  # empty groups are left out
    grid = pa.Table.from_pylist([{"model_id": "a", "target_length": n, "depth": d, "n": 2, "accuracy": acc}
                                 for n, d, acc in ((4096, 10.0, 100.0), (8192, 10.0, 50.0), (4096, 90.0, 0.0))])
    fig = plots.heatmaps({"a": grid, "b": grid})
    heat = panels(fig)
    assert [ax.get_title() for ax in heat] == ["a", "b"]
    assert sorted(t.get_text() for t in heat[0].texts) == ["0", "100", "50"]  # the empty cell has no number


def test_comparison_forest_colours_rows_by_their_interval() -> None:
    a = score_rows("a", {("vt", 4096): [0] * 30, ("cwe", 4096): [1, 0] * 15})
    b = score_rows("b", {("vt", 4096): [1] * 30, ("cwe", 4096): [0, 1] * 15})
    table = compare_scores(a, b, resamples=300).table
    fig = plots.comparison_forest(table, title="b − a")
    (ax,) = panels(fig)
    assert len(ax.get_yticklabels()) == table.num_rows == 3
    colours = {line.get_color() for line in ax.get_lines()[:-1]}
    assert "#2ca02c" in colours and "#7f7f7f" in colours  # vt: above 0; cwe: contains 0


@pytest.mark.parametrize("save", [plots.figure_svg, plots.figure_png])
def test_figures_save_deterministically(save) -> None:
    def build() -> bytes:
        return save(plots.task_curves({"a": summarise(score_rows("a", CELLS))}, colors=COLORS))

    first = build()
    assert first == build()
    if save is plots.figure_svg:
        root = ET.fromstring(first)
        assert root.tag == SVG
        assert b"<text" not in first, "text is drawn as paths, so no font is needed to view it"
    else:
        assert first.startswith(b"\x89PNG")


def test_adaptive_samples_mark_each_cells_decision_and_the_near_threshold_ones() -> None:
    from longeval.run.adaptive_rounds import CELL_SCHEMA

    base = {"skill_group": "retrieval", "cap": 500, "decided_early": False, "beats_shorter": False}
    cells = pa.Table.from_pylist([
        {**base, "task": "ruler/vt", "target_length": 4096, "instances": 20, "decision": "above"},
        {**base, "task": "ruler/vt", "target_length": 8192, "instances": 500, "decision": "above",
         "near_threshold": True}], schema=CELL_SCHEMA)
    fig = plots.adaptive_samples({"run": cells})
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"✓ 20", "✓~ 500"} <= texts
