"""The prompt reader: a replica's prompts read from the instance shards as its engine asks for them, a shard's
ids first, then only the row groups that hold them, within a budget of decoded bytes."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from longeval.engines.vllm_engine import Request
from longeval.errors import LongevalError
from longeval.heap import release_freed_memory
from longeval.stages.infer.dispatch import OPEN_SHARDS
from longeval.store.row_group_reads import PROMPT_GROUP_BYTES
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName

__all__ = ["RELEASE_BEFORE_TOKENS", "PromptReader", "ids_bytes"]

RELEASE_BEFORE_TOKENS = 65_536
"""Before a prompt this long becomes a Python list (41 B a token), the memory the last ones freed goes back to the
system (`release_freed_memory`): a replica of a 256K pool otherwise peaked 107 MiB above its base for a window of 4
prompts (43 MiB of lists and 32 MiB of row groups), with it 53 MiB; of a 1M pool, 144 MiB against 79 MiB
(benchmarks/README.md, "The full shape, final"). Shorter prompts skip it: it costs a few ms, their engine steps
less."""


@dataclass
class _OpenShard:
    """An instance shard a `PromptReader` is on: its footer, and the metadata columns the footer copies."""

    file: Any
    """The shard opened for reading row groups (`RunRoot.open_shard`)."""
    metadata: pa.Table | None
    """Its ids, `max_new_tokens` (and `references`) from the footer's copy (`store.FOOTER_METADATA`); None for a
    shard without one (one row group, or written before the copy existed): they are read from its row groups."""


class PromptReader:
    """Reads a replica's prompts and nothing else: of each instance shard, its ids first, then only the row
    groups that hold the prompts asked for (`store.ROW_GROUP_BYTES` each).

    On S3 (one range per request) a shard of long prompts costs its footer read (one or two GETs), which copies its
    ids and prompts' `max_new_tokens` (`store.FOOTER_METADATA`), then one GET per run of row groups (`_run`: the
    prompt's and the next ones not yet read, as far as the free budget allows); a shard without the copy reads
    its ids from every row group. On a local root a prompt's row group is read alone, its token ids only.

    A replica's prompts come shard by shard (`schedule`, and the queue's shard affinity), so it keeps only the
    shards it is on: `open_files` of them (a footer each, a few KB), and of those at most `group_bytes` of decoded
    row groups, Arrow buffers (about 4 bytes a token), whatever the pool's or the suite's size. A row group every
    row of which was asked for is let go at once: no prompt is run twice, so the budget holds only groups the
    other replicas share, and a replica of a short pool does not fill it with shards it is done with (it did: its
    memory grew by the budget from 1x to 10x the samples). A prompt becomes a Python list (about 30 bytes a
    token) only when it is handed to the engine.
    """

    def __init__(self, root: RunRoot, *, shards: Mapping[str, int | None] | Iterable[str] | None = None,
                 open_files: int = OPEN_SHARDS,
                 group_bytes: int = PROMPT_GROUP_BYTES, references: bool = False) -> None:
        self.root, self.open_files_max, self.group_bytes_max = root, open_files, group_bytes
        self.metadata_columns = ["max_new_tokens", *(["references"] if references else [])]
        """What a request takes besides the token ids; `references` only for the stand-in engine, whose canned
        answers are some of them."""
        self.by_prefix: dict[str, list[str]] = {}  # a generated shard's name -> it and its follow-up shards
        # The driver's names when it gave them: a replica then lists nothing (on S3, one listing per command,
        # not one per replica); with their sizes, it opens each without a HEAD request.
        self.sizes: dict[str, int | None] = (root.shard_sizes("instances") if shards is None else
                                             dict(shards) if isinstance(shards, Mapping) else dict.fromkeys(shards))
        for name in sorted(self.sizes):
            self.by_prefix.setdefault(ShardName.parse(name).prefix, []).append(name)
        self.where: dict[str, dict[str, tuple[int, int, int]]] = {}
        """Of each open shard, instance id -> (row group, row in it, row in the file)."""
        self.files: OrderedDict[str, _OpenShard] = OrderedDict()
        self.groups: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self.group_bytes = 0
        self.asked: dict[tuple[str, int], set[int]] = {}
        """Of each kept row group, the rows asked for."""
        self.read: dict[str, set[int]] = {}
        """Of each open shard, the row groups read once: a run never reads one again (one evicted and then asked for
        is read alone). Like `where`, forgotten when the shard is closed: a replica that visits a whole pool's
        shards holds the state of its open ones only."""

    def request(self, instance_id: str, prefix: str, spans: int = 1) -> Request:
        """The prompt's request. `spans`: how many shards its context's prompts lie in (`dispatch.reads`): a
        read-ahead on S3 takes that share of the budget, so each of a SYNC context's shards has room."""
        for name in self.by_prefix.get(prefix, ()):
            found = self._index(name).get(instance_id)
            if found is not None:
                g, row, file_row = found
                group, copied = self._group(name, g, spans), self._file(name).metadata
                metadata, at = (group, row) if copied is None else (copied, file_row)
                values = group["prompt_token_ids"][row].values
                if len(values) >= RELEASE_BEFORE_TOKENS:
                    release_freed_memory()
                ids = values.to_numpy(zero_copy_only=False).tolist()
                refs = tuple(metadata["references"][at].as_py()) if "references" in self.metadata_columns else ()
                asked = Request(instance_id, ids, int(metadata["max_new_tokens"][at].as_py()), refs)
                self._asked(name, g, row, group.num_rows)
                return asked
        raise LongevalError(f"instance {instance_id} is in no committed instance shard {prefix} (or its follow-ups)")

    def _file(self, name: str) -> _OpenShard:
        if name not in self.files:
            file = self.root.open_shard("instances", name, size=self.sizes.get(name))
            self.root.check_columns("instances", name, file, ["prompt_token_ids", *self.metadata_columns])
            copied = self.root.footer_columns("instances", name, file)
            self.files[name] = _OpenShard(
                file, None if copied is None else copied.select(["instance_id", *self.metadata_columns]))
            if len(self.files) > self.open_files_max:
                closed, _ = self.files.popitem(last=False)
                self.where.pop(closed, None)
                self.read.pop(closed, None)
        self.files.move_to_end(name)
        return self.files[name]

    def _index(self, name: str) -> dict[str, tuple[int, int, int]]:
        if name not in self.where:
            shard = self._file(name)
            ids = (shard.file.to_table(columns=["instance_id"]) if shard.metadata is None
                   else shard.metadata)["instance_id"].to_pylist()
            footer = shard.file.metadata
            places = [(g, row) for g in range(footer.num_row_groups) for row in range(footer.row_group(g).num_rows)]
            self.where[name] = {id_: (g, row, at) for at, (id_, (g, row)) in enumerate(zip(ids, places, strict=True))}
        return self.where[name]

    def _group(self, name: str, g: int, spans: int = 1) -> pa.Table:
        key = (name, g)
        if key not in self.groups:
            shard = self._file(name)
            columns = ["prompt_token_ids", *(self.metadata_columns if shard.metadata is None else [])]
            run = self._run(name, shard.file.metadata, g, spans)
            tables = self.root.read_row_groups("instances", name, shard.file, run, columns)
            if self.root.remote:
                release_freed_memory()  # what the S3 client's threads freed stays in their heaps otherwise
            for at, table in zip(reversed(run), reversed(tables), strict=True):  # g last: the latest used
                self.groups[(name, at)] = table
                self.group_bytes += table.nbytes
            self.read.setdefault(name, set()).update(run)
            while len(self.groups) > 1 and (self.group_bytes > self.group_bytes_max
                                            or len({n for n, _ in self.groups}) > self.open_files_max):
                self._drop(next(iter(self.groups)))
        self.groups.move_to_end(key)
        return self.groups[key]

    def _run(self, name: str, footer: Any, g: int, spans: int) -> list[int]:
        """Row group `g` and, on S3, the next ones of its shard this reader has not read, while their token ids
        fit in this shard's share of the budget (an equal share for each of the `spans` shards its context lies
        in, less what the shard keeps) and in the budget the kept groups leave free: one request for them all
        (`RunRoot.read_row_groups`). A shard of long prompts has a row group per prompt and a replica runs a
        shard's prompts in row order (the schedule and the queue's shard affinity), so a request per prompt was
        most of `infer`'s requests on S3. Only free budget: a read-ahead that pushed out groups not yet run would
        have them read again (it did, when runs took half the whole budget: 1.25 x the instance bytes sent at the
        full shape). A share each: the first of a SYNC context's three shards took half the free budget, the
        last one a quarter."""
        run = [g]
        if not self.root.remote:
            return run  # a local read costs its bytes, not a request: read no text between prompts
        share = self.group_bytes_max // max(1, spans) - sum(t.nbytes for (n, _), t in self.groups.items() if n == name)
        room = min(self.group_bytes_max - self.group_bytes, share) - ids_bytes(footer, g)
        read = self.read.get(name, set())
        while g + len(run) < footer.num_row_groups and g + len(run) not in read:
            room -= ids_bytes(footer, g + len(run))
            if room < 0:
                break
            run.append(g + len(run))
        return run

    def _asked(self, name: str, g: int, row: int, rows: int) -> None:
        asked = self.asked.setdefault((name, g), set())
        asked.add(row)
        if len(asked) == rows:
            self._drop((name, g))

    def _drop(self, key: tuple[str, int]) -> None:
        self.group_bytes -= self.groups.pop(key).nbytes
        self.asked.pop(key, None)

    def close(self) -> None:
        self.files.clear()
        self.groups.clear()
        self.asked.clear()
        self.read.clear()
        self.group_bytes = 0


def ids_bytes(footer: Any, group: int) -> int:
    """A row group's token ids as Arrow holds them once read (its `nbytes`, what the budget counts): int32 values,
    their validity bitmap (the Parquet reader makes one), and int64 offsets. Parquet's own sizes are of its
    encodings. (Without the bitmap, a run that filled the budget overshot it by an eighth of a byte a token and
    pushed out its own last group, which was then read again.)"""
    row_group = footer.row_group(group)
    tokens = sum(row_group.column(i).num_values for i in range(row_group.num_columns)
                 if row_group.column(i).path_in_schema.startswith("prompt_token_ids"))
    return 4 * tokens + (tokens + 7) // 8 + 8 * (row_group.num_rows + 1)
