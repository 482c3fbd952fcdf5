"""The infer stage: every instance without a final prediction through its length bucket's engine pool.

A pool's replicas are Ray actors, each in a placement group of its own (one bundle per tensor-parallel rank on
GPUs, so Ray places and sees every rank). The driver splits the pool's prompts over the replicas
(`longeval.stages.dispatch`: fair shares of tokens, prompts with one context on one replica) and hands each replica
its whole list; the replica keeps its engine full (`VllmEngine.stream`) and a writer thread commits finished
predictions to the run root while the engine computes, so a kill -9 loses only the rows in flight.

Engines live for one `infer` call (its follow-up calls reuse them) or, kept in an `Engines` object, for
an adaptive run's rounds.

A replica whose engine dies (vLLM's EngineDeadError, the actor killed, its node lost) is started again on the
prompts it had not finished, up to `cluster.engine_restarts` times; then those prompts are recorded as engine
errors, counted, and retried by the next run. Models behind an HTTP API keep the Ray Data path
(`_infer_api`): their actors only wait on the network.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from longeval.cluster import interrupt
from longeval.config.redaction import Redactor
from longeval.config.schema import Config, Dispatch
from longeval.engines import replica_engine_class
from longeval.engines.openai_compat import ApiPredictor
from longeval.engines.vllm_engine import Partial, Request
from longeval.errors import DiskFullError, LeaseLostError, LongevalError, find_error
from longeval.heap import release_freed_memory
from longeval.planning.plan import Plan, Pool, in_plan, suite_seq_tokens
from longeval.planning.plan import size_pool as plan_size_pool
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, ErrorKind, Prediction, prediction_table
from longeval.run.asked import only_asked
from longeval.stages.dispatch import (
    OPEN_SHARDS,
    OUTPUT_WEIGHT,
    Work,
    WorkQueue,
    assign,
    cost_of,
    group_by_context,
    reads,
)
from longeval.stages.followup import write_followups
from longeval.store.compact import compact_predictions
from longeval.store.lease import held_generation, superseded
from longeval.store.run_root import PROMPT_GROUP_BYTES, Elsewhere, RunRoot, prompt_group_bytes
from longeval.store.shards import ShardName
from longeval.tasks import TASKS

log = logging.getLogger(__name__)

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


def infer(cfg: Config, plan: Plan, root: RunRoot, model_path: str, progress=None, *,
          engines: Engines | None = None) -> int:
    """Run every instance without a final prediction, then the second calls of two-call tasks
    (`longeval.stages.followup`) until every chain is complete; returns how many prompts were handled.

    `engines`: replicas kept from an earlier call (an adaptive run's rounds); without it, the engines live for
    this call only (the follow-up calls reuse them).
    """
    plan.check_fits()  # a pool whose sequence fits on no GPU split fails here, not after an engine start
    compact_predictions(root)  # a resumed run's parts: every read below then opens one file per shard
    own = engines is None
    engines = engines if engines is not None else Engines(cfg, root, model_path)
    try:
        ran = _infer_round(cfg, plan, root, engines, progress)
        while write_followups(cfg, root, model_path):
            ran += _infer_round(cfg, plan, root, engines, progress)
    finally:
        if own:
            engines.close()
    compact_predictions(root)
    return ran


def first_calls(root: RunRoot, meta: pa.Table) -> pa.Table:
    """The rows of `meta` (instance metadata, `pending_predictions`) in generated shards, without the follow-up
    calls of two-call tasks: what a pool is sized from. Follow-ups appear round by round, so sizing from them
    would change a pool's settings between its rounds and restart its engines for each follow-up round (minutes
    for a large model); an uninterrupted run and a resumed one size the same either way."""
    followups = [n for n in root.shard_names("instances") if ShardName.parse(n).followup]
    if not followups:
        return meta
    ids = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"], names=followups)["instance_id"]
    return meta.filter(pc.invert(pc.is_in(meta["instance_id"], value_set=ids)))


def _infer_round(cfg: Config, plan: Plan, root: RunRoot, engines: Engines, progress=None) -> int:
    meta, done = pending_predictions(root)
    meta = in_plan(cfg, meta)  # a root reused with a smaller suite keeps other instances, which are not run
    generated = first_calls(root, meta)  # (pools are sized from every generated prompt, asked or not)
    meta = only_asked(cfg, root, meta)  # an adaptive round runs the positions it asked for, not whole shards
    ran = 0
    for pool in plan.pools:
        in_pool = pa.array(pool.lengths, pa.int64())
        mine = meta.filter(pc.is_in(meta["target_length"], value_set=in_pool))
        todo = mine.filter(pa.array([i not in done for i in mine["instance_id"].to_pylist()], pa.bool_()))
        if not todo.num_rows:
            continue
        if todo.num_rows < mine.num_rows:  # a resumed run; in an adaptive run, every round after the first
            say = log.info if cfg.suite.adaptive else log.warning
            say("%s: %d of %d prompts already have a prediction, %d to run", pool.name,
                mine.num_rows - todo.num_rows, mine.num_rows, todo.num_rows)
        send = record_too_long(cfg, pool, todo, root)
        ran += todo.num_rows - send.num_rows
        if send.num_rows:
            pool = engines.size(pool, generated.filter(pc.is_in(generated["target_length"], value_set=in_pool)))
            with root.written_elsewhere("predictions") as replicas_wrote:  # (a restart lists what they finished)
                if cfg.model.engine == "openai":
                    ran += _infer_api(cfg, pool, send, root, engines.model_path, progress)
                else:
                    ran += _infer_vllm(cfg, engines.replicas(pool), send, progress, wrote=replicas_wrote)
    return ran


def size_pool(cfg: Config, pool: Pool, instances: pa.Table) -> Pool:
    """The pool with its engine settings sized for this pool's prompts (all of them, not only those left, so a
    resumed run gets the same engines as an uninterrupted one)."""
    seq_tokens = pc.add(instances["input_tokens"], instances["max_new_tokens"]).to_pylist()
    return plan_size_pool(cfg, pool, seq_tokens)


def record_too_long(cfg: Config, pool: Pool, todo: pa.Table, root: RunRoot) -> pa.Table:
    """Write `prompt_too_long` for prompts over the pool's max_model_len (never sent: one would kill the
    engine's batch, ray #59194); returns the rest."""
    total = pc.add(todo["input_tokens"], todo["max_new_tokens"])
    over = pc.greater(total, pool.max_model_len)
    too_long = todo.filter(over)
    if too_long.num_rows:
        rows = [
            Prediction(instance_id=i, model_id=cfg.model.name, output="", output_tokens=0,
                       finish_reason="not_sent", cached_prompt_tokens=0, latency_s=0.0,
                       error=ErrorKind.PROMPT_TOO_LONG.format(f"{n} tokens > max_model_len {pool.max_model_len}"),
                       ).to_row()
            for i, n in zip(too_long["instance_id"].to_pylist(), total.filter(over).to_pylist(), strict=True)
        ]
        root.write_part("predictions", prediction_table(rows))
    return todo.filter(pc.invert(over))


def schedule(todo: pa.Table) -> list[Work]:
    """The pool's prompts in engine order: tasks that share contexts side by side (same context group, length
    and index), so a context's prompts reach one engine together and its prefix cache computes the context
    once, and shard by shard in the shard's row order (`index`), so a replica's reader keeps one shard's row
    groups at a time and on S3 reads the rows it runs next in one request. The order is a function of the
    instances alone. (It was by `context_id` within a shard, a hash: the queue then handed a shard's rows in
    random order and a 1M shard's read-ahead was wasted, a GET per prompt.)"""
    names = pc.binary_join_element_wise(todo["family"], todo["task"], "/").combine_chunks().dictionary_encode()
    groups = pa.array([(spec.context_group if (spec := TASKS.get(name)) else "") or name
                       for name in names.dictionary.to_pylist()], pa.string())
    # Sorted by Arrow, not as a Python dict per row: for 8,100 prompts the driver kept 5.7 MiB, not 9.4.
    keyed = todo.append_column("group", groups.take(names.indices))
    rows = todo.take(pc.sort_indices(keyed, sort_keys=[(c, "ascending") for c in (
        "group", "target_length", "shard_index", "index", "context_id", "task", "instance_id")]))
    shards: dict[tuple, str] = {}  # one string per shard, not per prompt
    budgets = rows["max_new_tokens"].to_pylist()
    costs = [cost_of(n, budget) for n, budget in zip(rows["input_tokens"].to_pylist(), budgets, strict=True)]
    keys = zip(*(rows[c].to_pylist() for c in ("family", "task", "target_length", "seed", "shard_index")), strict=True)
    return [Work(instance_id, context_id, cost, shards.setdefault(key, ShardName(*key).prefix), budget=budget,
                 weight=OUTPUT_WEIGHT)
            for instance_id, context_id, cost, budget, key in zip(rows["instance_id"].to_pylist(),
                                                                  rows["context_id"].to_pylist(), costs, budgets, keys,
                                                                  strict=True)]


# -- the replica actor ------------------------------------------------------------------------------------------


def engine_redactor(model, root_uri: str, public_keys: Iterable[str]) -> Redactor:
    """The run's `Redactor` as an engine's process sees it: the model's settings and env, the run root, and the
    process's own environment (on a cluster, a node's may hold credentials the driver's lacks)."""
    return Redactor.of({"model": asdict(model), "store": {"root": root_uri}}, public=public_keys)


class Replica:
    """One engine of a pool, as a Ray actor (two threads: `run` computes, `progress` answers the driver)."""

    def __init__(self, model, model_path: str, model_id: str, max_model_len: int, root_uri: str, name: str,
                 public_keys: tuple[str, ...] = ()) -> None:
        import ray

        self.name, self.model_id = name, model_id
        self.node = ray.get_runtime_context().get_node_id()
        self.engine = replica_engine_class(model)(model, model_path, max_model_len)  # vLLM, or the stand-in
        self.root = RunRoot(root_uri)
        self.writer: _Writer | None = None
        self.runs = 0
        self.info = engine_redactor(model, root_uri, public_keys).tree(
            {**self.engine.info, "replica": name, "node": self.node})
        started = int(time.time())
        self.record = f"engines/{name.replace('/', '-')}-{self.info['host']}-{os.getpid()}-{started}.json"
        self.root.write_json(self.record, self.info)
        # Looked up again the way the writer checks its lease (boto3's HEAD on S3, not pyarrow's): a store that
        # refuses that client fails here (a StoreError), before any prompt, and the client's fixed cost (on
        # SeaweedFS the replica's peak before its first prompt rose 205 -> 220 MiB) is paid before the first prompt
        # rather than on top of the prompts in flight.
        self.root.exists(self.record)
        self.engine.check_rotary()  # after the record: a refused engine leaves what vLLM built on disk

    def ready(self) -> dict:
        return self.info

    def progress(self) -> int:
        """Rows the current (or last) `run` has finished (committed within `commit_interval_s`)."""
        return self.writer.finished if self.writer is not None else 0

    def run(self, work: list[tuple[str, str, int]], inflight: int | None = None, commit_interval_s: float = 30.0,
            shards: dict[str, int | None] | None = None, fence: int | None = None,
            group_bytes: int = PROMPT_GROUP_BYTES) -> dict:
        """Run `(instance_id, shard prefix, shards its context spans)` (`dispatch.reads`) in this order (static
        dispatch); returns the engine's figures (its whole life's, with `runs`: an engine kept across adaptive
        rounds runs once per round, and `rows`: this run's). `shards`: the instance shards that hold them and
        their bytes, as the driver listed them (None: list). `fence`: the generation of the run root's lease the
        driver holds (`_Writer`). `group_bytes`: the prompt reader's budget of decoded row groups
        (`store.prompt_group_bytes`)."""
        return self._run(iter(work), inflight or 2 * self.engine.max_num_seqs, commit_interval_s, shards, fence,
                         group_bytes)

    def run_queue(self, queue: Any, k: int, inflight: int | None = None, commit_interval_s: float = 30.0,
                  shards: dict[str, int | None] | None = None, fence: int | None = None,
                  group_bytes: int = PROMPT_GROUP_BYTES) -> dict:
        """Take contexts from the pool's `WorkQueue` actor as the engine has room, until the queue is empty
        (dynamic dispatch). The window defaults to `max_num_seqs`: a replica takes no more than its engine runs,
        so what it has not started stays in the queue for a free replica."""
        return self._run(self._from_queue(queue, k), inflight or self.engine.max_num_seqs, commit_interval_s, shards,
                         fence, group_bytes)

    def _run(self, work: Iterator[tuple[str, str, int] | None], inflight: int, commit_interval_s: float,
             shards: dict[str, int | None] | None, fence: int | None, group_bytes: int) -> dict:
        began = time.perf_counter()
        self.writer = _Writer(self.root, extra={"model_id": self.model_id, "replica": self.name, "node": self.node},
                              interval_s=commit_interval_s, fence=fence)
        self.finished_ids: list[str] = []
        last_row = began
        try:
            for rows in self.engine.stream(self._requests(work, shards, group_bytes), inflight=inflight):
                self.writer.put(rows)
                self.finished_ids += [row["instance_id"] for row in rows]
                last_row = time.perf_counter()
        finally:
            self.writer.close()
        self.runs += 1
        # run_s: first request to last prediction committed, what this work cost once the engine was up;
        # last_row_s: to the last prediction made (a replica of a dynamic pool waits after it for work to move).
        stats = {**self.engine.stats.record(), "runs": self.runs, "run_s": round(time.perf_counter() - began, 3),
                 "last_row_s": round(last_row - began, 3), "rows": self.writer.finished}
        self.root.write_json(self.record, {**self.info, "stats": stats})
        return {**stats, "parts": self.writer.names}  # the driver then knows them without a listing

    def _from_queue(self, queue: Any, k: int) -> Iterator[tuple | None]:
        """The queue's contexts as `(instance_id, shard prefix, shards the context spans[, answer so far])` (the
        last for a prompt another replica gave back part-way, `dispatch.Work.resumed`); None while the queue
        holds this replica's next work back: asked again once some of what it holds finished or was given back
        (`release`), else after `REASK_S` (work another replica gave back may be waiting for it). Ends when the
        queue has nothing left for it and it holds nothing: until then it reports what it gives back."""
        import ray

        held_back, asked_at, holding = False, 0.0, 0
        while True:
            given_back = self.engine.give_back.given()
            if held_back and not self.finished_ids and not given_back and time.monotonic() - asked_at < REASK_S:
                yield None
                continue
            finished, self.finished_ids = self.finished_ids, []
            holding -= len(finished) + len(given_back)
            asked_at = time.monotonic()
            got = ray.get(queue.take.remote(k, 1, finished, given_back=given_back, progress=self.engine.progress()))
            if got is None and holding <= 0:
                return
            holding += len(got or [])
            held_back = not got
            if held_back:
                yield None
            for read, work in zip(reads(got or []), got or [], strict=True):
                yield (*read, work.resumed) if work.resumed else read

    def answers(self) -> dict[str, int]:
        """Tokens generated so far by each request in the engine (`VllmEngine.progress`), for the work queue's
        estimates between this replica's asks: a replica with a full engine asks only when a prompt finishes,
        which on a slow one can be a minute. Read from the actor's second thread while the engine steps; a read
        that races a step reports nothing."""
        try:
            return self.engine.progress()
        except (RuntimeError, KeyError, AttributeError):
            return {}

    def release(self, instance_ids: list[str]) -> None:
        """Give these prompts back unfinished (dynamic dispatch moves them to a replica that would finish them
        sooner); the engine drops them between steps and the next ask reports them (`_from_queue`)."""
        self.engine.give_back.ask(instance_ids)

    def _requests(self, work: Iterator[tuple[str, str, int] | None], shards: dict[str, int | None] | None,
                  group_bytes: int) -> Iterator:
        """The token ids of each prompt, read as the engine asks for them (`PromptReader`); None passed on."""
        reader = PromptReader(self.root, shards=shards, group_bytes=group_bytes,
                              references=self.engine.needs_references)
        try:
            for item in work:
                if item is None:
                    yield None
                    continue
                request = reader.request(*item[:3])
                if len(item) > 3:  # given back part-way by another replica: continued from its answer so far
                    tokens, text = item[3]
                    request = replace(request, resumed=Partial(tuple(tokens), text))
                yield request
        finally:
            reader.close()


REASK_S = 1.0
"""How often a replica the work queue holds back asks again when nothing it holds finished: work may move to it
from a slower replica (`dispatch.WorkQueue._ask_back`)."""

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
        room = min(self.group_bytes_max - self.group_bytes, share) - _ids_bytes(footer, g)
        read = self.read.get(name, set())
        while g + len(run) < footer.num_row_groups and g + len(run) not in read:
            room -= _ids_bytes(footer, g + len(run))
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


def _ids_bytes(footer: Any, group: int) -> int:
    """A row group's token ids as Arrow holds them once read (its `nbytes`, what the budget counts): int32 values,
    their validity bitmap (the Parquet reader makes one), and int64 offsets. Parquet's own sizes are of its
    encodings. (Without the bitmap, a run that filled the budget overshot it by an eighth of a byte a token and
    pushed out its own last group, which was then read again.)"""
    row_group = footer.row_group(group)
    tokens = sum(row_group.column(i).num_values for i in range(row_group.num_columns)
                 if row_group.column(i).path_in_schema.startswith("prompt_token_ids"))
    return 4 * tokens + (tokens + 7) // 8 + 8 * (row_group.num_rows + 1)


class _Writer:
    """Commits finished predictions from a thread of its own, so the engine never waits on the store.

    Rows are gathered for up to `interval_s` after the first of them finished (or `max_rows` of them), then
    committed as one part: a kill -9 loses at most that much finished work, and a long stage leaves one small
    file per interval per replica, not one per row (the stage merges them at its end, `longeval.store.compact`).

    `fence`: the generation of the root's lease its driver holds. Before each part the writer checks that no
    later claim exists (`lease.superseded`, one HEAD): a killed driver's replicas live on for about a second (Ray
    ends them once it sees the driver gone) and committed parts a rerun had already listed as not done, so it ran
    those prompts again; a driver taken over after missing its stale limit has replicas that would write on.
    """

    def __init__(self, root: RunRoot, *, extra: dict[str, str], interval_s: float = 30.0,
                 max_rows: int = 1024, fence: int | None = None) -> None:
        self.root, self.extra, self.interval_s, self.max_rows = root, extra, interval_s, max_rows
        self.fence = fence
        self.queue: queue.Queue[list[dict] | None] = queue.Queue()
        self.count = 0
        """Rows committed."""
        self.finished = 0
        """Rows handed over by the engine (what a progress bar shows: commits come every `interval_s`)."""
        self.names: list[str] = []
        """The parts committed."""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="longeval-writer", daemon=True)
        self.thread.start()

    @property
    def parts(self) -> int:
        """How many parts were committed."""
        return len(self.names)

    def put(self, rows: list[dict]) -> None:
        if self.error is not None:
            raise self._failed()
        self.finished += len(rows)
        self.queue.put(rows)

    def close(self) -> int:
        """Write what is left; returns how many rows were written in all."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self._failed()
        return self.count

    def _failed(self) -> BaseException:
        """The writer's error for the engine's thread: a full disk or a lost lease as itself (the driver stops the
        run on them: a restart cannot help)."""
        if isinstance(self.error, DiskFullError | LeaseLostError):
            return self.error
        failed = LongevalError(f"writing predictions failed: {self.error}")
        failed.__cause__ = self.error
        return failed

    def _loop(self) -> None:
        closing = False
        while not closing:
            first = self.queue.get()
            if first is None:
                return
            rows, due = list(first), time.monotonic() + self.interval_s
            while len(rows) < self.max_rows:
                try:  # what is queued already goes in this part, even with no time left
                    more = self.queue.get(timeout=max(0.0, due - time.monotonic())) if time.monotonic() < due \
                        else self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                    break
                rows += more
            try:
                if self.fence is not None and superseded(self.root, self.fence):
                    raise LeaseLostError(
                        f"run root {self.root.uri}: a later run took this run's lease over (claim {self.fence + 1}); "
                        f"this replica stops without writing its last {len(rows)} predictions, which that run makes")
                table = prediction_table([{**row, **self.extra} for row in rows])
                self.names.append(self.root.write_part("predictions", table))
                self.count += len(rows)
            except BaseException as exc:  # surfaced by put/close in the engine's thread
                self.error = exc
                return


# -- placing and driving a pool's replicas ----------------------------------------------------------------------


def bundles(pool: Pool) -> tuple[list[dict[str, float]], str]:
    """The placement group of one replica: one bundle per tensor-parallel rank on GPUs (vLLM's Ray executor puts a
    rank in each), one CPU bundle for an engine on CPU (its ranks are local processes)."""
    gpus = pool.gpus_per_replica
    if gpus and pool.tensor_parallel_size > 1:
        return [{"CPU": 1.0, "GPU": 1.0} for _ in range(pool.tensor_parallel_size)], "PACK"
    bundle = {"CPU": 1.0}
    if gpus:
        bundle["GPU"] = float(gpus)
    return [bundle], "PACK"


def actor_options(pool: Pool, group: Any) -> dict[str, Any]:
    """Ray options for a replica actor inside its placement group; child tasks (vLLM's Ray workers) join it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ranks_in_bundles = bool(pool.gpus_per_replica) and pool.tensor_parallel_size > 1
    return {
        "num_cpus": 1,
        "num_gpus": 0 if ranks_in_bundles else (pool.gpus_per_replica or 0),
        "max_concurrency": 2,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True),
    }


RESERVE_CPUS = 1.0
"""CPUs kept free of engines while other pools' engines wait: the generate and score stages run between
inference rounds and would wait forever for a CPU."""


def has_room(total: dict[str, float], held: list[dict[str, float]], need: dict[str, float]) -> bool:
    """Whether `need` fits in the cluster's `total` resources beside what live pools hold, with `RESERVE_CPUS`
    left over."""
    left = dict(total)
    left["CPU"] = left.get("CPU", 0.0) - RESERVE_CPUS
    for resources in held:
        for key, value in resources.items():
            left[key] = left.get(key, 0.0) - value
    return all(left.get(key, 0.0) >= value for key, value in need.items())


class Engines:
    """The infer stage's live engine replicas, per pool, kept until `close`.

    An adaptive run keeps one `Engines` for all its rounds, so a round reuses warm engines instead of paying
    the engine start (minutes for a large model on GPUs) again; a plain run keeps them for one `infer` call
    (its follow-up calls). A pool is reused while its sized settings stay the same, so an adaptive run sizes
    pools from the suite's plan (`planned=True`), which does not grow round by round. A pool whose placement
    needs room another live pool holds stops that one first (least recently used), and `RESERVE_CPUS` stay free.
    """

    def __init__(self, cfg: Config, root: RunRoot, model_path: str, *, planned: bool = False) -> None:
        self.cfg, self.root, self.model_path, self.planned = cfg, root, model_path, planned
        self.live: OrderedDict[str, PoolReplicas] = OrderedDict()
        self.started = 0
        """Engines started in this object's life (restarts included)."""

    def size(self, pool: Pool, instances: pa.Table) -> Pool:
        """The pool sized for its sequences: the suite's planned ones (`planned`) or the instances on disk."""
        if self.planned:
            return plan_size_pool(self.cfg, pool, suite_seq_tokens(self.cfg, pool))
        return size_pool(self.cfg, pool, instances)

    def replicas(self, pool: Pool) -> PoolReplicas:
        """The live replicas of `pool`, or a new set when it has none or its settings changed."""
        live = self.live.pop(pool.name, None)
        if live is not None and live.pool == pool:
            self.live[pool.name] = live  # most recently used last
            return live
        if live is not None:
            live.close()
        self._make_room(pool)
        replicas = PoolReplicas(self, pool)
        self.live[pool.name] = replicas
        return replicas

    def _make_room(self, pool: Pool) -> None:
        import ray

        total = ray.cluster_resources()
        while self.live and not has_room(total, [r.resources() for r in self.live.values()], PoolReplicas.needs(pool)):
            name, oldest = self.live.popitem(last=False)
            log.info("stopping %s's engines to make room for %s", name, pool.name)
            oldest.close()

    def close(self) -> None:
        while self.live:
            _, replicas = self.live.popitem(last=False)
            replicas.close()


class PoolReplicas:
    """A pool's replica actors, each in a placement group of its own, started on demand and kept until closed."""

    def __init__(self, engines: Engines, pool: Pool) -> None:
        self.engines, self.pool = engines, pool
        cfg = engines.cfg
        self.model = replace(cfg.model, **pool.engine_overrides(cfg.model))
        self.groups: dict[int, Any] = {}
        self.actors: dict[int, Any] = {}
        self.restarts: dict[int, int] = {}

    @staticmethod
    def needs(pool: Pool) -> dict[str, float]:
        """What all of a pool's replicas hold in Ray resources."""
        spec, _ = bundles(pool)
        out: dict[str, float] = {}
        for bundle in spec:
            for key, value in bundle.items():
                out[key] = out.get(key, 0.0) + value * pool.replicas
        return out

    def resources(self) -> dict[str, float]:
        return self.needs(self.pool) if self.groups else {}

    def name(self, k: int) -> str:
        return f"{self.pool.name}/r{k}"

    def start(self, ks: list[int]) -> dict[int, Any]:
        """Replicas `ks`, started (all engines loading at once) where they are not live; returns them ready."""
        import ray
        from ray.util import placement_group

        for k in ks:
            if k not in self.groups:
                spec, strategy = bundles(self.pool)
                self.groups[k] = placement_group(spec, strategy=strategy,
                                                 name=f"longeval-{self.name(k)}-{os.getpid()}")
        new = [k for k in ks if k not in self.actors]
        timeout = self.engines.cfg.cluster.placement_timeout_s
        waiting = [self.groups[k].ready() for k in new]
        ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=timeout)
        if len(ready) < len(waiting):
            spec, _ = bundles(self.pool)
            raise LongevalError(
                f"{self.pool.name}: {len(waiting) - len(ready)} of {len(waiting)} replicas could not be placed "
                f"within {timeout:.0f} s; each needs {spec}, the cluster has {ray.available_resources()} free. "
                "Lower cluster.replicas or model.tensor_parallel_size, add nodes, or raise "
                "cluster.placement_timeout_s while an autoscaler adds them")
        cfg = self.engines.cfg
        created = {}
        for k in new:
            restarts = self.restarts.get(k, 0)
            created[k] = ray.remote(Replica).options(**actor_options(self.pool, self.groups[k])).remote(
                self.model, self.engines.model_path, cfg.model.name, self.pool.max_model_len, self.engines.root.uri,
                self.name(k) + (f"#{restarts}" if restarts else ""), tuple(cfg.public_keys))
            self.engines.started += 1
        for k, actor in created.items():
            try:
                ray.get(actor.ready.remote())
            except ray.exceptions.RayError as exc:
                for other in created.values():
                    ray.kill(other, no_restart=True)
                stop_on_fatal(exc)  # the replica's first write found the disk full: not the engine's fault
                raise LongevalError(f"the engine of {self.name(k)} failed to start: {_cause(exc)}") from exc
        self.actors.update(created)
        return {k: self.actors[k] for k in ks}

    def replace(self, k: int) -> None:
        """Stop replica `k` (dead or dying); the next `start` starts it again in the same placement group."""
        import ray

        actor = self.actors.pop(k, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)
        self.restarts[k] = self.restarts.get(k, 0) + 1

    def close(self) -> None:
        import ray

        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        for group in self.groups.values():
            ray.util.remove_placement_group(group)
        self.actors.clear()
        self.groups.clear()


def _infer_vllm(cfg: Config, replicas: PoolReplicas, send: pa.Table, progress, *,
                wrote: Elsewhere | None = None) -> int:
    """Run `send` on the pool's replicas; `wrote` learns the parts they committed (complete when none died: the
    driver then knows the predictions stage without listing it again)."""
    pool = replicas.pool
    rows = schedule(send)
    driver = _QueueDriver(cfg, replicas, rows) if cfg.cluster.dispatch == Dispatch.dynamic else \
        _StaticDriver(cfg, replicas, assign(rows, pool.replicas))
    driver.shards = pool_shards(replicas.engines.root, rows)
    driver.group_bytes = prompt_group_bytes(max((sum(w.tokens for w in c) for c in group_by_context(rows)), default=0))
    task_id = progress.add_task(f"infer {pool.name}", total=send.num_rows) if progress else None
    try:
        driver.start()
        shown = 0
        while driver.running():
            interrupt.check()
            driver.wait(timeout_s=1.0)
            driver.rebalance()
            done = driver.progress()
            if progress and done > shown:
                progress.advance(task_id, done - shown)
                shown = done
        if progress and send.num_rows > shown:
            progress.advance(task_id, send.num_rows - shown)
    except BaseException:
        replicas.close()  # an engine in the middle of a list is not reused: the next call starts afresh
        raise
    finally:
        driver.close()
    if wrote is not None:
        wrote.written.update(driver.parts)
        wrote.complete = not driver.died
    log.info("%s: %s", pool.name, driver.stats)
    return send.num_rows


def pool_shards(root: RunRoot, rows: list[Work]) -> dict[str, int | None]:
    """The instance shards (generated and follow-up) that hold `rows` and their bytes, from the driver's own
    listing."""
    prefixes = {w.shard for w in rows}
    return {name: size for name, size in root.shard_sizes("instances").items()
            if ShardName.parse(name).prefix in prefixes}


class _PoolDriver(abc.ABC):
    """Runs a pool's prompts on its replicas and restarts the ones that die (what both dispatch modes share)."""

    def __init__(self, cfg: Config, replicas: PoolReplicas) -> None:
        self.cfg, self.replicas, self.root = cfg, replicas, replicas.engines.root
        self.runs: dict[Any, int] = {}
        """Each running `run` call's object ref -> its replica."""
        self.shards: dict[str, int | None] | None = None
        """The instance shards that hold the pool's prompts, from the driver's listing (`pool_shards`)."""
        self.group_bytes = PROMPT_GROUP_BYTES
        """Each replica's budget of decoded row groups (`store.prompt_group_bytes` of the pool's largest context)."""
        self.fence = held_generation(self.root)
        """The root's lease generation this driver holds, for its replicas' writers (`_Writer`)."""
        self.failures: dict[int, int] = {}
        self.parts: list[str] = []
        """The prediction parts the replicas' finished runs committed (as they reported them)."""
        self.died = False
        """Whether a run died: its replica's parts are then known only to a listing."""
        self.done_rows = 0
        """Rows finished by runs that ended (returned, or died: those their replica committed)."""
        self.stats: dict[str, dict] = {}

    @abc.abstractmethod
    def start(self) -> None:
        """List the pool's work and set its first replicas running."""

    @abc.abstractmethod
    def _launch_one(self, k: int, actor: Any) -> Any:
        """Set replica `k` (its actor `actor`) running on its work; the object ref of that `run` call."""

    @abc.abstractmethod
    def _replica_died(self, k: int, exc: BaseException) -> None:
        """Make replica `k`'s unfinished work someone's again after its run failed with `exc`."""

    def _launch(self, ks: list[int]) -> None:
        """Start (or reuse) replicas `ks` and set each running."""
        for k, actor in self.replicas.start(ks).items():
            self.runs[self._launch_one(k, actor)] = k

    def running(self) -> bool:
        return bool(self.runs)

    def wait(self, timeout_s: float) -> None:
        import ray

        ready, _ = ray.wait(list(self.runs), num_returns=1, timeout=timeout_s)
        for ref in ready:
            k = self.runs.pop(ref)
            try:
                stats = ray.get(ref)
            except ray.exceptions.RayError as exc:
                stop_on_fatal(exc)  # a restart would only fill the same disk again, or write a root taken over
                interrupt.check()  # engines in the terminal's process group die of the same Ctrl-C: no restart
                self.died = True
                self.replicas.replace(k)
                self._replica_died(k, exc)
                continue
            self.parts += stats.pop("parts", [])
            self.stats[self.replicas.name(k)] = stats
            self.done_rows += stats["rows"]
            self._run_ended(k)

    def _run_ended(self, k: int) -> None:  # noqa: B027 (a hook: static dispatch has nothing to do)
        """Replica `k` finished what it was given."""

    def _give_up(self, k: int, exc: BaseException, left: list[Work]) -> bool:
        """Count replica `k`'s failure; True (and `left` recorded as engine errors) once it failed too often."""
        self.failures[k] = self.failures.get(k, 0) + 1
        name = self.replicas.name(k)
        if self.failures[k] <= self.cfg.cluster.engine_restarts:
            log.warning("%s died (%s); starting it again, %d of its prompts unfinished", name, _cause(exc), len(left))
            return False
        log.error("%s failed %d times; its %d unfinished prompts are recorded as engine errors (a rerun retries "
                  "them): %s", name, self.failures[k], len(left), _cause(exc))
        error = ErrorKind.ENGINE_ERROR.format(f"{name} failed {self.failures[k]} times: {_cause(exc)}")
        self._record_failed(left, error)
        return True

    def _record_failed(self, left: list[Work], error: str) -> None:
        rows = [Prediction(instance_id=w.instance_id, model_id=self.cfg.model.name, output="", output_tokens=0,
                           finish_reason="error", cached_prompt_tokens=0, latency_s=0.0, error=error[:2000]).to_row()
                for w in left]
        self.root.write_part("predictions", prediction_table(rows))
        self.done_rows += len(left)

    def progress(self) -> int:
        """Rows finished so far by the pool in this call."""
        import ray

        live = {k: self.replicas.actors[k] for k in self.runs.values() if k in self.replicas.actors}
        refs = {actor.progress.remote(): k for k, actor in live.items()}
        counts = dict.fromkeys(live, 0)
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=5.0) if refs else ([], [])
        for ref in ready:
            try:
                counts[refs[ref]] = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # dead: `wait` restarts it
        return self.done_rows + sum(counts.values())

    def rebalance(self) -> None:  # noqa: B027 (a hook: static dispatch moves nothing)
        """Pass on what the dispatch asks replicas to give back."""

    def close(self) -> None:  # noqa: B027 (a hook: static dispatch holds nothing else)
        """Free what the driver holds besides the replicas."""


class _StaticDriver(_PoolDriver):
    """Static dispatch: each replica runs a fixed list; a restarted one runs what is left of its own list."""

    def __init__(self, cfg: Config, replicas: PoolReplicas, work: list[list[Work]]) -> None:
        super().__init__(cfg, replicas)
        self.work = {k: w for k, w in enumerate(work) if w}

    def start(self) -> None:
        self._launch(list(self.work))

    def _launch_one(self, k: int, actor: Any) -> Any:
        return actor.run.remote(reads(self.work[k]), self.cfg.cluster.inflight,
                                self.cfg.cluster.commit_interval_s, self.shards, self.fence, self.group_bytes)

    def _replica_died(self, k: int, exc: BaseException) -> None:
        done = final_ids(self.root)
        left = [w for w in self.work[k] if w.instance_id not in done]
        self.done_rows += len(self.work[k]) - len(left)
        self.work[k] = left
        if left and not self._give_up(k, exc, left):
            self._launch([k])


class _QueueDriver(_PoolDriver):
    """Dynamic dispatch: every replica takes from one `WorkQueue` actor. A dead replica's unfinished prompts go
    back to the queue at once, for the others to take while it starts again; a replica that ran out of work is
    set running again when work comes back."""

    def __init__(self, cfg: Config, replicas: PoolReplicas, rows: list[Work]) -> None:
        import ray

        super().__init__(cfg, replicas)
        self.ks = list(range(min(replicas.pool.replicas, len(group_by_context(rows)))))
        self.queue = ray.remote(WorkQueue).options(num_cpus=0).remote(rows, len(self.ks))
        self.idle: set[int] = set()
        """Live replicas whose run ended because the queue was empty."""

    def start(self) -> None:
        self._launch(self.ks)

    def _launch_one(self, k: int, actor: Any) -> Any:
        self.idle.discard(k)
        return actor.run_queue.remote(self.queue, k, self.cfg.cluster.inflight, self.cfg.cluster.commit_interval_s,
                                      self.shards, self.fence, self.group_bytes)

    def _run_ended(self, k: int) -> None:  # noqa: B027 (a hook: static dispatch has nothing to do)
        import ray

        ray.get(self.queue.ran_out.remote(k))
        self.idle.add(k)
        self._wake_idle()  # a dead replica's work may have come back since this one last asked

    def _replica_died(self, k: int, exc: BaseException) -> None:
        import ray

        self.idle.discard(k)
        done = final_ids(self.root)
        # Its unfinished prompts go back to the queue unless this failure is one too many: then they may be
        # what kills engines, and are recorded instead of passed on.
        requeue = self.failures.get(k, 0) < self.cfg.cluster.engine_restarts
        left, finished = ray.get(self.queue.give_back.remote(k, done, requeue))
        self.done_rows += finished
        if self._give_up(k, exc, left):
            ray.get(self.queue.retire.remote(k))
            if not [j for j in self.ks if self.failures.get(j, 0) <= self.cfg.cluster.engine_restarts]:
                rest = ray.get(self.queue.drain.remote())  # no replica left to run them
                if rest:
                    self._record_failed(rest, ErrorKind.ENGINE_ERROR.format(
                        f"every replica of {self.replicas.pool.name} failed more than "
                        f"{self.cfg.cluster.engine_restarts} times"))
            self._wake_idle()
            return
        self._launch([k])
        self._wake_idle()

    def rebalance(self) -> None:
        import ray

        running = {k: self.replicas.actors[k] for k in self.runs.values() if k in self.replicas.actors}
        refs = {actor.answers.remote(): k for k, actor in running.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=2.0) if refs else ([], [])
        answers = {}
        for ref in ready:
            with contextlib.suppress(ray.exceptions.RayError):  # dead: `wait` restarts it
                answers[refs[ref]] = ray.get(ref)
        self.queue.report.remote(answers)  # and the queue may ask a slower replica for work (`WorkQueue.report`)
        for k, ids in ray.get(self.queue.reclaims.remote()).items():
            if k in self.replicas.actors:
                self.replicas.actors[k].release.remote(ids)  # repeated each second until done: idempotent
        self._wake_idle()  # a replica whose run ended may take what another gave back

    def _wake_idle(self) -> None:
        """Set replicas that ran out of work running again when the queue has work (a dead one's)."""
        import ray

        if self.idle and ray.get(self.queue.remaining.remote()):
            self._launch(sorted(self.idle))

    def close(self) -> None:
        import ray

        with contextlib.suppress(ray.exceptions.RayError):  # a record for reading a straggler, not a result
            self.root.write_json(f"dispatch/{self.replicas.pool.name}.json", {
                "pool": self.replicas.pool.name, "replicas": {k: self.replicas.name(k) for k in self.ks},
                "events": ray.get(self.queue.events.remote(), timeout=30)})
        ray.kill(self.queue, no_restart=True)


def stop_on_fatal(exc: BaseException) -> None:
    """Raise the DiskFullError or LeaseLostError a replica died of, if that is what it died of: no restart helps,
    and the run stops with its one line."""
    for kind in (DiskFullError, LeaseLostError):
        found = find_error(exc, kind)
        if found is not None:
            raise kind(str(found)) from exc  # a fresh one, raised here: the Ray error prints its traceback


def _cause(exc: BaseException) -> str:
    """The innermost message of a Ray error, on one line."""
    cause, seen = exc, {id(exc)}
    while (following := getattr(cause, "cause", None) or cause.__cause__) is not None and id(following) not in seen:
        cause = following
        seen.add(id(cause))
    text = f"{type(cause).__name__}: {cause}".strip().splitlines()
    return text[-1][:500] if text else type(cause).__name__


# -- models behind an HTTP API --------------------------------------------------------------------------------


def _infer_api(cfg: Config, pool: Pool, send: pa.Table, root: RunRoot, model_path: str, progress) -> int:
    """Ray Data over the instance shards: one API actor per replica, each with `api.concurrency` requests open."""
    import ray

    fs, paths = root.stage_files("instances")
    paths = [p for p in paths if ShardName.parse(p.rsplit("/", 1)[-1].removesuffix(".parquet")).target_length
             in pool.lengths]
    columns = ["instance_id", "prompt_token_ids", "max_new_tokens", "target_length"]
    if cfg.model.api.mode == "chat":  # chat requests send the text, not the token ids
        columns += ["prompt", "answer_prefix"]
    wanted = send["instance_id"].combine_chunks()
    batch = max(cfg.cluster.batch_size, cfg.model.api.concurrency)
    # Ray's Parquet reader packs small files into one block (and one block feeds one actor): repartition so
    # every replica gets rows.
    ds = ray.data.read_parquet(paths, filesystem=fs, columns=columns)
    ds = ds.map_batches(lambda t: t.filter(pc.is_in(t["instance_id"], value_set=wanted)), batch_format="pyarrow")
    ds = ds.repartition(max(1, -(-send.num_rows // batch))).map_batches(
        ApiWriter,
        fn_constructor_kwargs={"model": cfg.model, "model_path": model_path, "model_id": cfg.model.name,
                               "max_model_len": pool.max_model_len, "root_uri": root.uri,
                               "public_keys": tuple(cfg.public_keys)},
        batch_size=batch, compute=ray.data.ActorPoolStrategy(size=pool.replicas), num_cpus=0.25,
    )
    task_id = progress.add_task(f"infer {pool.name}", total=send.num_rows) if progress else None
    for out in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        interrupt.check()
        if progress:
            progress.advance(task_id, out.num_rows)
    return send.num_rows


class ApiWriter:
    """Ray Data callable for API models: the engine answers a batch, this commits its rows and the engine record
    (the engine itself never touches the store)."""

    def __init__(self, model, model_path: str, model_id: str, max_model_len: int, root_uri: str,
                 public_keys: tuple[str, ...] = ()) -> None:
        self.predictor = ApiPredictor(model, model_path, model_id, max_model_len)
        self.root = RunRoot(root_uri)
        self.redactor = engine_redactor(model, root_uri, public_keys)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        rows = self.predictor(batch)
        # a failed request's message may quote the server's URL, user info included
        rows["error"] = [self.redactor.text(e) if e else e for e in rows["error"]]
        self.root.write_part("predictions", prediction_table(rows))
        self.root.write_json(self.predictor.record_name, self.redactor.tree(self.predictor.record()))
        return rows
