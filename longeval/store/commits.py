"""Committing shards: a shard's data file, then its commit record, and every change to what is committed (copies,
removals, damaged shards set aside, adoption of a root from before commit records).

A shard is committed in two steps: the data is written atomically (a local temp file renamed into place; on S3 a
single object upload, which only becomes visible when complete), then a small commit record
`<root>/_manifest/<stage>/<name>.json` (rows, bytes, sha256) is written. Only shards with a commit record exist for
readers, so a shard cut short by a crash, or half-written by a store without atomic publish, is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from longeval.errors import DamagedShardError, StoreError
from longeval.store.location import CopyKind
from longeval.store.shard_format import MANIFEST, PARQUET, encode_shard
from longeval.store.shards import PART_PREFIX

if TYPE_CHECKING:
    from longeval.store.run_root import RunRoot

__all__ = ["LEGACY_STAGES", "CopiedShard", "ShardCommits"]

log = logging.getLogger(__name__)

LEGACY_STAGES = ("instances", "predictions", "scores", "summary")
"""The stages a run root written before commit records may hold (`RunRoot.adopt_legacy`)."""


@dataclass(frozen=True)
class CopiedShard:
    """What `RunRoot.copy_shard` published: the shard's rows and bytes (from its commit record), and how the data
    file got there (`longeval.store.location.CopyKind`: "link", "copy", "server-side copy" or "stream")."""

    rows: int
    bytes: int
    how: CopyKind


class ShardCommits:
    """`RunRoot`'s writes of shards and their commit records, and the records read back.

    A part of `RunRoot`, not used alone: it stands on the root's `_loc`, `_rel`, `_commit_name`, `path` and small
    files (`read_bytes`, `write_bytes`), and keeps its listings up to date (`_wrote`, `_removed`, `_records`).
    """

    def write_table(self, stage: str, name: str, table: pa.Table) -> None:
        """Write one shard and commit it: readers see the whole shard or none of it."""
        # Serialise first, so a failure while encoding never reaches the store; the write is then one atomic
        # file rename or object upload, and the commit record after it publishes the shard.
        data = encode_shard(table)
        self._loc.write_bytes(self._rel(stage, name + PARQUET), data)
        self._wrote(self._rel(stage, name + PARQUET), size=data.size)
        record = {"rows": table.num_rows, "bytes": data.size, "sha256": hashlib.sha256(data).hexdigest()}
        self.write_bytes(self._commit_name(stage, name), json.dumps(record, sort_keys=True).encode("utf-8"))
        if self._remembered(self._rel(MANIFEST, stage)):
            self._records[self._commit_name(stage, name)] = record

    def commit_record(self, stage: str, name: str) -> dict[str, Any]:
        """The commit record of a finished shard: its rows, bytes and sha256 (read once per listing, when
        listings are remembered)."""
        record = self._record(stage, name)
        if record is None:
            raise StoreError(f"shard {self.path(stage, name)} has no commit record; is the stage finished?")
        return record

    def _record(self, stage: str, name: str) -> dict[str, Any] | None:
        """The commit record, or None when there is none; one request (none when remembered)."""
        rel = self._commit_name(stage, name)
        folder = posixpath.dirname(rel)
        remembered = self._remembered(folder)
        if remembered and rel in self._records:
            return self._records[rel]
        if remembered and posixpath.basename(rel) not in self._listed[folder]:
            return None
        raw = self._loc.read_if_exists(rel)
        record = None if raw is None else json.loads(raw)
        if remembered and record is not None:
            self._records[rel] = record
        return record

    def verify(self, stage: str) -> list[str]:
        """Finished shards of a stage whose bytes do not match their commit record (empty when all do)."""
        bad = []
        for name in sorted(self.shard_names(stage)):
            record = self.commit_record(stage, name)
            data = self.read_bytes(f"{stage}/{name}{PARQUET}")
            if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
                bad.append(name)
        return bad

    def write_part(self, stage: str, table: pa.Table, *, key: str = "instance_id") -> str:
        """Write a table of rows as a part named by the hash of its keys (the same rows, the same name)."""
        ids = "\n".join(sorted(str(v) for v in table[key].to_pylist()))
        name = PART_PREFIX + hashlib.sha256(ids.encode("utf-8")).hexdigest()[:16]
        self.write_table(stage, name, table)
        return name

    def copy_shard(self, stage: str, name: str, to: RunRoot, to_name: str, *, check: bool = True) -> CopiedShard:
        """Publish this root's finished shard `name` as `to_name` of `stage` under `to`, without decoding or
        encoding it: the data file is copied (`Location.copy`: a hard link locally, a server-side copy on S3),
        then its commit record, the same two steps as `write_table`, so readers of `to` check it as any shard.

        Args:
            check: first compare the bytes with the commit record (one read, no decode), so a damaged shard is
                never spread. Leave it on unless the shard was just written by this process.

        Raises:
            DamagedShardError: `check` found the bytes (or the record) damaged; the shard was set aside here.
            StoreError: the shard is not committed here, or a store could not be read or written.
        """
        source = f"{stage}/{name}{PARQUET}"
        raw = self.read_bytes(self._commit_name(stage, name))
        try:
            record = json.loads(raw)
            rows, size, sha = int(record["rows"]), int(record["bytes"]), str(record["sha256"])
        except (ValueError, KeyError, TypeError) as exc:
            raise self._set_aside(stage, name, f"its commit record is unreadable ({exc})") from exc
        if check:
            data = self.read_bytes(source)
            if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
                raise self._set_aside(stage, name, "its sha256 does not match its commit record")
        how = self._loc.copy(self._rel(source), to._loc, to._rel(stage, to_name + PARQUET))
        self._loc.copy(self._commit_name(stage, name), to._loc, to._commit_name(stage, to_name))
        to._wrote(to._rel(stage, to_name + PARQUET), size=size)  # known: the sizes a scorer is handed stay ints
        to._wrote(to._commit_name(stage, to_name))
        return CopiedShard(rows=rows, bytes=size, how=how)

    def remove_shard(self, stage: str, name: str) -> None:
        """Delete a shard: its commit record first, then its data, so a crash in between leaves an uncommitted
        file (never read, replaced by the next write), never a committed shard without data. Files already gone
        are fine (another process removed them)."""
        self._loc.delete(self._commit_name(stage, name), missing_ok=True)
        self._loc.delete(self._rel(stage, name + PARQUET), missing_ok=True)
        self._removed(self._commit_name(stage, name), self._rel(stage, name + PARQUET))

    def touch(self, stage: str, name: str) -> None:
        """Mark a finished shard as just used (its commit record's modification time), for least recently used
        pruning."""
        self._loc.touch(self._commit_name(stage, name))

    def _set_aside(self, stage: str, name: str, why: str) -> DamagedShardError:
        """Move a damaged shard out of its stage and drop its commit record: readers no longer see it and a
        rerun writes it again."""
        source = f"{stage}/{name}{PARQUET}"
        target = f"_damaged/{stage}/{name}.{uuid.uuid4().hex[:8]}{PARQUET}"
        self.write_bytes(target, self.read_bytes(source))
        self._loc.delete(self._commit_name(stage, name))
        self._loc.delete(self._rel(source))
        self._removed(self._commit_name(stage, name), self._rel(source))
        return DamagedShardError(
            f"damaged shard {self.path(source)}: {why}. It was set aside as {self.path(target)} and will be "
            "written again")

    def adopt_legacy(self, stages: tuple[str, ...] = LEGACY_STAGES) -> int:
        """Commit the shards of a run root written before commit records existed; returns how many.

        Only a root with no `_manifest/` at all is adopted: its writers published each shard atomically, so a
        whole Parquet file is a finished shard. A file whose Parquet footer does not read is left uncommitted
        (it is generated or predicted again). A root that has commit records is never touched: there, a shard
        without one was cut short.
        """
        if any(self._files(self._rel(MANIFEST, stage)) for stage in LEGACY_STAGES):
            return 0  # (every stage that commits is one of these: no recursive listing of every record)
        adopted = 0
        for stage in stages:
            for base in sorted(self._files(self._rel(stage))):
                if not base.endswith(PARQUET) or base.startswith("."):
                    continue
                data = self.read_bytes(f"{stage}/{base}")
                try:
                    rows = pq.read_metadata(pa.BufferReader(data)).num_rows
                except (pa.ArrowInvalid, OSError):
                    log.warning("not adopting %s: not a readable Parquet file", self.path(stage, base))
                    continue
                record = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                          "adopted": True}
                self.write_bytes(self._commit_name(stage, base[: -len(PARQUET)]),
                                 json.dumps(record, sort_keys=True).encode("utf-8"))
                adopted += 1
        return adopted
