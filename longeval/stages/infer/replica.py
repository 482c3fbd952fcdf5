"""The replica actor: one engine of a pool, fed by its prompt reader and committing through its prediction writer.

A replica is a Ray actor in a placement group of its own (`longeval.stages.infer.placement`). It runs the list the
driver gave it (static dispatch) or takes contexts from the pool's `WorkQueue` actor as its engine has room
(dynamic dispatch); the engine stays full (`VllmEngine.stream`) while a writer thread commits finished predictions
(`writer.PredictionWriter`), so a kill -9 loses only the rows in flight.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from typing import Any

from longeval.config.redaction import Redactor
from longeval.engines import replica_engine_class
from longeval.engines.vllm_engine import Partial
from longeval.stages.infer.dispatch import reads
from longeval.stages.infer.reader import PromptReader
from longeval.stages.infer.writer import PredictionWriter
from longeval.store.row_group_reads import PROMPT_GROUP_BYTES
from longeval.store.run_root import RunRoot

__all__ = ["REASK_S", "Replica", "engine_redactor"]


def engine_redactor(model, root_uri: str, public_keys: Iterable[str]) -> Redactor:
    """The run's `Redactor` as an engine's process sees it: the model's settings and env, the run root, and the
    process's own environment (on a cluster, a node's may hold credentials the driver's lacks)."""
    return Redactor.of({"model": asdict(model), "store": {"root": root_uri}}, public=public_keys)


class Replica:
    """One engine of a pool, as a Ray actor (two threads: `run` computes, `progress` answers the driver)."""

    def __init__(self, model, model_path: str, model_id: str, max_model_len: int, root_uri: str, name: str,
                 public_keys: tuple[str, ...] = ()) -> None:
        import ray

        self.model, self.model_id = model, model_id
        self.node = ray.get_runtime_context().get_node_id()
        self.engine = replica_engine_class(model)(model, model_path, max_model_len)  # vLLM, or the stand-in
        self.adopted = 0
        self._bind(root_uri, name, public_keys)
        self.engine.check_rotary()  # after the record: a refused engine leaves what vLLM built on disk

    def _bind(self, root_uri: str, name: str, public_keys: tuple[str, ...]) -> None:
        """Serve the run at `root_uri` as `name`: its engine record written there."""
        self.name = name
        self.root = RunRoot(root_uri)
        self.writer: PredictionWriter | None = None
        self.runs = 0
        self.info = engine_redactor(self.model, root_uri, public_keys).tree(
            {**self.engine.info, "replica": name, "node": self.node,
             **({"kept_from_earlier_runs": self.adopted} if self.adopted else {})})
        started = int(time.time())
        self.record = f"engines/{name.replace('/', '-')}-{self.info['host']}-{os.getpid()}-{started}.json"
        self.root.write_json(self.record, self.info)
        # Looked up again the way the writer checks its lease (boto3's HEAD on S3, not pyarrow's): a store that
        # refuses that client fails here (a StoreError), before any prompt, and the client's fixed cost (on
        # SeaweedFS the replica's peak before its first prompt rose 205 -> 220 MiB) is paid before the first prompt
        # rather than on top of the prompts in flight.
        self.root.exists(self.record)

    def adopt(self, root_uri: str, name: str, public_keys: tuple[str, ...] = ()) -> dict:
        """Serve the next run of this process (`cluster.keep_engines`): its run root and name, an engine record
        there that says the engine was kept (`kept_from_earlier_runs`), and the engine reset to compute as a fresh
        one (`VllmEngine.reset`)."""
        self.engine.reset()
        self.adopted += 1
        self._bind(root_uri, name, public_keys)
        return self.info

    def ready(self) -> dict:
        """The engine record, with where it is written (`record`: unique to this actor's life in this run)."""
        return {**self.info, "record": self.record}

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
        driver holds (`PredictionWriter`). `group_bytes`: the prompt reader's budget of decoded row groups
        (`store.prompt_group_bytes`)."""
        return self._run(iter(work), inflight or 2 * self.engine.max_num_seqs, commit_interval_s, shards, fence,
                         group_bytes)

    def run_queue(self, queue: Any, k: int, inflight: int | None = None, commit_interval_s: float = 30.0,
                  shards: dict[str, int | None] | None = None, fence: int | None = None,
                  group_bytes: int = PROMPT_GROUP_BYTES, life: int = 0) -> dict:
        """Take contexts from the pool's `WorkQueue` actor as the engine has room, until the queue is empty
        (dynamic dispatch). The window defaults to `max_num_seqs`: a replica takes no more than its engine runs,
        so what it has not started stays in the queue for a free replica. `life`: this replica's restarts, which
        the queue checks (`WorkQueue.take`)."""
        return self._run(self._from_queue(queue, k, life), inflight or self.engine.max_num_seqs, commit_interval_s,
                         shards, fence, group_bytes)

    def _run(self, work: Iterator[tuple[str, str, int] | None], inflight: int, commit_interval_s: float,
             shards: dict[str, int | None] | None, fence: int | None, group_bytes: int) -> dict:
        began = time.perf_counter()
        self.writer = PredictionWriter(self.root,
                                       extra={"model_id": self.model_id, "replica": self.name, "node": self.node},
                                       interval_s=commit_interval_s, fence=fence, replica=self.record)
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

    def _from_queue(self, queue: Any, k: int, life: int = 0) -> Iterator[tuple | None]:
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
            got = ray.get(queue.take.remote(k, 1, finished, given_back=given_back, progress=self.engine.progress(),
                                            life=life))
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
