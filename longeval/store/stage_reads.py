"""Reading a stage's shards, whole or some of their columns, checked for damage; and what a root that remembers
listings keeps of those reads (the metadata columns, the footers, the footers' copies) within a budget.

A driver reads a stage's metadata columns several times per command (what is planned, what is left, what a report
shows): kept, they cost their requests once per command. Prompts and outputs (`BULKY_COLUMNS`) are never kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from longeval.errors import StoreError
from longeval.heap import release_freed_memory
from longeval.store.shard_format import (
    BULKY_COLUMNS,
    MANIFEST,
    PARQUET,
    Unreadable,
    damaged_page,
    footer_copy,
    from_copy,
    own_order,
)

__all__ = ["KEPT_FOOTER_BYTES", "READ_BATCH", "READ_THREADS", "KeptReads", "StageReads"]

T = TypeVar("T")

READ_THREADS = 8
"""Shards read at once by `read_stage`: S3 round trips overlap, and a local disk does not mind."""

READ_BATCH = 64
"""Shards whose metadata columns `read_stage` gathers into one contiguous table at a time. Each shard's columns
are a few small buffers; thousands of them left scattered over the heap pin its pages, so a driver that read
the metadata of 792 shards (2.5 MB of Arrow) held 70 MB more (benchmarks/README.md, "The full shape, again")."""

KEPT_FOOTER_BYTES = 4 << 20
"""Parquet footers a root that remembers listings keeps (`_read_columns`), counted serialized (about seven times as
much once parsed): a long prompts' shard has a row group per prompt and a footer of 125 KB, and keeping all 792 of
the full shape's footers held 160 MB. Beyond this a later read of other columns reads the footer again. (A
footer's size counts its copy of the metadata columns, `FOOTER_METADATA`: `serialized_size` includes key-value
metadata.) A shard whose footer has that copy keeps the copy instead, decoded, counted by its Arrow bytes: the
parsed footers of Michelangelo 1M's 816 shards filled the budget at 10x where 1x's 87 kept all of theirs, and the
driver grew 11 % from 1x to 10x (benchmarks/README.md, "Suite (c)'s driver")."""


@dataclass(frozen=True)
class KeptReads:
    """What a root keeps of its reads at one moment (`StageReads.kept_reads`), each by (stage, shard name): a
    testing seam, for the tests that hold the driver's memory to its bounds."""

    columns: dict[tuple[str, str], pa.Table]
    """Metadata columns kept."""
    footers: dict[tuple[str, str], pads.ParquetFileFragment]
    """Shards kept open with their parsed Parquet footers."""
    copies: dict[tuple[str, str], tuple[pa.Table, pa.Schema]]
    """Footers' copies of the metadata columns kept instead of the footers, each with the file's schema."""
    footer_bytes: int
    """The footers and copies kept so far, in the bytes they count against `KEPT_FOOTER_BYTES` (a dropped one still
    counts)."""


class StageReads:
    """`RunRoot`'s reads of whole stages and of shards' columns, and what it keeps of them.

    A part of `RunRoot`, not used alone: it stands on the root's `_loc`, `_rel`, `path`, `uri` and `read_bytes`,
    its listings (`shard_names`, `_remembered`, `_size`), commit records (`_record`), `check_columns`, and
    `_set_aside` for a damaged shard.
    """

    def _start_reads(self) -> None:
        """Nothing kept yet: a new root, or one unpickled in another process."""
        self._kept: dict[tuple[str, str], pa.Table] = {}
        """Metadata columns read while the stage's listing was remembered: (stage, shard name) -> its columns."""
        self._footers: dict[tuple[str, str], pads.ParquetFileFragment] = {}
        """Shards opened for column reads while the stage's listing was remembered, each with its Parquet footer
        (read by the first read): a later read of other columns fetches only their pages. At most
        `KEPT_FOOTER_BYTES` of footers."""
        self._copies: dict[tuple[str, str], tuple[pa.Table, pa.Schema]] = {}
        """Of a shard read while the stage's listing was remembered whose footer copies its metadata columns
        (`FOOTER_METADATA`): that copy and the file's schema, kept instead of its footer. Later metadata reads of
        the shard need no request; a read of its bulky columns reads the footer again."""
        self._footer_bytes = 0
        self._footer_keys: set[tuple[str, str]] = set()
        """The footers kept so far, counted (`_footer_room`); dropped footers still count: the budget bounds
        what one command keeps."""
        self._wanted: dict[str, list[str]] = {}
        """Metadata columns a command said it will read, per stage (`will_read`)."""

    def kept_reads(self) -> KeptReads:
        """A snapshot of what is kept of the reads so far (a testing seam: nothing else reads it)."""
        return KeptReads(dict(self._kept), dict(self._footers), dict(self._copies), self._footer_bytes)

    def stage_files(self, stage: str) -> tuple[pafs.FileSystem, list[str]]:
        """The filesystem and full paths of a stage's finished shards, for `ray.data.read_parquet`."""
        return self._loc.fs, [self._loc.full(self._rel(stage, n + PARQUET)) for n in sorted(self.shard_names(stage))]

    def read_stage(
        self, stage: str, schema: pa.Schema | None = None, *, columns: list[str] | None = None,
        names: Iterable[str] | None = None, sizes: Mapping[str, int | None] | None = None,
    ) -> pa.Table:
        """All finished shards of a stage (or those of `names`), concatenated in sorted shard-name order.

        With no shards, an empty table with `schema` (or with no columns when `schema` is None).
        `columns` reads only those columns (prompts are large; metadata reads should not pay for them): those
        pages are checked against their Parquet checksums, a whole shard against its commit record's sha256.
        Shards are read a few at a time: on S3 each costs a round trip or two. `sizes`: the shards' bytes as
        another process listed them (`shard_sizes`), sparing a request each.
        """
        names = sorted(self.shard_names(stage) if names is None else names)
        if not names:
            if columns is not None and schema is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table() if schema is not None else pa.table({})
        sizes = sizes or {}
        # A driver reads a stage's metadata columns several times per command (what is planned, what is left,
        # what a report shows): a root that remembers the stage's listing keeps each shard's, until it changes.
        # A stage with no bulky column (scores) is all metadata: its whole reads are kept too.
        remembered = self._remembered(self._rel(stage)) and self._remembered(self._rel(MANIFEST, stage))
        if columns is None and schema is not None and remembered and not BULKY_COLUMNS & set(schema.names):
            columns = schema.names
        metadata = columns is not None and not BULKY_COLUMNS & set(columns)
        keep = metadata and remembered
        read = self._read_kept if keep else self.read_shard
        tables: list[pa.Table] = []
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(names))) as pool:
            for start in range(0, len(names), READ_BATCH):
                batch = names[start:start + READ_BATCH]
                parts = list(pool.map(lambda n: read(stage, n, schema, columns=columns, size=sizes.get(n)), batch))
                if keep:
                    parts = self._gather_kept(stage, batch, columns) or parts
                elif metadata:
                    parts = [self._concat(stage, parts, schema).combine_chunks()]
                tables += parts
        stage_table = self._concat(stage, tables, schema)
        release_freed_memory()  # the read threads' buffers, else kept: the driver grew with the shards read
        return stage_table

    def _concat(self, stage: str, tables: list[pa.Table], schema: pa.Schema | None) -> pa.Table:
        try:
            return pa.concat_tables(tables, promote_options="default" if schema is None else "none")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise StoreError(
                f"shards of stage {stage!r} under {self.uri} have incompatible schemas ({exc}); "
                "were they written by different longeval versions? Use a fresh run root or delete the stage"
            ) from exc

    def _gather_kept(self, stage: str, names: list[str], columns: list[str]) -> list[pa.Table] | None:
        """The kept columns of `names` moved into one contiguous table, each shard's now a slice of it, and
        `columns` of each (`READ_BATCH` says why); None, leaving them as they are, when their columns differ."""
        kept = [self._kept[(stage, name)] for name in names]
        try:
            together = pa.concat_tables(kept).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        out, offset = [], 0
        for name, table in zip(names, kept, strict=True):
            self._kept[(stage, name)] = together.slice(offset, table.num_rows)
            out.append(self._kept[(stage, name)].select(columns))
            offset += table.num_rows
        return out

    def will_read(self, stage: str, columns: Iterable[str]) -> None:
        """Say which metadata columns of `stage` this command will read (never prompts or outputs): on a root that
        remembers listings, the first read of each shard then fetches them all with the columns it asks for, and
        later reads are served from what was kept. On S3 a shard's columns then cost one footer and one or two
        ranges per command (a long prompts' shard, its footer alone: `FOOTER_METADATA`), however many questions the
        command asks of them (issue #22's ≤ 3 requests per file)."""
        wanted = self._wanted.setdefault(stage, [])
        wanted += [c for c in columns if c not in wanted and c not in BULKY_COLUMNS]

    def _read_kept(self, stage: str, name: str, schema: pa.Schema | None, *, columns: list[str],
                   size: int | None) -> pa.Table:
        """`columns` of one shard from the columns kept of it, else read with those kept and those the command
        will read (`will_read`), and kept. A stage with no bulky column (scores) is all metadata: all of its columns
        are read at once (what a command asks of it first, a few columns, is rarely all it asks)."""
        kept = self._kept.get((stage, name))
        if kept is not None and set(columns) <= set(kept.column_names):
            table = kept.select(columns)
            if schema is None or table.schema.equals(pa.schema([schema.field(c) for c in columns])):
                return table
        known = set(schema.names) if schema is not None else set(columns)  # without a schema: only those asked
        wanted = schema.names if schema is not None and not BULKY_COLUMNS & known else self._wanted.get(stage, [])
        wider = [*columns, *(c for c in [*(kept.column_names if kept is not None else ()), *wanted]
                             if c in known and c not in columns)]
        table = self.read_shard(stage, name, schema, columns=list(dict.fromkeys(wider)), size=size)
        self._kept[(stage, name)] = table
        return table.select(columns)

    def read_shard(self, stage: str, name: str, schema: pa.Schema | None = None, *,
                   columns: list[str] | None = None, size: int | None = None) -> pa.Table:
        """One finished shard of a stage (only `columns`, when given), checked for damage.

        A whole read checks the bytes against the commit record's sha256. A read of some columns fetches only
        their pages (the footer says where they are) and Parquet's page checksums check what it reads: metadata
        reads never pay for prompts and token ids, nor for hashing them. Metadata columns the footer copies
        (`FOOTER_METADATA`) come from that copy, checked against its sha256: the footer is the only read.

        Raises:
            DamagedShardError: the bytes do not match the record's sha256 (a damaged disk, a hand edit, a
                partial copy); the shard is set aside under `_damaged/` and uncommitted, so a rerun redoes it.
        """
        if columns is not None:
            if schema is not None:
                schema = pa.schema([schema.field(c) for c in columns])
            return self._read_columns(stage, name, schema, columns, size=size)
        data = self.read_bytes(f"{stage}/{name}{PARQUET}")
        record = self._record(stage, name)
        if record is not None and (len(data) != record["bytes"]
                                   or hashlib.sha256(data).hexdigest() != record["sha256"]):
            raise self._set_aside(stage, name, "its sha256 does not match its commit record")
        try:
            table = pq.read_table(pa.BufferReader(data), schema=schema, columns=columns)
            return own_order(table) if schema is None else table
        except (pa.ArrowInvalid, OSError) as exc:
            raise self._set_aside(stage, name, f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc

    def _read_columns(self, stage: str, name: str, schema: pa.Schema | None, columns: list[str], *,
                      size: int | None = None) -> pa.Table:
        rel = self._rel(stage, name + PARQUET)
        size = size if size is not None else self._size(stage, name)
        remember = self._remembered(self._rel(stage))  # one snapshot of the stage: its footers stay true

        def read(size: int | None) -> pa.Table:
            key = (stage, name)
            if key in self._copies:
                copy, file_schema = self._copies[key]
                table = from_copy(copy, columns, schema or file_schema)
                if table is not None:
                    return table
            try:
                # A kept fragment holds the footer its first read fetched (taken out while in use: a failed read's
                # retry opens the file afresh, without a size that may be stale)
                fragment = self._footers.pop(key, None) or self._loc.parquet(rel, size=size)
                if schema is None:
                    self.check_columns(stage, name, fragment, columns)
                copy = footer_copy(fragment.metadata)
                table = from_copy(copy, columns, schema or fragment.physical_schema)
                if table is None:
                    table = fragment.to_table(schema=schema, columns=columns)
                if remember and copy is not None:
                    if self._footer_room(key, copy.nbytes):
                        self._copies[key] = (copy, fragment.physical_schema)
                elif remember and self._footer_room(key, fragment.metadata.serialized_size):
                    self._footers[key] = fragment
                return table
            except pa.ArrowInvalid as exc:
                raise Unreadable(f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc
            except OSError as exc:
                damaged = damaged_page(exc)
                if damaged is None:
                    raise  # not `raise exc from exc`: an error its own cause loops the drivers' cause walks
                raise damaged from exc

        return self._sized(stage, name, read, size)

    def _footer_room(self, key: tuple[str, str], size: int) -> bool:
        """Whether keeping a shard's footer (or its copy, `_copies`) of `size` bytes stays within `KEPT_FOOTER_BYTES`
        (counted once per shard: a footer taken out for a read and put back is not counted again)."""
        if key in self._footer_keys:
            return True
        if self._footer_bytes + size > KEPT_FOOTER_BYTES:
            return False
        self._footer_bytes += size
        self._footer_keys.add(key)
        return True

    def _sized(self, stage: str, name: str, read: Callable[[int | None], T], size: int | None) -> T:
        """`read(size)` through the store's retries; a shard it finds unreadable is set aside, but only once a
        read without the listed size agrees (that size may be stale: the shard written again since)."""
        what = f"read {self.path(stage, name + PARQUET)}"
        try:
            return self._loc.call(what, read, size)
        except Unreadable as exc:
            if size is None:
                raise self._set_aside(stage, name, str(exc)) from exc
        try:
            return self._loc.call(what, read, None)
        except Unreadable as exc:
            raise self._set_aside(stage, name, str(exc)) from exc

    # -- what is kept -----------------------------------------------------------------------------------

    def _drop_kept(self, folder: str, base: str | None = None) -> None:
        """Forget the columns and footer kept of the shard whose data or commit record is `base` in `folder` (of
        every shard of the stage there when `base` is None)."""
        stage = folder.removeprefix(MANIFEST + "/")
        name = None if base is None else base.removesuffix(PARQUET).removesuffix(".json")
        for kept in (self._kept, self._footers, self._copies):
            for key in [k for k in kept if self._rel(k[0]) == stage and name in (None, k[1])]:
                del kept[key]

    def _forget_kept(self) -> None:
        """Forget every shard's kept columns and footer (`forget_listings`); the footers' budget keeps its count."""
        self._kept.clear()
        self._footers.clear()
        self._copies.clear()
