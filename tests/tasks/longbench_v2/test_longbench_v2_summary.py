"""LongBench v2's summary hook: Table 2's accuracies (and Table 5's compensated ones) as W&B summary metrics."""

from __future__ import annotations

import pyarrow as pa

from longeval.tasks.longbench_v2 import FAMILY
from longeval.tasks.longbench_v2.data import DIFFICULTIES, DOMAINS, LENGTHS
from longeval.tasks.longbench_v2.summary import BREAKDOWN_SCHEMA, breakdown_metrics


def _row(split: str, group: str, accuracy: float | None, compensated: float | None) -> dict:
    return {"model_id": "m", "split": split, "group": group, "n": 4, "accuracy": accuracy,
            "compensated_accuracy": compensated, "invalid_rate": 0.0}


def test_breakdown_groups_are_summary_metrics_and_missing_numbers_are_left_out():
    table = pa.Table.from_pylist([_row("overall", "overall", 50.0, 56.25), _row("difficulty", "hard", 25.0, None),
                                  _row("domain", "Single-Document QA", None, 30.0)], schema=BREAKDOWN_SCHEMA)
    assert breakdown_metrics(table) == {"breakdown/overall": 50.0, "compensated/overall": 56.25,
                                        "breakdown/hard": 25.0, "compensated/Single-Document QA": 30.0}


def test_the_family_declares_the_hook_panels_and_no_depth():
    [table] = FAMILY.tables
    assert table.metrics is breakdown_metrics and not FAMILY.has_depth
    bars = {m for panel in FAMILY.panels for m in panel.metrics}
    groups = ("overall", *DIFFICULTIES, *LENGTHS, *DOMAINS)
    every = {f"breakdown/{g}" for g in groups} | {f"compensated/{g}" for g in groups}
    assert bars <= every and "breakdown/hard" in bars and "compensated/overall" in bars
