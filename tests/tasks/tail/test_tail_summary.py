"""TAIL's summary hooks: Table 2 as W&B summary metrics and Figure 5's grid as the family's heatmap."""

from __future__ import annotations

import pyarrow as pa

from longeval.tasks.tail import FAMILY
from longeval.tasks.tail.summary import GRID_SCHEMA, HEADLINE_SCHEMA, grid_cells, headline_metrics


def _headline(**values) -> pa.Table:
    row = {"model_id": "m", "shortest": 8192, "longest": 16384, "avg": 50.0, "wavg_inc": 41.67, "wavg_dec": 58.33,
           "ratio": 33.33, "answers": 8, "judged": 0, "judge_mapped": 0, **values}
    return pa.Table.from_pylist([row], schema=HEADLINE_SCHEMA)


def test_table_2_numbers_are_summary_metrics_under_the_headline_table():
    assert headline_metrics(_headline()) == {"tail_headline/avg": 50.0, "tail_headline/wavg_inc": 41.67,
                                             "tail_headline/wavg_dec": 58.33, "tail_headline/ratio": 33.33}
    assert headline_metrics(_headline(ratio=None)).keys() == {"tail_headline/avg", "tail_headline/wavg_inc",
                                                              "tail_headline/wavg_dec"}  # no number, no metric


def test_the_grid_is_the_heatmap_with_accuracy_as_score():
    grid = pa.Table.from_pylist([{"model_id": "m", "target_length": 8192, "depth": 25.0, "n": 4, "accuracy": 75.0}],
                                schema=GRID_SCHEMA)
    [cell] = grid_cells(grid)
    assert (cell["target_length"], cell["depth"], cell["n"], cell["score"]) == (8192, 25.0, 4, 75.0)


def test_the_family_declares_its_hooks_and_panels():
    tables = {t.name: t for t in FAMILY.tables}
    assert tables["tail_headline"].metrics is headline_metrics and tables["tail_grid"].heatmap is grid_cells
    panel_metrics = {m for panel in FAMILY.panels for m in panel.metrics}
    assert panel_metrics == set(headline_metrics(_headline()))  # every panel bar is a metric the hook gives
