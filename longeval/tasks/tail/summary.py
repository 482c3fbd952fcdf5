"""TAIL's own summary tables: accuracy by depth and length (its Figure 5), and its Table 2 per model."""

from __future__ import annotations

import json

import pyarrow as pa
from rich.console import Group
from rich.text import Text

from longeval.tasks.family import ScoreRows
from longeval.tasks.tail.scoring import accuracy_grid, length_summary

GRID_SCHEMA = pa.schema([("model_id", pa.string()), ("target_length", pa.int64()), ("depth", pa.float64()),
                         ("n", pa.int64()), ("accuracy", pa.float64())])
HEADLINE_SCHEMA = pa.schema([
    ("model_id", pa.string()), ("shortest", pa.int64()), ("longest", pa.int64()), ("avg", pa.float64()),
    ("wavg_inc", pa.float64()), ("wavg_dec", pa.float64()), ("ratio", pa.float64()),
    ("answers", pa.int64()), ("judged", pa.int64()), ("judge_mapped", pa.int64())])
"""`wavg_inc`/`wavg_dec` here are TAIL's length-weighted averages (weights = the lengths), not RULER's
rank-weighted ones of `summary/headline`; the column names are TAIL's Table 2 headers."""
HEADLINE_METRICS = ("avg", "wavg_inc", "wavg_dec", "ratio")
"""TAIL's Table 2 numbers that W&B gets as summary metrics (`tail/tail_headline/ratio`)."""


def grid_table(tasks: pa.Table, rows: ScoreRows) -> pa.Table:
    """Accuracy per (length, depth) per model: the heatmap of TAIL's Figure 5."""
    return pa.Table.from_pylist(
        [{"model_id": model_id, "target_length": c.target_length, "depth": c.depth, "n": c.n, "accuracy": c.accuracy}
         for model_id, model_rows in rows.items() for c in accuracy_grid(model_rows)], schema=GRID_SCHEMA)


def headline_table(tasks: pa.Table, rows: ScoreRows) -> pa.Table:
    """Per model, TAIL's Table 2: Avg, wAvg(inc), wAvg(dec) over the lengths and the longest/shortest ratio, with
    how many answers went to the judge and how many it mapped."""
    out = []
    for model_id, model_rows in rows.items():
        summary = length_summary(model_rows)
        judged = [r for r in model_rows if json.loads(r["meta"] or "{}").get("mapped_by") == "judge"]
        out.append({"model_id": model_id, "shortest": summary.lengths[0] if summary.lengths else None,
                    "longest": summary.lengths[-1] if summary.lengths else None, "avg": summary.avg,
                    "wavg_inc": summary.length_wavg_inc, "wavg_dec": summary.length_wavg_dec, "ratio": summary.ratio,
                    "answers": len(model_rows), "judged": len(judged),
                    "judge_mapped": sum(1 for r in judged if r["error_type"] != "unmapped")})
    return pa.Table.from_pylist(out, schema=HEADLINE_SCHEMA)


def headline_metric(metric: str) -> str:
    """The summary metric name of a Table 2 number, under the family (`tail_headline/ratio`)."""
    return f"tail_headline/{metric}"


def headline_metrics(table: pa.Table) -> dict[str, float]:
    """Table 2's numbers as W&B summary metrics (the run's one model; a missing number is left out)."""
    return {headline_metric(metric): row[metric] for row in table.to_pylist() for metric in HEADLINE_METRICS
            if row.get(metric) is not None}


def grid_cells(table: pa.Table) -> list[dict]:
    """Figure 5's cells as the family's heatmap: accuracy is the score."""
    return [{**row, "score": row["accuracy"]} for row in table.to_pylist()]


def render_headline(table: pa.Table) -> Group:
    return Group(*[Text(f"TAIL {row['model_id']}: Avg {row['avg']:.2f} · wAvg(inc) {row['wavg_inc']:.2f} · "
                        f"wAvg(dec) {row['wavg_dec']:.2f} · {row['longest']}/{row['shortest']} ratio {row['ratio']}")
                   for row in table.to_pylist()])
