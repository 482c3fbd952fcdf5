"""How a shard's Parquet file is laid out, and how its damage shows: the format every writer and reader of a run
root shares.

A shard is written with its bulky columns (prompts, token ids, outputs) last, in row groups of about
`ROW_GROUP_BYTES`, zstd-compressed with page checksums; one of several row groups with bulky columns copies its
metadata columns into its footer (`FOOTER_METADATA`). Its commit record lies at `<MANIFEST>/<stage>/<name>.json`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "BULKY_COLUMNS",
    "FOOTER_METADATA",
    "MANIFEST",
    "PARQUET",
    "ROW_GROUP_BYTES",
    "Unreadable",
    "bulky_last",
    "damaged_page",
    "encode_shard",
    "footer_copy",
    "footer_metadata",
    "from_copy",
    "own_order",
    "rows_per_group",
]

PARQUET = ".parquet"
"""A shard's data file is `<stage>/<name>.parquet`."""

MANIFEST = "_manifest"
"""The folder of the commit records: `_manifest/<stage>/<name>.json`."""


BULKY_COLUMNS = frozenset({"prompt", "prompt_token_ids", "output"})
"""Columns whose reads are never kept in memory by a root that remembers listings (`read_stage`): the driver's
memory must not grow with prompt and output bytes. (`meta` and `references` are kept: the driver's checks and
reports read them with the other metadata, and they are small next to prompts.)"""

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


def footer_copy(metadata: pq.FileMetaData) -> pa.Table | None:
    """A shard's metadata columns as its footer copies them (`FOOTER_METADATA`), checked against their sha256;
    None when it has no copy (one row group, or written before the copy existed: its columns are read instead)."""
    pairs = metadata.metadata or {}
    text = pairs.get(FOOTER_METADATA)
    if text is None:
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise Unreadable(f"its footer's copy of the metadata columns is not base64 ({exc})") from exc
    if hashlib.sha256(data).hexdigest().encode("ascii") != pairs.get(_FOOTER_METADATA_SHA256):
        raise Unreadable("its footer's copy of the metadata columns does not match its sha256")
    try:
        copy = pa.ipc.open_stream(data).read_all()
    except pa.ArrowInvalid as exc:
        raise Unreadable(f"its footer's copy of the metadata columns is not readable ({exc})") from exc
    if copy.num_rows != metadata.num_rows:
        raise Unreadable(f"its footer's copy of the metadata columns has {copy.num_rows} rows, "
                         f"the file {metadata.num_rows}")
    return copy


def from_copy(copy: pa.Table | None, columns: list[str], schema: pa.Schema) -> pa.Table | None:
    """`columns` from a shard's footer copy, as a read of the file's columns gives them (`schema`: the caller's, or
    the file's own, whose names of list items Parquet changes); None when the copy lacks one of them or holds
    another type (the file's read then converts them, or says why not)."""
    if copy is None or not set(columns) <= set(copy.column_names):
        return None
    table, target = copy.select(columns), pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
    return table.cast(target) if table.schema.equals(target) else None


def encode_shard(table: pa.Table) -> pa.Buffer:
    """`table` as its shard's bytes: bulky columns last (`bulky_last`), row groups of about `ROW_GROUP_BYTES`,
    zstd, page checksums. A shard of several row groups with prompts copies its metadata columns into its footer
    (`FOOTER_METADATA`); one of a single row group is written as it always was."""
    sink, written, group_rows = pa.BufferOutputStream(), bulky_last(table), rows_per_group(table)
    with pq.ParquetWriter(sink, written.schema, compression="zstd", write_page_checksum=True) as writer:
        writer.write_table(written, row_group_size=group_rows)
        if table.num_rows > group_rows and BULKY_COLUMNS & set(table.column_names):
            writer.add_key_value_metadata(footer_metadata(written))
    return sink.getvalue()


def rows_per_group(table: pa.Table) -> int:
    """Rows per row group for `table`: about ROW_GROUP_BYTES each, at least one row."""
    if table.num_rows == 0:
        return 1
    return max(1, min(table.num_rows, ROW_GROUP_BYTES * table.num_rows // max(1, table.nbytes)))


class Unreadable(Exception):
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


def damaged_page(exc: OSError) -> Unreadable | None:
    """The damage a read error reports in the bytes it read; None for the store's own errors (which are retried
    when transient, then a StoreError)."""
    text = str(exc).lower()
    for marker, why in _DAMAGED_PAGE.items():
        if marker in text:
            return Unreadable(f"{why} ({str(exc).splitlines()[0]})")
    return None

