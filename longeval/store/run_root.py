"""A run root: the folder (or `s3://` prefix) of one evaluation run, its Parquet shards and their commit records.

Every stage writes its output as Parquet shards under `<root>/<stage>/<name>.parquet`. A shard is committed in
two steps: the data is written atomically (a local temp file renamed into place; on S3 a single object upload,
which only becomes visible when complete), then a small commit record `<root>/_manifest/<stage>/<name>.json`
(rows, bytes, sha256) is written. Only shards with a commit record exist for readers, so a shard cut short by a
crash, or half-written by a store without atomic publish, is never read. Resume is therefore just "skip the
names in `shard_names(stage)`": a crash loses at most the shards in flight.

Files are reached through `longeval.store.location` (URI parsing, the S3 endpoint and credentials, listing, retries of
transient S3 errors for up to `patience_s` seconds); `probe()` checks a store once, quickly, so a mistyped
endpoint fails at once instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import posixpath
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from longeval.errors import DamagedShardError, StoreError
from longeval.heap import release_freed_memory
from longeval.store.location import CopyKind, Location
from longeval.store.shards import PART_PREFIX

__all__ = ["LEGACY_STAGES", "CopiedShard", "Elsewhere", "RunRoot", "StoredShard"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_PARQUET = ".parquet"
_MANIFEST = "_manifest"
LEGACY_STAGES = ("instances", "predictions", "scores", "summary")
"""The stages a run root written before commit records may hold (`RunRoot.adopt_legacy`)."""


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

BULKY_COLUMNS = frozenset({"prompt", "prompt_token_ids", "output"})
"""Columns whose reads are never kept in memory by a root that remembers listings (`read_stage`): the driver's
memory must not grow with prompt and output bytes. (`meta` and `references` are kept: the driver's checks and
reports read them with the other metadata, and they are small next to prompts.)"""

PROMPT_GROUP_BYTES = 32 << 20
"""Decoded row groups of prompts a replica keeps (`stages.infer.PromptReader`), at least. A replica takes a cell's
prompts shard by shard (the schedule's order, the queue's shard affinity), so this holds the shard it is on, up to
25 prompts of 256K tokens, whatever the suite's size; a 1M prompt is a row group of its own and is read once."""

PROMPT_CONTEXTS_AHEAD = 4
"""Contexts of a pool's largest a replica's row-group budget holds when `PROMPT_GROUP_BYTES` holds fewer
(`prompt_group_bytes`)."""


def prompt_group_bytes(context_tokens: int) -> int:
    """A replica's budget of decoded row groups for a pool whose largest context (the prompts that share one: a
    SYNC context's three tasks) holds `context_tokens` prompt tokens. A SYNC context at 1M is three 4 MiB row
    groups in three shards, and a read-ahead on S3 reads each shard's next ones (`stages.infer.PromptReader._run`):
    `PROMPT_GROUP_BYTES` left room for runs of two, `PROMPT_CONTEXTS_AHEAD` contexts give runs of four."""
    return max(PROMPT_GROUP_BYTES, PROMPT_CONTEXTS_AHEAD * 4 * context_tokens)  # int32 token ids in Arrow

PROMPT_RUN = pa.CacheOptions.from_network_metrics(time_to_first_byte_millis=50, transfer_bandwidth_mib_per_sec=100)
"""How a replica reads a run of a shard's row groups in one request (`read_row_groups`): ranges up to 5 MiB apart
are joined (Arrow's sizing for a store that takes 50 ms to a first byte and sends 100 MiB/s: a request costs
about what 5 MiB of transfer does). The other columns between two prompts' token ids, mostly the prompt's text,
come along and are dropped undecoded; on S3 that is cheaper than a request per prompt."""

WHOLE_READ_BYTES = 256 << 10
"""A shard this small, its size listed, is read whole by `open_shard` (a replica wants its prompts: most of its
bytes), in one request instead of a 64 KiB footer read and then its pages. A replica keeps at most 12 shards
open (`dispatch.OPEN_SHARDS`), so at most 3 MiB of such bytes."""

ROW_GROUP_BYTES = 4 << 20
"""About this many bytes of a table per Parquet row group: a reader that wants a few rows of a shard of long
prompts (an engine replica) reads their row groups, not the shard (and the metadata columns, in every row group,
from the footer's copy, `FOOTER_METADATA`)."""


_OWN_ORDER = b"longeval:columns"
"""Schema metadata of a shard whose bulky columns were written last (`bulky_last`): the table's own order."""

FOOTER_METADATA = b"longeval:metadata"
"""Key-value metadata of a shard of more than one row group with bulky columns (long prompts): its metadata columns
(every other column, all rows, in the file's order) as a zstd-compressed Arrow IPC stream, base64-encoded (Parquet's
key-value metadata is text: Arrow keeps its own schema there the same way). In the file those columns
lie in every row group, between prompts, and S3 serves one range per request: a metadata read cost a GET per row
group (the full shape on SeaweedFS: 12.9 requests per file in `infer`, up to 6.8 in the metadata stages); from the
copy it costs the footer read alone (one GET, two when the footer passes 64 KiB). A shard of one row group is one
range already, and one without bulky columns would hold itself twice: neither has a copy."""

_FOOTER_METADATA_SHA256 = b"longeval:metadata.sha256"
"""The hex sha256 of `FOOTER_METADATA`'s bytes: a damaged copy is set aside, never answered from."""


def bulky_last(table: pa.Table) -> pa.Table:
    """`table` as a shard's file holds it: its bulky columns (prompts, token ids, outputs) last, so the metadata
    columns lie side by side and a read of any of them is one range of the file, not two around the prompts.
    Its own order goes in the schema's metadata, for readers without a schema (`own_order`)."""
    names = table.column_names
    order = [c for c in names if c not in BULKY_COLUMNS] + [c for c in names if c in BULKY_COLUMNS]
    if order == names:
        return table
    return table.select(order).replace_schema_metadata(
        {**(table.schema.metadata or {}), _OWN_ORDER: json.dumps(names).encode("utf-8")})


def own_order(table: pa.Table) -> pa.Table:
    """A whole shard read without a schema, in the columns' order of the table that was written (`bulky_last`)."""
    metadata = dict(table.schema.metadata or {})
    names = metadata.pop(_OWN_ORDER, None)
    if names is None:
        return table
    return table.select(json.loads(names)).replace_schema_metadata(metadata or None)


def footer_metadata(table: pa.Table) -> dict[bytes, bytes]:
    """The key-value metadata that copies `table`'s metadata columns into its shard's footer (`FOOTER_METADATA`)."""
    columns = table.select([c for c in table.column_names if c not in BULKY_COLUMNS])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, columns.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as stream:
        stream.write_table(columns)
    data = sink.getvalue().to_pybytes()
    digest = hashlib.sha256(data).hexdigest().encode("ascii")
    return {FOOTER_METADATA: base64.b64encode(data), _FOOTER_METADATA_SHA256: digest}


def _footer_copy(metadata: pq.FileMetaData) -> pa.Table | None:
    """A shard's metadata columns as its footer copies them (`FOOTER_METADATA`), checked against their sha256;
    None when it has no copy (one row group, or written before the copy existed: its columns are read instead)."""
    pairs = metadata.metadata or {}
    text = pairs.get(FOOTER_METADATA)
    if text is None:
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise _Unreadable(f"its footer's copy of the metadata columns is not base64 ({exc})") from exc
    if hashlib.sha256(data).hexdigest().encode("ascii") != pairs.get(_FOOTER_METADATA_SHA256):
        raise _Unreadable("its footer's copy of the metadata columns does not match its sha256")
    try:
        copy = pa.ipc.open_stream(data).read_all()
    except pa.ArrowInvalid as exc:
        raise _Unreadable(f"its footer's copy of the metadata columns is not readable ({exc})") from exc
    if copy.num_rows != metadata.num_rows:
        raise _Unreadable(f"its footer's copy of the metadata columns has {copy.num_rows} rows, "
                          f"the file {metadata.num_rows}")
    return copy


def _from_copy(copy: pa.Table | None, columns: list[str], schema: pa.Schema) -> pa.Table | None:
    """`columns` from a shard's footer copy, as a read of the file's columns gives them (`schema`: the caller's, or
    the file's own, whose names of list items Parquet changes); None when the copy lacks one of them or holds
    another type (the file's read then converts them, or says why not)."""
    if copy is None or not set(columns) <= set(copy.column_names):
        return None
    table, target = copy.select(columns), pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
    return table.cast(target) if table.schema.equals(target) else None


def rows_per_group(table: pa.Table) -> int:
    """Rows per row group for `table`: about ROW_GROUP_BYTES each, at least one row."""
    if table.num_rows == 0:
        return 1
    return max(1, min(table.num_rows, ROW_GROUP_BYTES * table.num_rows // max(1, table.nbytes)))


class _Unreadable(Exception):
    """A shard's bytes are there but are not its Parquet (kept apart from OSError, which the store retries)."""


_DAMAGED_PAGE = {
    "page integrity": "a page's checksum does not match its bytes",
    "deserialize thrift": "a page header is not readable",
    "invalid page header": "a page header is not readable",
    "page was smaller": "a page is shorter than its header says",
    "corrupt data page": "a page is shorter than its header says",
    "decompression failed": "a page does not decompress",
    "unknown encoding": "a page's encoding is not readable",
}
"""What Arrow's Parquet reader says of damaged page bytes (found by flipping bytes of a shard's pages; its CRC
check catches a damaged value, the others a damaged header), and what the set-aside message says instead."""


def _damaged_page(exc: OSError) -> _Unreadable | None:
    """The damage a read error reports in the bytes it read; None for the store's own errors (which are retried
    when transient, then a StoreError)."""
    text = str(exc).lower()
    for marker, why in _DAMAGED_PAGE.items():
        if marker in text:
            return _Unreadable(f"{why} ({str(exc).splitlines()[0]})")
    return None


@dataclass(frozen=True)
class CopiedShard:
    """What `RunRoot.copy_shard` published: the shard's rows and bytes (from its commit record), and how the data
    file got there (`longeval.store.location.CopyKind`: "link", "copy", "server-side copy" or "stream")."""

    rows: int
    bytes: int
    how: CopyKind


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


class RunRoot:
    """The folder (or S3 prefix) that holds everything one evaluation run writes.

    `uri` and the retry settings are those of `longeval.store.location.Location`, which every file access goes through.

    `remember_listings`: list each stage folder once and keep the names, updated by this object's own writes and
    deletes (on S3 a listing is a request per 1,000 keys, and a driver asks for a stage's shards a dozen times
    in one command). Only for a process that is the stage's one writer, or whose readers want one snapshot:
    while other processes write a stage (generation actors, engine replicas), the caller says so with
    `written_elsewhere(stage)`, and that stage is listed afresh on every call until the block ends.
    """

    def __init__(
        self, uri: str, *, attempts: int = 3, connect_timeout: float = 5.0, patience_s: float | None = None,
        remember_listings: bool = False,
    ) -> None:
        # A Location pickles without its filesystem, so a RunRoot shipped to a Ray worker rebuilds it there.
        self._loc = Location(uri, attempts=attempts, connect_timeout=connect_timeout, patience_s=patience_s)
        self._listed: dict[str, dict[str, int | None]] | None = {} if remember_listings else None
        """The files in each listed folder (`rel` -> base name -> bytes, None when unknown: written here since),
        when listings are remembered; the sizes spare a HEAD request per read on S3."""
        self._records: dict[str, dict[str, Any]] = {}
        """Commit records read while their folder's listing was remembered (record path -> record)."""
        self._elsewhere: Counter[str] = Counter()
        """Folders other processes are writing now: never remembered."""
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
        self._small: dict[str, bytes | None] = {}
        """Small files read through `read_if_exists` while listings are remembered (rel -> bytes, None: none)."""
        self._wanted: dict[str, list[str]] = {}
        """Metadata columns a command said it will read, per stage (`will_read`)."""

    def __getstate__(self) -> dict[str, Any]:
        # Another process sees other writes: it starts with no remembered listings.
        return {**self.__dict__, "_listed": None, "_elsewhere": Counter(), "_kept": {}, "_records": {},
                "_footers": {}, "_copies": {}, "_footer_bytes": 0, "_footer_keys": set(), "_small": {}}

    # -- identity ---------------------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The normalised run root: an absolute path, `file:///...` or `s3://bucket/prefix`."""
        return self._loc.uri

    def path(self, *parts: str) -> str:
        """Where `parts` live under the root, as a URI-ish string for messages and logs."""
        return self._loc.path(self._rel(*parts) if parts else "")

    def local_path(self) -> Path | None:
        """The root as a local `Path`, or None when it is remote."""
        return Path(self._loc.base) if self._loc.kind == "local" else None

    def __repr__(self) -> str:
        return f"RunRoot({self.uri!r})"

    # -- shards -----------------------------------------------------------------------------------------

    def write_table(self, stage: str, name: str, table: pa.Table) -> None:
        """Write one shard and commit it: readers see the whole shard or none of it."""
        # Serialise first, so a failure while encoding never reaches the store; the write is then one atomic
        # file rename or object upload, and the commit record after it publishes the shard.
        # A shard of several row groups with prompts copies its metadata columns into its footer
        # (`FOOTER_METADATA`); one of a single row group is written as it always was.
        sink, written, group_rows = pa.BufferOutputStream(), bulky_last(table), rows_per_group(table)
        with pq.ParquetWriter(sink, written.schema, compression="zstd", write_page_checksum=True) as writer:
            writer.write_table(written, row_group_size=group_rows)
            if table.num_rows > group_rows and BULKY_COLUMNS & set(table.column_names):
                writer.add_key_value_metadata(footer_metadata(written))
        data = sink.getvalue()
        self._loc.write_bytes(self._rel(stage, name + _PARQUET), data)
        self._wrote(self._rel(stage, name + _PARQUET), size=data.size)
        record = {"rows": table.num_rows, "bytes": data.size, "sha256": hashlib.sha256(data).hexdigest()}
        self.write_bytes(self._commit_name(stage, name), json.dumps(record, sort_keys=True).encode("utf-8"))
        if self._remembered(self._rel(_MANIFEST, stage)):
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

    def shard_sizes(self, stage: str) -> dict[str, int | None]:
        """The finished shards of a stage and their bytes as listed (None when not known), for readers in other
        processes: `read_shard(size=...)` and `open_shard(size=...)` then skip a request each."""
        return {name: self._size(stage, name) for name in self.shard_names(stage)}

    def _size(self, stage: str, name: str) -> int | None:
        folder = self._rel(stage)
        return self._listed[folder].get(name + _PARQUET) if self._remembered(folder) else None

    def verify(self, stage: str) -> list[str]:
        """Finished shards of a stage whose bytes do not match their commit record (empty when all do)."""
        bad = []
        for name in sorted(self.shard_names(stage)):
            record = self.commit_record(stage, name)
            data = self.read_bytes(f"{stage}/{name}{_PARQUET}")
            if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
                bad.append(name)
        return bad

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
        remembered = self._remembered(self._rel(stage)) and self._remembered(self._rel(_MANIFEST, stage))
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
        data = self.read_bytes(f"{stage}/{name}{_PARQUET}")
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
        rel = self._rel(stage, name + _PARQUET)
        size = size if size is not None else self._size(stage, name)
        remember = self._remembered(self._rel(stage))  # one snapshot of the stage: its footers stay true

        def read(size: int | None) -> pa.Table:
            key = (stage, name)
            if key in self._copies:
                copy, file_schema = self._copies[key]
                table = _from_copy(copy, columns, schema or file_schema)
                if table is not None:
                    return table
            try:
                # A kept fragment holds the footer its first read fetched (taken out while in use: a failed read's
                # retry opens the file afresh, without a size that may be stale)
                fragment = self._footers.pop(key, None) or self._loc.parquet(rel, size=size)
                if schema is None:
                    self.check_columns(stage, name, fragment, columns)
                copy = _footer_copy(fragment.metadata)
                table = _from_copy(copy, columns, schema or fragment.physical_schema)
                if table is None:
                    table = fragment.to_table(schema=schema, columns=columns)
                if remember and copy is not None:
                    if self._footer_room(key, copy.nbytes):
                        self._copies[key] = (copy, fragment.physical_schema)
                elif remember and self._footer_room(key, fragment.metadata.serialized_size):
                    self._footers[key] = fragment
                return table
            except pa.ArrowInvalid as exc:
                raise _Unreadable(f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc
            except OSError as exc:
                damaged = _damaged_page(exc)
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
        what = f"read {self.path(stage, name + _PARQUET)}"
        try:
            return self._loc.call(what, read, size)
        except _Unreadable as exc:
            if size is None:
                raise self._set_aside(stage, name, str(exc)) from exc
        try:
            return self._loc.call(what, read, None)
        except _Unreadable as exc:
            raise self._set_aside(stage, name, str(exc)) from exc

    def open_shard(self, stage: str, name: str, *, size: int | None = None) -> pads.ParquetFileFragment:
        """A finished shard opened for reading parts of it: its footer is read now and kept, then each
        `fragment.subset(row_group_ids=[g]).to_table(columns=...)` reads only those ranges, pages checked
        against their checksums. `size`: its bytes as listed (`shard_sizes`), sparing a request on S3; a shard of
        at most `WHOLE_READ_BYTES` is then read whole, now, in one request."""
        rel = self._rel(stage, name + _PARQUET)

        def open_(size: int | None) -> pads.ParquetFileFragment:
            fragment = self._loc.parquet(rel, size=size, whole_below=WHOLE_READ_BYTES)
            try:
                fragment.ensure_complete_metadata()
            except pa.ArrowInvalid as exc:
                raise _Unreadable(f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc
            except OSError as exc:
                damaged = _damaged_page(exc)
                if damaged is None:
                    raise  # not `raise exc from exc`: an error its own cause loops the drivers' cause walks
                raise damaged from exc
            return fragment

        return self._sized(stage, name, open_, size if size is not None else self._size(stage, name))

    @property
    def remote(self) -> bool:
        """Whether the root is on S3, where a request costs what megabytes of transfer do."""
        return self._loc.kind == "s3"

    def read_row_groups(self, stage: str, name: str, fragment: pads.ParquetFileFragment, groups: list[int],
                        columns: list[str]) -> list[pa.Table]:
        """`columns` of some row groups of a shard opened with `open_shard`, a table per group: only their ranges
        are read, joined across what lies between them as `PROMPT_RUN` allows (consecutive groups: one request),
        through the store's retries, pages checked against their checksums.

        Raises:
            DamagedShardError: a page it read is damaged; the shard was set aside here.
        """
        self.check_columns(stage, name, fragment, columns)
        options = pads.ParquetFragmentScanOptions(pre_buffer=True, page_checksum_verification=True,
                                                  cache_options=PROMPT_RUN)

        def read() -> pa.Table:
            try:
                return fragment.subset(row_group_ids=groups).to_table(columns=columns, fragment_scan_options=options)
            except OSError as exc:
                damaged = _damaged_page(exc)
                if damaged is None:
                    raise  # not `raise exc from exc`: an error its own cause loops the drivers' cause walks
                raise damaged from exc

        try:
            table = self._loc.call(f"read {self.path(stage, name + _PARQUET)}", read)
        except _Unreadable as exc:
            raise self._set_aside(stage, name, str(exc)) from exc
        out, at = [], 0
        for g in groups:
            rows = fragment.metadata.row_group(g).num_rows
            out.append(table.slice(at, rows).combine_chunks())
            at += rows
        return out

    def check_columns(self, stage: str, name: str, fragment: pads.ParquetFileFragment, columns: list[str]) -> None:
        """A column the shard does not have is the reader's mismatch, not damage: Arrow says ArrowInvalid for both,
        and a shard set aside for it would be written again, every shard of an older run's stage in turn."""
        missing = [c for c in columns if fragment.physical_schema.get_field_index(c) < 0]
        if missing:
            raise StoreError(
                f"{self.path(stage, name + _PARQUET)} has no column {', '.join(missing)}: it was written by a "
                f"longeval whose {stage} lack it. The shard is left as it is; read it with the version that wrote "
                "it, or run again into a fresh run root")

    def footer_columns(self, stage: str, name: str, fragment: pads.ParquetFileFragment) -> pa.Table | None:
        """The metadata columns an opened shard (`open_shard`) copies in its footer (`FOOTER_METADATA`), None when
        it has no copy: a replica finds its prompts' ids and lengths there without a read per row group.

        Raises:
            DamagedShardError: the copy does not match its sha256; the shard was set aside here.
        """
        try:
            return _footer_copy(fragment.metadata)
        except _Unreadable as exc:
            raise self._set_aside(stage, name, str(exc)) from exc

    def _set_aside(self, stage: str, name: str, why: str) -> DamagedShardError:
        """Move a damaged shard out of its stage and drop its commit record: readers no longer see it and a
        rerun writes it again."""
        source = f"{stage}/{name}{_PARQUET}"
        target = f"_damaged/{stage}/{name}.{uuid.uuid4().hex[:8]}{_PARQUET}"
        self.write_bytes(target, self.read_bytes(source))
        self._loc.delete(self._commit_name(stage, name))
        self._loc.delete(self._rel(source))
        self._removed(self._commit_name(stage, name), self._rel(source))
        return DamagedShardError(
            f"damaged shard {self.path(source)}: {why}. It was set aside as {self.path(target)} and will be "
            "written again")

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
        source = f"{stage}/{name}{_PARQUET}"
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
        how = self._loc.copy(self._rel(source), to._loc, to._rel(stage, to_name + _PARQUET))
        self._loc.copy(self._commit_name(stage, name), to._loc, to._commit_name(stage, to_name))
        to._wrote(to._rel(stage, to_name + _PARQUET), size=size)  # known: the sizes a scorer is handed stay ints
        to._wrote(to._commit_name(stage, to_name))
        return CopiedShard(rows=rows, bytes=size, how=how)

    def stored_shards(self, stage: str) -> list[StoredShard]:
        """Every shard of a stage with a data file or a commit record, finished or not, sorted by name."""
        data = {info.base_name[: -len(_PARQUET)]: info for info in self._loc.listing(self._rel(stage))
                if info.base_name.endswith(_PARQUET) and not info.base_name.startswith(".")}
        records = {info.base_name.removesuffix(".json"): info
                   for info in self._loc.listing(self._rel(_MANIFEST, stage)) if info.base_name.endswith(".json")}
        return [StoredShard(name, data.get(name), records.get(name)) for name in sorted(data.keys() | records.keys())]

    def remove_shard(self, stage: str, name: str) -> None:
        """Delete a shard: its commit record first, then its data, so a crash in between leaves an uncommitted
        file (never read, replaced by the next write), never a committed shard without data. Files already gone
        are fine (another process removed them)."""
        self._loc.delete(self._commit_name(stage, name), missing_ok=True)
        self._loc.delete(self._rel(stage, name + _PARQUET), missing_ok=True)
        self._removed(self._commit_name(stage, name), self._rel(stage, name + _PARQUET))

    def touch(self, stage: str, name: str) -> None:
        """Mark a finished shard as just used (its commit record's modification time), for least recently used
        pruning."""
        self._loc.touch(self._commit_name(stage, name))

    def write_part(self, stage: str, table: pa.Table, *, key: str = "instance_id") -> str:
        """Write a table of rows as a part named by the hash of its keys (the same rows, the same name)."""
        ids = "\n".join(sorted(str(v) for v in table[key].to_pylist()))
        name = PART_PREFIX + hashlib.sha256(ids.encode("utf-8")).hexdigest()[:16]
        self.write_table(stage, name, table)
        return name

    def stage_files(self, stage: str) -> tuple[pafs.FileSystem, list[str]]:
        """The filesystem and full paths of a stage's finished shards, for `ray.data.read_parquet`."""
        return self._loc.fs, [self._loc.full(self._rel(stage, n + _PARQUET)) for n in sorted(self.shard_names(stage))]

    def shard_names(self, stage: str) -> set[str]:
        """Names of the finished shards of a stage (without `.parquet`): written and committed, what a rerun
        may skip."""
        written = {
            base[: -len(_PARQUET)]
            for base in self._files(self._rel(stage))
            if base.endswith(_PARQUET) and not base.startswith(".")
        }
        committed = {base.removesuffix(".json") for base in self._files(self._rel(_MANIFEST, stage))}
        return written & committed

    def has(self, stage: str, name: str) -> bool:
        """Whether the shard `name` of `stage` is finished (written and committed): from the stage's listing on a
        root that remembers listings (listed now if need be: the reads that follow use it), else two HEADs."""
        folders = (self._rel(stage), self._rel(_MANIFEST, stage))
        if self._listed is not None and all(self._elsewhere[folder] <= 0 for folder in folders):
            return name in self.shard_names(stage)
        return self.exists(self._commit_name(stage, name)) and self.exists(f"{self._rel(stage)}/{name}{_PARQUET}")

    @contextmanager
    def written_elsewhere(self, stage: str) -> Iterator[Elsewhere]:
        """While this block runs, other processes write `stage`: its listings are not remembered (and those
        remembered before are dropped, at the start and at the end).

        When the writers say what they committed (the block's `Elsewhere`, `complete`), the listings remembered
        before the block are kept with those shards added, instead of listing the stage again after it (the infer
        stage's replicas report their parts: its merge at the end then lists nothing)."""
        folders = (self._rel(stage), self._rel(_MANIFEST, stage))
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
            data.update({name + _PARQUET: None for name in others.written if name + _PARQUET not in data})
            records.update({name + ".json": None for name in others.written})
            self._listed.update({folders[0]: data, folders[1]: records})

    def forget_listings(self) -> None:
        """Drop every remembered listing and kept table: another process changed the root in a way this one
        was not told of (a damaged shard set aside by a replica or a generation actor)."""
        if self._listed is not None:
            self._listed.clear()
        self._kept.clear()
        self._footers.clear()
        self._copies.clear()
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

    def _drop_kept(self, folder: str, base: str | None = None) -> None:
        """Forget the columns and footer kept of the shard whose data or commit record is `base` in `folder` (of
        every shard of the stage there when `base` is None)."""
        stage = folder.removeprefix(_MANIFEST + "/")
        name = None if base is None else base.removesuffix(_PARQUET).removesuffix(".json")
        for kept in (self._kept, self._footers, self._copies):
            for key in [k for k in kept if self._rel(k[0]) == stage and name in (None, k[1])]:
                del kept[key]

    def adopt_legacy(self, stages: tuple[str, ...] = LEGACY_STAGES) -> int:
        """Commit the shards of a run root written before commit records existed; returns how many.

        Only a root with no `_manifest/` at all is adopted: its writers published each shard atomically, so a
        whole Parquet file is a finished shard. A file whose Parquet footer does not read is left uncommitted
        (it is generated or predicted again). A root that has commit records is never touched: there, a shard
        without one was cut short.
        """
        if any(self._files(self._rel(_MANIFEST, stage)) for stage in LEGACY_STAGES):
            return 0  # (every stage that commits is one of these: no recursive listing of every record)
        adopted = 0
        for stage in stages:
            for base in sorted(self._files(self._rel(stage))):
                if not base.endswith(_PARQUET) or base.startswith("."):
                    continue
                data = self.read_bytes(f"{stage}/{base}")
                try:
                    rows = pq.read_metadata(pa.BufferReader(data)).num_rows
                except (pa.ArrowInvalid, OSError):
                    log.warning("not adopting %s: not a readable Parquet file", self.path(stage, base))
                    continue
                record = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                          "adopted": True}
                self.write_bytes(self._commit_name(stage, base[: -len(_PARQUET)]),
                                 json.dumps(record, sort_keys=True).encode("utf-8"))
                adopted += 1
        return adopted

    def probe(self) -> None:
        """Reach the store once, without the long patience: a wrong endpoint, bucket or key fails now, with
        what to fix, instead of after minutes of retries."""
        patience, self._loc.patience_s = self._loc.patience_s, 0.0
        try:
            self._loc.files(self._rel(_MANIFEST))
        finally:
            self._loc.patience_s = patience

    # -- small files ------------------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> None:
        """Write `obj` as indented, key-sorted JSON at `<root>/<name>`, atomically."""
        self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    def read_json(self, name: str) -> Any:
        return self._parse_json(name, self.read_text(name))

    def json_if_exists(self, name: str) -> Any:
        """`read_json`, or None when there is no file: one request (none again on a root that remembers
        listings, `read_if_exists`)."""
        raw = self.read_if_exists(name)
        return None if raw is None else self._parse_json(name, raw.decode("utf-8"))

    def _parse_json(self, name: str, text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise StoreError(
                f"{self.path(name)} is not valid JSON ({exc}); delete it or use a new run root"
            ) from exc

    def write_text(self, name: str, text: str) -> None:
        """Write UTF-8 text at `<root>/<name>`, atomically."""
        self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write bytes at `<root>/<name>`, atomically."""
        self._loc.write_bytes(self._rel(name), data)
        self._wrote(self._rel(name))

    def create_bytes(self, name: str, data: bytes) -> bool:
        """Write bytes at `<root>/<name>` only if nothing is there; True when this call created the file
        (`Location.create`: the store's atomic first-writer-wins, for the run root's lease)."""
        created = self._loc.create(self._rel(name), data)
        if created:
            self._wrote(self._rel(name))
        return created

    def files(self, folder: str) -> list[str]:
        """Base names of the files directly inside `<root>/<folder>` (none when it does not exist), listed afresh
        whatever `remember_listings` says: for folders other processes write (the lease's claims)."""
        return self._loc.files(self._rel(folder))

    def delete(self, name: str) -> None:
        """Delete the file at `<root>/<name>`; a file already gone is fine."""
        self._loc.delete(self._rel(name), missing_ok=True)
        self._removed(self._rel(name))

    def read_if_exists(self, name: str) -> bytes | None:
        """The bytes at `<root>/<name>`, None when there is no file: one request where `exists` and `read_bytes`
        take two. A root that remembers listings reads each such file once (a command's one snapshot of the root:
        a report asks for config.yaml in every check), until it writes or deletes it itself."""
        rel = self._rel(name)
        if self._listed is not None and rel in self._small:
            return self._small[rel]
        data = self._loc.read_if_exists(rel)
        if self._listed is not None:
            self._small[rel] = data
        return data

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def read_bytes(self, name: str) -> bytes:
        """The bytes at `<root>/<name>` (S3 through the same endpoint, credentials and retries as the run)."""
        return self._loc.read_bytes(self._rel(name))

    def exists(self, name: str) -> bool:
        """Whether a file (not a folder) exists at `<root>/<name>`."""
        return self._loc.exists(self._rel(name))

    # -- internals --------------------------------------------------------------------------------------

    def _rel(self, *parts: str) -> str:
        """Join path parts under the root, refusing anything that would escape it."""
        return self._loc.join(*parts)

    def _commit_name(self, stage: str, name: str) -> str:
        return f"{_MANIFEST}/{self._rel(stage)}/{name}.json"
