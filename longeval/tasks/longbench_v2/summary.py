"""LongBench v2's Table 2 as a summary table: accuracy overall, by difficulty, length bucket and domain."""

from __future__ import annotations

import pyarrow as pa

from longeval.tasks.family import ScoreRows
from longeval.tasks.longbench_v2.scoring import breakdown

BREAKDOWN_SCHEMA = pa.schema([
    ("model_id", pa.string()), ("split", pa.string()), ("group", pa.string()), ("n", pa.int64()),
    ("accuracy", pa.float64()), ("compensated_accuracy", pa.float64()), ("invalid_rate", pa.float64())])


def breakdown_table(tasks: pa.Table, rows: ScoreRows) -> pa.Table:
    """Per model: Table 2's groups with the compensated accuracy of its Table 5 (item fields from the meta)."""
    out = [{"model_id": model_id, **entry} for model_id, model_rows in rows.items() for entry in breakdown(model_rows)]
    return pa.Table.from_pylist(out, schema=BREAKDOWN_SCHEMA)


def breakdown_metric(group: str, *, compensated: bool = False) -> str:
    """The summary metric name of a group's accuracy, under the family (`breakdown/hard`, `compensated/overall`)."""
    return f"{'compensated' if compensated else 'breakdown'}/{group}"


def breakdown_metrics(table: pa.Table) -> dict[str, float]:
    """Table 2's accuracy (and Table 5's compensated one) per group as W&B summary metrics."""
    out: dict[str, float] = {}
    for row in table.to_pylist():
        if row.get("accuracy") is not None:
            out[breakdown_metric(row["group"])] = row["accuracy"]
        if row.get("compensated_accuracy") is not None:
            out[breakdown_metric(row["group"], compensated=True)] = row["compensated_accuracy"]
    return out
