"""Which shards a stage holds, and remembered listings: a run root that lists each stage folder once and keeps what
it found.

On S3 a listing is a request per 1,000 keys, and a driver asks for a stage's shards a dozen times in one command. A
root made with `remember_listings` keeps each folder's listing (with the files' sizes), updated by its own writes
and deletes, and with it the commit records and small files it read meanwhile: one snapshot of the root for one
command. While other processes write a stage, the caller says so (`written_elsewhere`), and that stage is listed
afresh on every call until the block ends.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyarrow import fs as pafs

from longeval.store.shard_format import MANIFEST, PARQUET

__all__ = ["Elsewhere", "RememberedListings", "StoredShard"]


@dataclass
class Elsewhere:
    """What the processes writing a stage during `RunRoot.written_elsewhere` committed, as they reported it."""

    written: set[str] = field(default_factory=set)
    """Names of the shards they committed."""
    complete: bool = False
    """Set when `written` is every shard they committed (none of them died): the root then knows the stage
    without listing it again."""


@dataclass(frozen=True)
class StoredShard:
    """A shard's files as they lie in the store, finished or not, for housekeeping (pruning a cache)."""

    name: str
    data: pafs.FileInfo | None
    """The Parquet file, None when it is missing."""
    record: pafs.FileInfo | None
    """The commit record, None when the shard was never committed (cut short) or was uncommitted."""

    @property
    def committed(self) -> bool:
        return self.data is not None and self.record is not None

    @property
    def size(self) -> int:
        """Bytes of both files (as listed: a hard-linked file counts in full)."""
        return sum(info.size or 0 for info in (self.data, self.record) if info is not None)

    @property
    def mtime_ns(self) -> int:
        """The later modification time of the two files: when the shard was last written or marked used."""
        return max((info.mtime_ns or 0) for info in (self.data, self.record) if info is not None)


class RememberedListings:
    """`RunRoot`'s listings of its stages: which shards are finished and their sizes, from the store or, on a root
    that remembers listings, from what it listed before; and every shard's files, for housekeeping
    (`stored_shards`).

    A part of `RunRoot`, not used alone: it stands on the root's `_loc`, `_rel`, `_commit_name` and `exists`, and a
    file that changes drops what `StageReads` kept of its shard (`_drop_kept`).
    """

    def _start_listings(self, remember: bool) -> None:
        """Nothing remembered yet: a new root, or one unpickled in another process (which sees other writes, and
        never remembers)."""
        self._listed: dict[str, dict[str, int | None]] | None = {} if remember else None
        """The files in each listed folder (`rel` -> base name -> bytes, None when unknown: written here since),
        when listings are remembered; the sizes spare a HEAD request per read on S3."""
        self._records: dict[str, dict[str, Any]] = {}
        """Commit records read while their folder's listing was remembered (record path -> record)."""
        self._elsewhere: Counter[str] = Counter()
        """Folders other processes are writing now: never remembered."""
        self._small: dict[str, bytes | None] = {}
        """Small files read through `read_if_exists` while listings are remembered (rel -> bytes, None: none)."""

    def shard_names(self, stage: str) -> set[str]:
        """Names of the finished shards of a stage (without `.parquet`): written and committed, what a rerun
        may skip."""
        written = {
            base[: -len(PARQUET)]
            for base in self._files(self._rel(stage))
            if base.endswith(PARQUET) and not base.startswith(".")
        }
        committed = {base.removesuffix(".json") for base in self._files(self._rel(MANIFEST, stage))}
        return written & committed

    def shard_sizes(self, stage: str) -> dict[str, int | None]:
        """The finished shards of a stage and their bytes as listed (None when not known), for readers in other
        processes: `read_shard(size=...)` and `open_shard(size=...)` then skip a request each."""
        return {name: self._size(stage, name) for name in self.shard_names(stage)}

    def _size(self, stage: str, name: str) -> int | None:
        folder = self._rel(stage)
        return self._listed[folder].get(name + PARQUET) if self._remembered(folder) else None

    def has(self, stage: str, name: str) -> bool:
        """Whether the shard `name` of `stage` is finished (written and committed): from the stage's listing on a
        root that remembers listings (listed now if need be: the reads that follow use it), else two HEADs."""
        folders = (self._rel(stage), self._rel(MANIFEST, stage))
        if self._listed is not None and all(self._elsewhere[folder] <= 0 for folder in folders):
            return name in self.shard_names(stage)
        return self.exists(self._commit_name(stage, name)) and self.exists(f"{self._rel(stage)}/{name}{PARQUET}")

    def stored_shards(self, stage: str) -> list[StoredShard]:
        """Every shard of a stage with a data file or a commit record, finished or not, sorted by name."""
        data = {info.base_name[: -len(PARQUET)]: info for info in self._loc.listing(self._rel(stage))
                if info.base_name.endswith(PARQUET) and not info.base_name.startswith(".")}
        records = {info.base_name.removesuffix(".json"): info
                   for info in self._loc.listing(self._rel(MANIFEST, stage)) if info.base_name.endswith(".json")}
        return [StoredShard(name, data.get(name), records.get(name)) for name in sorted(data.keys() | records.keys())]

    @contextmanager
    def written_elsewhere(self, stage: str) -> Iterator[Elsewhere]:
        """While this block runs, other processes write `stage`: its listings are not remembered (and those
        remembered before are dropped, at the start and at the end).

        When the writers say what they committed (the block's `Elsewhere`, `complete`), the listings remembered
        before the block are kept with those shards added, instead of listing the stage again after it (the infer
        stage's replicas report their parts: its merge at the end then lists nothing)."""
        folders = (self._rel(stage), self._rel(MANIFEST, stage))
        before = {f: dict(self._listed[f]) for f in folders if self._remembered(f)}  # type: ignore[index]
        self._elsewhere.update(folders)
        self._forget(*folders)
        others = Elsewhere()
        try:
            yield others
        finally:
            self._elsewhere.subtract(folders)
            self._forget(*folders)
        if others.complete and len(before) == 2 and self._listed is not None \
                and all(self._elsewhere[f] <= 0 for f in folders):
            data, records = before[folders[0]], before[folders[1]]
            data.update({name + PARQUET: None for name in others.written if name + PARQUET not in data})
            records.update({name + ".json": None for name in others.written})
            self._listed.update({folders[0]: data, folders[1]: records})

    def forget_listings(self) -> None:
        """Drop every remembered listing and kept table: another process changed the root in a way this one
        was not told of (a damaged shard set aside by a replica or a generation actor)."""
        if self._listed is not None:
            self._listed.clear()
        self._forget_kept()
        self._small.clear()
        self._records.clear()

    # -- remembered listings ----------------------------------------------------------------------------

    def _files(self, rel: str) -> set[str]:
        """Base names of the files directly in `rel`: remembered, or listed (and then remembered, with their
        sizes, if allowed)."""
        if self._remembered(rel):
            return set(self._listed[rel])
        listing = {info.base_name: info.size for info in self._loc.listing(rel)}
        if self._listed is not None and self._elsewhere[rel] <= 0:
            self._listed[rel] = listing
        return set(listing)

    def _remembered(self, rel: str) -> bool:
        return self._listed is not None and rel in self._listed and self._elsewhere[rel] <= 0

    def _wrote(self, *rels: str, size: int | None = None) -> None:
        if self._listed is not None:
            for rel in rels:
                folder, base = posixpath.split(rel)
                if folder in self._listed:
                    self._listed[folder][base] = size
                self._records.pop(rel, None)
                self._small.pop(rel, None)
                self._drop_kept(folder, base)

    def _removed(self, *rels: str) -> None:
        if self._listed is not None:
            for rel in rels:
                folder, base = posixpath.split(rel)
                if folder in self._listed:
                    self._listed[folder].pop(base, None)
                self._records.pop(rel, None)
                self._small.pop(rel, None)
                self._drop_kept(folder, base)

    def _forget(self, *rels: str) -> None:
        if self._listed is not None:
            for rel in rels:
                self._listed.pop(rel, None)
                self._drop_kept(rel)
                for record in [r for r in self._records if posixpath.dirname(r) == rel]:
                    del self._records[record]
