"""A replica's reads of parts of a shard: opened once (its footer read and kept), then runs of its row groups, a few
columns at a time, each run in as few requests as S3 makes worthwhile.

A replica wants a cell's prompts, a row group each (`ROW_GROUP_BYTES`), not whole shards of them; it finds their ids
and lengths in the footer's copy of the metadata columns (`footer_columns`) without a read per row group.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as pads

from longeval.errors import StoreError
from longeval.store.shard_format import PARQUET, Unreadable, damaged_page, footer_copy

__all__ = [
    "PROMPT_CONTEXTS_AHEAD",
    "PROMPT_GROUP_BYTES",
    "PROMPT_RUN",
    "WHOLE_READ_BYTES",
    "RowGroupReads",
    "prompt_group_bytes",
]

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


class RowGroupReads:
    """`RunRoot`'s reads of parts of a shard, for engine replicas: `open_shard`, then `read_row_groups` and
    `footer_columns`; `check_columns` tells a reader's mismatch from damage.

    A part of `RunRoot`, not used alone: it stands on the root's `_loc`, `_rel` and `path`, `_size` of its listings,
    and `_sized` and `_set_aside` for a damaged shard.
    """

    def open_shard(self, stage: str, name: str, *, size: int | None = None) -> pads.ParquetFileFragment:
        """A finished shard opened for reading parts of it: its footer is read now and kept, then each
        `fragment.subset(row_group_ids=[g]).to_table(columns=...)` reads only those ranges, pages checked
        against their checksums. `size`: its bytes as listed (`shard_sizes`), sparing a request on S3; a shard of
        at most `WHOLE_READ_BYTES` is then read whole, now, in one request."""
        rel = self._rel(stage, name + PARQUET)

        def open_(size: int | None) -> pads.ParquetFileFragment:
            fragment = self._loc.parquet(rel, size=size, whole_below=WHOLE_READ_BYTES)
            try:
                fragment.ensure_complete_metadata()
            except pa.ArrowInvalid as exc:
                raise Unreadable(f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc
            except OSError as exc:
                damaged = damaged_page(exc)
                if damaged is None:
                    raise  # not `raise exc from exc`: an error its own cause loops the drivers' cause walks
                raise damaged from exc
            return fragment

        return self._sized(stage, name, open_, size if size is not None else self._size(stage, name))

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
                damaged = damaged_page(exc)
                if damaged is None:
                    raise  # not `raise exc from exc`: an error its own cause loops the drivers' cause walks
                raise damaged from exc

        try:
            table = self._loc.call(f"read {self.path(stage, name + PARQUET)}", read)
        except Unreadable as exc:
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
                f"{self.path(stage, name + PARQUET)} has no column {', '.join(missing)}: it was written by a "
                f"longeval whose {stage} lack it. The shard is left as it is; read it with the version that wrote "
                "it, or run again into a fresh run root")

    def footer_columns(self, stage: str, name: str, fragment: pads.ParquetFileFragment) -> pa.Table | None:
        """The metadata columns an opened shard (`open_shard`) copies in its footer (`FOOTER_METADATA`), None when
        it has no copy: a replica finds its prompts' ids and lengths there without a read per row group.

        Raises:
            DamagedShardError: the copy does not match its sha256; the shard was set aside here.
        """
        try:
            return footer_copy(fragment.metadata)
        except Unreadable as exc:
            raise self._set_aside(stage, name, str(exc)) from exc
