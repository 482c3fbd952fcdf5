"""The terminal report: tasks by lengths, nulls, the Avg row and the headline line."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from rich.console import Console

from longeval.records import SCORE_SCHEMA
from longeval.report.table import format_length, render_results
from longeval.stats.aggregate import headline, length_table, summarise


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (4096, "4K"),
        (8192, "8K"),
        (131072, "128K"),
        (1048576, "1M"),
        (2097152, "2M"),
        (1024, "1K"),
        (512, "512"),
        (100000, "100000"),
        (3072, "3072"),
        (0, "0"),
    ],
)
def test_format_length(n: int, text: str) -> None:
    assert format_length(n) == text


def make_scores(
    cells: dict[tuple[str, int], list[tuple[float, str]]], *, model_id: str = "model-a"
) -> pa.Table:
    rows = [
        {
            "instance_id": f"{model_id}-{task}-{length}-{i}",
            "model_id": model_id,
            "family": "ruler",
            "task": task,
            "target_length": length,
            "depth": 0.5,
            "metric": "string_match_all",
            "score": score,
            "parsed_answer": "",
            "error_type": error_type,
            "extra": "{}",
        }
        for (task, length), samples in cells.items()
        for i, (score, error_type) in enumerate(samples)
    ]
    return pa.Table.from_pylist(rows, schema=SCORE_SCHEMA)


def render(scores: pa.Table) -> str:
    summary = summarise(scores)
    lengths = length_table(summary)
    console = Console(record=True, width=150)
    console.print(render_results(summary, lengths, headline(lengths)))
    return console.export_text()


def row_cells(text: str, first: str) -> list[str]:
    """The cells of the one table row whose first cell is `first`."""
    rows = [[cell.strip() for cell in re.split("[│┃]", line)[1:-1]] for line in text.splitlines()]
    (row,) = [row for row in rows if row and row[0] == first]
    return row


def test_render_table_layout() -> None:
    scores = make_scores(
        {
            ("niah_single_1", 4096): [(1.0, ""), (1.0, "")],
            ("niah_single_1", 1048576): [(1.0, ""), (0.0, "null")],
            ("vt", 4096): [(0.5, ""), (0.0, "null")],
            ("vt", 1048576): [(0.0, "null"), (0.0, "null")],
        }
    )
    text = render(scores)
    assert "model-a · ruler" in text
    assert row_cells(text, "task") == ["task", "4K", "1M", "nulls"]
    assert row_cells(text, "niah_single_1") == ["niah_single_1", "100.00", "50.00", "1"]
    assert row_cells(text, "vt") == ["vt", "25.00", "0.00", "3"]
    assert row_cells(text, "Avg") == ["Avg", "62.50", "25.00", "4"]
    assert "Avg 43.75 · wAvg(inc) 37.50 · wAvg(dec) 50.00" in text
    assert "effective length: none (no length > 85.6)" in text


def test_render_effective_length_and_failures() -> None:
    scores = make_scores(
        {
            ("qa_1", 4096): [(1.0, "")],
            ("qa_1", 131072): [(0.0, "prompt_too_long")],
            ("qa_1", 100000): [(0.0, "engine_error")],
        }
    )
    text = render(scores)
    assert row_cells(text, "task") == ["task", "4K", "100000", "128K", "nulls"]
    assert "effective length 4K (> 85.6)" in text
    assert "1 prompt(s) too long (scored 0)" in text
    assert "1 engine error(s) (scored 0)" in text


def test_render_missing_cell_and_several_models() -> None:
    scores = pa.concat_tables(
        [
            make_scores({("cwe", 4096): [(1.0, "")], ("fwe", 8192): [(1.0, "")]}, model_id="model-b"),
            make_scores({("cwe", 4096): [(0.9, "")]}, model_id="model-a"),
        ]
    )
    text = render(scores)
    assert text.index("model-a · ruler") < text.index("model-b · ruler")
    assert row_cells(text, "fwe") == ["fwe", "–", "100.00", "0"]
    assert "effective length 8K (> 85.6)" in text


def test_errors_and_ladder_render_every_kind_and_rung():
    from longeval.report.table import render_errors, render_ladder

    errors = pa.Table.from_pylist([
        {"model_id": "m", "family": "sync", "task": "shortest_path", "target_length": 4096,
         "error_type": "invalid_path", "count": 2, "n": 4, "share": 50.0},
        {"model_id": "m", "family": "sync", "task": "shortest_path", "target_length": 4096,
         "error_type": "no_answer", "count": 1, "n": 4, "share": 25.0},
    ])
    ladder = pa.Table.from_pylist([{"model_id": "m", "domain": "graph", "target_length": 4096,
                                    "retrieval": 75.0, "tracking": 25.0, "global": None}])
    console = Console(width=200, record=True)
    console.print(render_errors(errors))
    console.print(render_ladder(ladder))
    text = console.export_text()
    assert "invalid_path" in text and "50.0" in text and "25.0" in text and "no_answer" in text
    assert "retrieval" in text and "75.00" in text and "4K" in text


def test_headline_line_shows_intervals_when_the_scores_were_given() -> None:
    scores = make_scores({("qa_1", 4096): [(1.0, "")] * 20, ("qa_1", 8192): [(1.0, "")] * 17 + [(0.0, "")] * 3})
    summary = summarise(scores)
    lengths = length_table(summary, scores=scores)
    console = Console(record=True, width=250)
    console.print(render_results(summary, lengths, headline(lengths, scores=scores)))
    text = console.export_text()
    (row,) = headline(lengths, scores=scores).to_pylist()
    assert f"Avg {row['avg']:.2f} [{row['avg_ci_low']:.2f}, {row['avg_ci_high']:.2f}]" in text
    assert "effective length 4K (> 85.6), 95% CI 4K–8K" in text


def test_summaries_written_before_intervals_still_render() -> None:
    """Run roots from before `ci_method` and the headline intervals: their tables lack those columns."""
    scores = make_scores({("qa_1", 4096): [(1.0, ""), (0.5, "")]})
    summary = summarise(scores).drop_columns(["ci_method"])
    lengths = length_table(summary).drop_columns(["ci_low", "ci_high"])
    head = headline(lengths)
    old_head = head.select([c for c in head.column_names if "_ci_" not in c and not c.endswith(("_low", "_high"))])
    console = Console(record=True, width=150)
    console.print(render_results(summary, lengths, old_head))
    assert "Avg 75.00 · wAvg(inc) 75.00 · wAvg(dec) 75.00 · effective length: none" in console.export_text()
