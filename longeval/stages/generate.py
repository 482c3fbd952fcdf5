"""The generate stage: shard specs in, instance shards out, on a Ray Data actor pool (tasks are pure; this is
their edge to Ray and the store)."""

from __future__ import annotations

import logging
import math
import socket
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pyarrow as pa

from longeval.cluster import interrupt
from longeval.cluster.ray_runtime import check_shards_seen, map_pool, run_key
from longeval.config import Config
from longeval.errors import DiskFullError
from longeval.heap import release_freed_memory
from longeval.planning.plan import Plan, ShardSpec
from longeval.planning.sizing import figures_for
from longeval.records import INSTANCE_SCHEMA
from longeval.scoring.deadline import import_plugins
from longeval.stages.instance_cache import InstanceCache, cache_uri, shard_key
from longeval.store.run_root import RunRoot
from longeval.tasks import get_task
from longeval.tasks.base import DataPaths, GenContext, context_rng, instance_rng, make_instance, output_budget
from longeval.text.render import prompt_format
from longeval.text.tokenizer import load_encoder

log = logging.getLogger(__name__)


class ShardGenerator:
    """Shard specs in, one written instance shard each out; `generate_shards` keeps one per worker process, so the
    tokenizer and encoded corpora are built once for all the shards that process generates."""

    def __init__(self, cfg: Config, model_path: str, root_uri: str) -> None:
        self.root = RunRoot(root_uri)
        self.ctx = make_context(cfg, model_path)
        self.cache = (InstanceCache(cache_uri(cfg.store.root, cfg.store.instance_cache))
                      if cfg.store.cache_instances else None)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        try:
            return self._generate(batch)
        except DiskFullError as exc:
            # Returned as data, not raised: Ray Data would log its traceback, wrap it and append retry advice to
            # its message; the driver raises it as the run's one line.
            return {"shard": [""], "instances": [0], "cached": [False], "disk_full": [str(exc)]}

    def _generate(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        names, counts, cached = [], [], []
        for i in range(len(batch["task"])):
            spec = ShardSpec(**{k: _py(batch[k][i]) for k in ShardSpec.__dataclass_fields__})
            key = shard_key(self.ctx, spec) if self.cache else None
            # A hit copies the cached file into the run root, a miss writes the run root once and copies that
            # file into the cache: a shard is encoded once, whichever way it came.
            copied = self.cache.fetch(key, self.root, spec.name) if self.cache else None
            if copied is not None:
                rows = copied.rows
            else:
                table = generate_shard(self.ctx, spec)
                self.root.write_table("instances", spec.name, table)
                if self.cache:
                    self.cache.put(key, self.root, spec.name)
                rows = table.num_rows
                del table
                # The shard's rows were Python objects (27 B a token for ten 1M-token prompts): what they freed
                # goes back, or the actor keeps each shard's peak on top of the next one's.
                release_freed_memory()
            names.append(spec.name)
            counts.append(rows)
            cached.append(copied is not None)
        return {"shard": names, "instances": counts, "cached": cached, "disk_full": [""] * len(names)}


def generate_shards(batch: dict[str, np.ndarray], *, cfg: Config, model_path: str,
                    root_uri: str) -> dict[str, list]:
    """Ray Data task: the batch's shards, by this process's `ShardGenerator` for the run.

    A task, not a pool actor: Ray keeps its worker processes between tasks, so a worker that generated one run's
    shards has its imports and tokenizer warm for the next run of the same Ray (an adaptive round, a rerun, a
    second suite of one driver), where a new actor paid them again (2-3 CPU-s). The generator is kept for the
    run it was built for (its config, model and root) and replaced by the next run's."""
    key = run_key(cfg, model_path, root_uri)
    if _KEPT.get("key") != key:
        _KEPT.update(key=key, generator=ShardGenerator(cfg, model_path, root_uri))
    out = _KEPT["generator"](batch)
    return {**out, "host": [socket.gethostname()] * len(out["shard"])}


_KEPT: dict[str, Any] = {}
"""This process's generator and the run it serves (`generate_shards`)."""


def kept_generator() -> ShardGenerator | None:
    """The generator this process keeps for its run's next shards, if any."""
    return _KEPT.get("generator")


def release_kept() -> None:
    """Forget the kept generator (its tokenizer and corpora go with it)."""
    _KEPT.clear()


def make_context(cfg: Config, model_path: str):
    """The generation context for a run: the model's tokenizer, the prompt format, the data paths (and the
    `plugins`, imported here too, so tasks they register exist in every generation actor)."""
    import_plugins(cfg.plugins)
    return GenContext(encoder=load_encoder(model_path), fmt=prompt_format(cfg.model),
                      data=DataPaths(**asdict(cfg.suite.data)), task_overrides=dict(cfg.suite.params))


def _py(value):
    return value.item() if hasattr(value, "item") else value


def generate_shard(ctx, spec: ShardSpec) -> pa.Table:
    """The shard's instances (`spec.indices()`) of one task and length: pure, and the same with any sharding."""
    task = get_task(spec.task, ctx.task_overrides)
    rows = []
    for index in spec.indices():
        rng = instance_rng(spec.seed, task.key, spec.target_length, index)
        shared = {"context_rng": context_rng(spec.seed, task.context_group, spec.target_length, index)} \
            if task.context_group else {}
        draft = task.generate(
            ctx, task.params, target_length=spec.target_length,
            max_new_tokens=output_budget(task, ctx.fmt, spec.target_length), rng=rng, index=index, **shared,
        )
        rows.append(make_instance(task, draft, ctx, target_length=spec.target_length, seed=spec.seed,
                                  shard_index=spec.shard_index, index=index).to_row())
    return pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA)


ACTOR_WORTH_CPU_S = 10.0
"""Estimated generation CPU-seconds that are worth one more generation worker: starting one (Ray's worker, imports,
the tokenizer) costs 2-3 CPU-s, more than a small suite's whole generation (a RULER instance of 1K-8K tokens takes
1-20 ms, RULER's cwe at 128K 34 ms: planning/sizing_figures.json)."""


def generation_cpu_s(shards: list[ShardSpec]) -> float:
    """The shards' generation CPU-seconds as `longeval plan` estimates them (measured per task and length, each
    shard's cell warm-up included: an upper bound)."""
    total = 0.0
    for shard in shards:
        figures = figures_for(shard.task)
        total += (shard.stop - shard.start) * figures.cpu(shard.target_length) + figures.warmup(shard.target_length)
    return total


def generation_actors(cfg: Config, shards: list[ShardSpec]) -> int:
    """Generation actors for these shards: `cluster.generate_parallelism`, but no more than one a shard and one
    per `ACTOR_WORTH_CPU_S` of estimated work."""
    worth = math.ceil(generation_cpu_s(shards) / ACTOR_WORTH_CPU_S)
    return max(1, min(cfg.cluster.generate_parallelism, len(shards), worth))


def generate(cfg: Config, plan: Plan, root: RunRoot, model_path: str, progress=None) -> int:
    """Write every missing instance shard; returns how many were written."""
    import ray

    done = root.shard_names("instances")
    todo = [s for s in plan.shards if s.name not in done]
    if not todo:
        return 0
    if len(todo) < len(plan.shards):
        log.warning("resuming: %d of %d instance shards already written, %d to generate",
                    len(plan.shards) - len(todo), len(plan.shards), len(todo))
    size = generation_actors(cfg, todo)
    if size < min(cfg.cluster.generate_parallelism, len(todo)):
        log.info("generating %d shards, %d at a time: about %.1f CPU-s of work (cluster.generate_parallelism=%d)",
                 len(todo), size, generation_cpu_s(todo), cfg.cluster.generate_parallelism)
    ds = map_pool(
        ray.data.from_items([s.to_row() for s in todo]), generate_shards,
        fn_kwargs={"cfg": cfg, "model_path": model_path, "root_uri": root.uri},
        batch_size=1, compute=ray.data.TaskPoolStrategy(size=size), num_cpus=1,
    )
    task_id = progress.add_task("generate shards", total=len(todo)) if progress else None
    written = hits = 0
    hosts: dict[str, str] = {}
    with root.written_elsewhere("instances"):  # by the generation workers
        for batch in ds.iter_batches(batch_size=1, batch_format="numpy"):
            interrupt.check()
            full = [str(message) for message in batch["disk_full"] if message]
            if full:
                raise DiskFullError(full[0])
            hosts.update(zip(map(str, batch["shard"]), map(str, batch["host"]), strict=True))
            written += len(batch["shard"])
            hits += int(np.sum(batch["cached"]))
            if progress:
                progress.advance(task_id, len(batch["shard"]))
                if hits:
                    progress.update(task_id, description=f"generate shards ({hits} from cache)")
    if hits:
        log.info("%d of %d instance shards came from the instance cache", hits, written)
    if cfg.store.shared_filesystem and root.local_path() is not None:
        check_shards_seen(root, "instances", hosts)
    return written


PREFLIGHT_MAX_LENGTH = 131_072
"""The longest instance `preflight` builds on the driver."""


def preflight(cfg: Config, plan: Plan, model_path: str) -> None:
    """Generate the first instance of every task at its shortest length on the driver, before any Ray work.

    Bad data files, lengths too short for a template and similar mistakes then fail in a second with
    their own message, instead of inside a Ray actor after the cluster has spun up. The length is capped at
    `PREFLIGHT_MAX_LENGTH` (128K): a suite that starts at 1M would otherwise build a 1M-token instance of every
    task on the driver, whose memory must not grow with the suite's lengths (issue #22). The mistakes it
    catches show at 128K as well; longer instances are built by the generation actors only. A run whose every
    planned shard is there already (a rerun, a resume after inference) skips it: nothing is generated, and the
    driver does not load the tokenizer, Punkt and the data files for it (about 200 MB).
    """
    ctx = make_context(cfg, model_path)
    firsts: dict[str, ShardSpec] = {}
    for shard in sorted(plan.shards, key=lambda s: s.target_length):
        firsts.setdefault(shard.task, shard)
    for shard in firsts.values():
        one = replace(shard, target_length=min(shard.target_length, PREFLIGHT_MAX_LENGTH), stop=shard.start + 1)
        generate_shard(ctx, one)
