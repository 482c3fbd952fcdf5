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
