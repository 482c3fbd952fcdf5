"""Placing a pool's replicas: a placement group each (one bundle per tensor-parallel rank on GPUs, so Ray places
and sees every rank), the pools kept live across calls (`Engines`), and room made for a pool that needs it."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from longeval.config import Config
from longeval.errors import LongevalError
from longeval.planning.plan import Pool, suite_seq_tokens
from longeval.planning.plan import size_pool as plan_size_pool
from longeval.stages.infer.failures import cause_of, stop_on_fatal
from longeval.stages.infer.replica import Replica
from longeval.store.run_root import RunRoot

__all__ = ["RESERVE_CPUS", "Engines", "PoolReplicas", "Starting", "actor_options", "bundles", "has_room",
           "kept_engines", "release_engines", "size_pool"]

log = logging.getLogger(__package__)  # the stage's one logger: its lines read `longeval.stages.infer`, as before


def size_pool(cfg: Config, pool: Pool, instances: pa.Table) -> Pool:
    """The pool with its engine settings sized for this pool's prompts (all of them, not only those left, so a
    resumed run gets the same engines as an uninterrupted one)."""
    seq_tokens = pc.add(instances["input_tokens"], instances["max_new_tokens"]).to_pylist()
    return plan_size_pool(cfg, pool, seq_tokens)


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


def _connection() -> tuple[str, str] | None:
    """This driver's connection to Ray (its job and node ids; a new Ray reuses job ids), None without one."""
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


_KEPT: list[PoolReplicas] = []
"""Pools whose run ended with `cluster.keep_engines`, oldest first: their replicas idle in this process's Ray for
the next run whose pool has the same settings."""


def kept_engines() -> int:
    """Engine replicas this process keeps for its next runs (`cluster.keep_engines`)."""
    return sum(len(kept.actors) for kept in _KEPT)


def release_engines() -> int:
    """Stop the engines kept for later runs (`cluster.keep_engines`); returns how many. A notebook calls it to give
    the GPUs back; the process's exit, or `ray.shutdown()`, ends them too."""
    stopped = 0
    while _KEPT:
        kept = _KEPT.pop(0)
        stopped += len(kept.actors)
        kept.close()
    return stopped


def _adopt_kept(engines: Engines, pool: Pool) -> PoolReplicas | None:
    """A kept pool of an earlier run whose engines are what `pool` would start (the same model settings with the
    pool's overrides, model path, replicas and placement, whatever lengths it serves), now serving `engines`' run
    as `pool`; None when there is none or its Ray is gone."""
    model = replace(engines.cfg.model, **pool.engine_overrides(engines.cfg.model))
    for kept in list(_KEPT):
        if (kept.model == model and kept.engines.model_path == engines.model_path
                and (kept.pool.replicas, bundles(kept.pool)) == (pool.replicas, bundles(pool))):
            _KEPT.remove(kept)
            if kept.adopt(engines, pool):
                return kept
    return None


class Engines:
    """The infer stage's live engine replicas, per pool, kept until `close`.

    An adaptive run keeps one `Engines` for all its rounds, so a round reuses warm engines instead of paying
    the engine start (minutes for a large model on GPUs) again; a plain run keeps them for one `infer` call
    (its follow-up calls). A pool is reused while its sized settings stay the same, so an adaptive run sizes
    pools from the suite's plan (`planned=True`), which does not grow round by round. A pool whose placement
    needs room another live pool holds stops that one first (least recently used), and `RESERVE_CPUS` stay free.

    With `cluster.keep_engines`, `close` keeps the replicas running for the next run in this process (a notebook,
    a sweep of suites), which takes them over when its pool's settings are the same; a pool that needs their room
    stops them first, and `release_engines` stops them all.
    """

    def __init__(self, cfg: Config, root: RunRoot, model_path: str, *, planned: bool = False) -> None:
        self.cfg, self.root, self.model_path, self.planned = cfg, root, model_path, planned
        self.live: OrderedDict[str, PoolReplicas] = OrderedDict()
        self.started = 0
        """Engines started in this object's life (restarts included)."""
        self.given_away: set[tuple[str, str]] = set()
        """(replica, instance id): prompts of replicas declared lost, given to others (`PoolDriver._died`); what
        such a replica commits of them late gives way when the stage merges its predictions."""

    def size(self, pool: Pool, instances: pa.Table) -> Pool:
        """The pool sized for its sequences: the suite's planned ones (`planned`) or the instances on disk."""
        if self.planned:
            return plan_size_pool(self.cfg, pool, suite_seq_tokens(self.cfg, pool))
        return size_pool(self.cfg, pool, instances)

    def replicas(self, pool: Pool) -> PoolReplicas:
        """The live replicas of `pool`, or a new set when it has none or its settings changed."""
        live = self.live.pop(pool.name, None)
        if live is None and self.cfg.cluster.keep_engines:
            live = _adopt_kept(self, pool)
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

        total, need = ray.cluster_resources(), PoolReplicas.needs(pool)
        while _KEPT and not has_room(total, [r.resources() for r in [*_KEPT, *self.live.values()]], need):
            kept = _KEPT.pop(0)
            log.info("stopping %d engine(s) kept from an earlier run to make room for %s", len(kept.actors), pool.name)
            kept.close()
        while self.live and not has_room(total, [r.resources() for r in self.live.values()], need):
            name, oldest = self.live.popitem(last=False)
            log.info("stopping %s's engines to make room for %s", name, pool.name)
            oldest.close()

    def close(self) -> None:
        while self.live:
            _, replicas = self.live.popitem(last=False)
            if self.cfg.cluster.keep_engines and replicas.actors:
                _KEPT.append(replicas)
                log.info("keeping %s's %d engine(s) for the next run in this process (cluster.keep_engines)",
                         replicas.pool.name, len(replicas.actors))
            else:
                replicas.close()


@dataclass
class Starting:
    """A replica on its way up: its placement group's ready ref, then its actor and the actor's ready ref."""

    placed: Any
    since: float
    """When it began waiting (monotonic seconds)."""
    actor: Any = None
    ready: Any = None


class PoolReplicas:
    """A pool's replica actors, each in a placement group of its own, started on demand and kept until closed."""

    def __init__(self, engines: Engines, pool: Pool) -> None:
        self.engines, self.pool = engines, pool
        cfg = engines.cfg
        self.model = replace(cfg.model, **pool.engine_overrides(cfg.model))
        self.groups: dict[int, Any] = {}
        self.actors: dict[int, Any] = {}
        self.restarts: dict[int, int] = {}
        self.starting: dict[int, Starting] = {}
        """Replicas being started: waiting for their placement group, then for their engine."""
        self.nodes: dict[int, str] = {}
        """Each live (or last live) replica's Ray node id, from its engine record."""
        self.records: dict[int, str] = {}
        """Each live (or last live) replica's engine record (`Replica.record`), which names its life."""
        self.job: tuple[str, str] | None = None
        """The driver's connection to Ray its actors belong to (`_connection`): one kept past `ray.shutdown()` is
        gone with that Ray."""

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

    def life(self, k: int) -> str:
        """Replica `k`'s name in its current life: `pool0/r1`, then `pool0/r1#1` once started again."""
        restarts = self.restarts.get(k, 0)
        return self.name(k) + (f"#{restarts}" if restarts else "")

    def begin(self, ks: list[int]) -> None:
        """Start replicas `ks` (those not live or starting) without waiting: each waits for its placement group,
        then loads its engine; `poll` says which are ready. The driver goes on meanwhile, so a replica whose node
        was lost does not hold up the others while Ray cannot place it again."""
        from ray.util import placement_group

        self.job = _connection()
        for k in ks:
            if k in self.actors or k in self.starting:
                continue
            if k not in self.groups:
                spec, strategy = bundles(self.pool)
                self.groups[k] = placement_group(spec, strategy=strategy,
                                                 name=f"longeval-{self.name(k)}-{os.getpid()}")
            self.starting[k] = Starting(self.groups[k].ready(), time.monotonic())

    def poll(self, timeout_s: float = 0.0) -> tuple[dict[int, Any], dict[int, BaseException]]:
        """The starting replicas that became ready (now live) and those that died starting, waiting up to
        `timeout_s` for the first of them. An engine whose own start raised (a model it cannot load) stops the run
        with that error; a replica that died of something else (its node lost, its process killed) is returned as
        failed, for the driver to treat as a dead replica."""
        import ray

        placed = [s.placed for s in self.starting.values() if s.actor is None]
        loading = [s.ready for s in self.starting.values() if s.ready is not None]
        if placed or loading:
            ray.wait([*placed, *loading], num_returns=1, timeout=timeout_s)
        ready: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        for k, starting in list(self.starting.items()):
            if starting.actor is None:
                if not ray.wait([starting.placed], timeout=0)[0]:
                    continue
                starting.actor = self._create(k)
                starting.ready = starting.actor.ready.remote()
            if not ray.wait([starting.ready], timeout=0)[0]:
                continue
            del self.starting[k]
            try:
                info = ray.get(starting.ready)
            except ray.exceptions.RayError as exc:
                ray.kill(starting.actor, no_restart=True)
                stop_on_fatal(exc)  # the replica's first write found the disk full: not the engine's fault
                if getattr(exc, "actor_init_failed", False):
                    self.cancel()
                    raise LongevalError(f"the engine of {self.name(k)} failed to start: {cause_of(exc)}") from exc
                failed[k] = exc
                continue
            self.actors[k] = starting.actor
            self.nodes[k] = info.get("node", "")
            self.records[k] = info.get("record", "")
            ready[k] = starting.actor
        return ready, failed

    def _create(self, k: int) -> Any:
        import ray

        cfg = self.engines.cfg
        self.engines.started += 1
        return ray.remote(Replica).options(**actor_options(self.pool, self.groups[k])).remote(
            self.model, self.engines.model_path, cfg.model.name, self.pool.max_model_len, self.engines.root.uri,
            self.life(k), tuple(cfg.public_keys))

    def unplaced(self) -> dict[int, float]:
        """Starting replicas still waiting for their placement group, with how long they have waited (s)."""
        now = time.monotonic()
        return {k: now - s.since for k, s in self.starting.items() if s.actor is None}

    def placement_error(self, ks: list[int]) -> LongevalError:
        import ray

        spec, _ = bundles(self.pool)
        timeout = self.engines.cfg.cluster.placement_timeout_s
        return LongevalError(
            f"{self.pool.name}: {len(ks)} replica(s) could not be placed within {timeout:.0f} s; each needs {spec}, "
            f"the cluster has {ray.available_resources()} free. Lower cluster.replicas or "
            "model.tensor_parallel_size, add nodes, or raise cluster.placement_timeout_s while an autoscaler adds "
            "them")

    def cancel(self, ks: list[int] | None = None) -> None:
        """Stop starting replicas `ks` (all by default): their engines, and their placement groups when not yet
        placed (a group left waiting would take a returning node's resources for nothing)."""
        import ray

        for k in list(self.starting) if ks is None else ks:
            starting = self.starting.pop(k, None)
            if starting is None:
                continue
            if starting.actor is not None:
                ray.kill(starting.actor, no_restart=True)
            else:
                ray.util.remove_placement_group(self.groups.pop(k))

    def replace(self, k: int) -> None:
        """Stop replica `k` (dead or dying); the next `start` starts it again in the same placement group."""
        import ray

        actor = self.actors.pop(k, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)
        self.restarts[k] = self.restarts.get(k, 0) + 1

    def adopt(self, engines: Engines, pool: Pool) -> bool:
        """Serve `engines`' run as its `pool` with these live replicas (kept by an earlier run): each writes its
        record in the new run root. False, with nothing left running, when Ray was shut down since; a replica that
        died meanwhile is started again by the next `start`."""
        import ray

        if _connection() != self.job:
            self.actors.clear()  # their Ray is gone, and its actors with it
            self.groups.clear()
            self.starting.clear()
            return False
        self.engines, self.pool = engines, pool
        self.restarts = {}  # a new run gets its own `cluster.engine_restarts`
        for k, actor in list(self.actors.items()):
            try:
                ray.get(actor.adopt.remote(engines.root.uri, self.name(k), tuple(engines.cfg.public_keys)))
            except ray.exceptions.RayError:
                self.replace(k)
        log.info("%s: %d engine(s) kept from an earlier run in this process, not started again", self.pool.name,
                 len(self.actors))
        return True

    def close(self) -> None:
        import ray

        if self.job is not None and _connection() != self.job:
            self.actors.clear()  # kept past a `ray.shutdown()`: nothing of theirs is left to stop
            self.groups.clear()
            self.starting.clear()
            return
        for starting in self.starting.values():
            if starting.actor is not None:
                ray.kill(starting.actor, no_restart=True)
        self.starting.clear()
        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        for group in self.groups.values():
            ray.util.remove_placement_group(group)
        self.actors.clear()
        self.groups.clear()
