"""The infer stage: every instance without a final prediction through its length bucket's engine pool.

A pool's replicas are Ray actors, each in a placement group of its own (`placement`). The driver splits the pool's
prompts over the replicas (`dispatch`: fair shares of tokens, prompts with one context on one replica) and hands
each replica its whole list, or lets each take from one work queue (`drivers`); the replica keeps its engine full
(`VllmEngine.stream`) and a writer thread commits finished predictions to the run root while the engine computes
(`replica`), so a kill -9 loses only the rows in flight.

Engines live for one `infer` call (its follow-up calls reuse them) or, kept in an `Engines` object, for
an adaptive run's rounds.

A replica whose engine dies (vLLM's EngineDeadError, the actor killed, its node lost) is started again on the
prompts it had not finished, up to `cluster.engine_restarts` times; then those prompts are recorded as engine
errors, counted, and retried by the next run. Models behind an HTTP API keep the Ray Data path
(`api.infer_api`): their actors only wait on the network.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from longeval.cluster import interrupt
from longeval.config import Config, Dispatch
from longeval.planning.plan import Plan, Pool, in_plan
from longeval.records import INSTANCE_SCHEMA, ErrorKind, Prediction, prediction_table
from longeval.run.asked import only_asked
from longeval.stages.followup import write_followups
from longeval.stages.infer.api import infer_api
from longeval.stages.infer.dispatch import OUTPUT_WEIGHT, Work, assign, cost_of, group_by_context
from longeval.stages.infer.drivers import QueueDriver, StaticDriver
from longeval.stages.infer.pending import pending_predictions
from longeval.stages.infer.placement import Engines, PoolReplicas
from longeval.store.compact import compact_predictions
from longeval.store.listings import Elsewhere
from longeval.store.row_group_reads import prompt_group_bytes
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName
from longeval.tasks import TASKS

__all__ = ["first_calls", "infer", "pool_shards", "record_too_long", "schedule"]

log = logging.getLogger(__package__)  # the stage's one logger: its lines read `longeval.stages.infer`, as before


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
    compact_predictions(root, given_away=engines.given_away)
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
                    ran += infer_api(cfg, pool, send, root, engines.model_path, progress)
                else:
                    ran += _infer_vllm(cfg, engines.replicas(pool), send, progress, wrote=replicas_wrote)
    return ran


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


def _infer_vllm(cfg: Config, replicas: PoolReplicas, send: pa.Table, progress, *,
                wrote: Elsewhere | None = None) -> int:
    """Run `send` on the pool's replicas; `wrote` learns the parts they committed (complete when none died: the
    driver then knows the predictions stage without listing it again)."""
    pool = replicas.pool
    rows = schedule(send)
    driver = QueueDriver(cfg, replicas, rows) if cfg.cluster.dispatch == Dispatch.dynamic else \
        StaticDriver(cfg, replicas, assign(rows, pool.replicas))
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
