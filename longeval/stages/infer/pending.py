"""What is left to infer, read from the run root: the instances' metadata and the ids with a final prediction
(the stage reads them before a round; a driver reads them again when a replica dies, for what it finished)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, ErrorKind
from longeval.store.run_root import RunRoot

__all__ = ["META_COLUMNS", "final_ids", "pending_predictions"]

META_COLUMNS = ["instance_id", "family", "task", "context_id", "target_length", "input_tokens", "max_new_tokens",
                "depth", "seed", "shard_index", "index"]


def pending_predictions(root: RunRoot) -> tuple[pa.Table, set[str]]:
    """Instance metadata, and the ids that already have a final prediction (engine errors are retried)."""
    meta = root.read_stage("instances", INSTANCE_SCHEMA, columns=META_COLUMNS)
    return meta, final_ids(root)


def final_ids(root: RunRoot) -> set[str]:
    """Instances whose prediction is final: written and not an engine error."""
    preds = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "error"])
    final = pc.invert(ErrorKind.ENGINE_ERROR.matches(preds["error"]))
    return set(preds.filter(final)["instance_id"].to_pylist())
