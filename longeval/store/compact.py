"""The predictions stage merged into one file per instance shard: what a long stage's many small parts become.

Replicas commit finished predictions as small parts (`part-<hash>`, one per `cluster.commit_interval_s` per
replica), so a kill -9 loses little. A full suite would leave tens of thousands of them, and every reader of
the stage (resume, scoring, status, the report, tracking) would list and open each one, on S3 a request or
three apiece. So the infer stage merges them when it resumes and when it ends: the parts and earlier merged
files of an instance shard become one file, `<shard>.p<tag>` (`longeval.store.shards`), holding one prediction per
instance, the one every reader would pick (`records.latest_predictions`).

Crash safety is by order. The merged file is written and committed first; only then are the files it replaces
unpublished (commit record) and deleted. A crash in between leaves rows twice, never once less: readers keep
one prediction per instance anyway, and the next merge, which names its file by content, finds that file
written already and finishes the deletions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, content_id, latest_predictions
from longeval.store.run_root import RunRoot
from longeval.store.shards import ORPHANS, ShardName, compacted_name, compacted_prefix

__all__ = ["SHARD_COLUMNS", "Compaction", "compact_predictions", "shard_prefixes"]

log = logging.getLogger(__name__)

STAGE = "predictions"
SHARD_COLUMNS = ["instance_id", "family", "task", "target_length", "seed", "shard_index"]
"""What maps an instance to its generated shard (`ShardName.of`)."""


@dataclass(frozen=True)
class Compaction:
    """What one merge did: files read and written, and rows kept."""

    read: int = 0
    written: int = 0
    removed: int = 0
    rows: int = 0


def compact_predictions(root: RunRoot, meta: pa.Table | None = None,
                        given_away: Collection[tuple[str, str]] = ()) -> Compaction:
    """Merge the predictions stage's parts into one file per instance shard; a stage without parts is left
    as it is, so a finished run's rerun reads nothing here.

    `meta`: the instances' shard columns (`SHARD_COLUMNS`), when the caller has read them already.
    `given_away`: rows that give way to any other final row of their instance (`latest_predictions`).
    """
    names = root.shard_names(STAGE)
    parts = sorted(n for n in names if compacted_prefix(n) is None)
    if not parts:
        return Compaction()
    shard_of = shard_prefixes(root, meta)
    new_rows = root.read_stage(STAGE, PREDICTION_SCHEMA, names=parts)
    touched = {shard_of.get(i, ORPHANS) for i in new_rows["instance_id"].to_pylist()}
    merged = sorted(n for n in names if compacted_prefix(n) in touched)
    # Merged files first, then parts: among equal rows the reader's choice does not matter, and a part's
    # retry of an engine error replaces the error either way.
    rows = pa.concat_tables([root.read_stage(STAGE, PREDICTION_SCHEMA, names=merged), new_rows])
    keep = latest_predictions(rows, given_away)
    groups = pc.array_sort_indices(keep["instance_id"])
    keep = keep.take(groups)
    prefixes = [shard_of.get(i, ORPHANS) for i in keep["instance_id"].to_pylist()]
    written = []
    for prefix in sorted(set(prefixes)):
        table = keep.filter(pa.array([p == prefix for p in prefixes], pa.bool_()))
        name = compacted_name(prefix, _tag(table))
        if name not in names:
            root.write_table(STAGE, name, table)
        written.append(name)
    stale = [n for n in (*merged, *parts) if n not in written]
    for name in stale:
        root.remove_shard(STAGE, name)
    done = Compaction(read=len(merged) + len(parts), written=len(set(written) - names), removed=len(stale),
                      rows=keep.num_rows)
    log.info("predictions: %d files merged into %d (%d rows)", done.read, len(written), done.rows)
    return done


def shard_prefixes(root: RunRoot, meta: pa.Table | None = None) -> dict[str, str]:
    """Each instance's generated shard (`ShardName.of(...).prefix`) by id: where a part's predictions belong.
    `meta`: the instances' `SHARD_COLUMNS` when the caller has them (else read: a driver that read the metadata
    columns already has them kept, `RunRoot.read_stage`)."""
    if meta is None:
        meta = root.read_stage("instances", INSTANCE_SCHEMA, columns=SHARD_COLUMNS)
    prefixes = (ShardName.of(row).prefix for row in meta.select(SHARD_COLUMNS[1:]).to_pylist())
    return dict(zip(meta["instance_id"].to_pylist(), prefixes, strict=True))


def _tag(table: pa.Table) -> str:
    """A short hash of the rows: the same predictions give the same name, so a merge cut short is redone
    without writing its file twice."""
    return content_id(json.dumps(table.to_pylist(), sort_keys=True, default=str))[:12]
