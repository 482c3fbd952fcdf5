"""Driving a pool's replicas: each set running on its work, waited on, and started again when it dies, by one of
the two dispatch modes (`cluster.dispatch`): a fixed list each (`StaticDriver`), or one `WorkQueue` actor every
replica takes from (`QueueDriver`).

A replica whose engine dies (vLLM's EngineDeadError, the actor killed, its node lost) is started again on the
prompts it had not finished, up to `cluster.engine_restarts` times; then those prompts are recorded as engine
errors, counted, and retried by the next run.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import time
from typing import Any

from longeval.cluster import interrupt
from longeval.config import Config
from longeval.records import ErrorKind, Prediction, prediction_table
from longeval.stages.infer.dispatch import Work, WorkQueue, group_by_context, reads
from longeval.stages.infer.failures import cause_of, stop_on_fatal
from longeval.stages.infer.pending import final_ids
from longeval.stages.infer.placement import PoolReplicas
from longeval.stages.infer.writer import lost_marker
from longeval.store.lease import held_generation
from longeval.store.row_group_reads import PROMPT_GROUP_BYTES

__all__ = ["PoolDriver", "QueueDriver", "StaticDriver"]

log = logging.getLogger(__package__)  # the stage's one logger: its lines read `longeval.stages.infer`, as before


class PoolDriver(abc.ABC):
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
        """The root's lease generation this driver holds, for its replicas' writers (`PredictionWriter`)."""
        self.failures: dict[int, int] = {}
        self.parts: list[str] = []
        """The prediction parts the replicas' finished runs committed (as they reported them)."""
        self.died = False
        """Whether a run died: its replica's parts are then known only to a listing."""
        self.done_rows = 0
        """Rows finished by runs that ended (returned, or died: those their replica committed)."""
        self.stats: dict[str, dict] = {}
        self.deaths: list[dict[str, Any]] = []
        """Each replica death, for the dispatch record (`_death`)."""
        self.first: set[int] = set()
        """The first replicas still starting: those ready wait in `waiting` until none is left, so the pool's
        replicas start on its work together (one that loads faster would otherwise take a share of the others')."""
        self.waiting: dict[int, Any] = {}

    @abc.abstractmethod
    def start(self) -> None:
        """List the pool's work and set its first replicas running."""

    @abc.abstractmethod
    def _launch_one(self, k: int, actor: Any) -> Any:
        """Set replica `k` (its actor `actor`) running on its work; the object ref of that `run` call."""

    @abc.abstractmethod
    def _replica_died(self, k: int, exc: BaseException) -> None:
        """Make replica `k`'s unfinished work someone's again after its run failed with `exc`."""

    def _start_first(self, ks: list[int]) -> None:
        """The pool's first replicas, all engines loading at once; they start on the work together."""
        self.first = set(ks) - self.replicas.actors.keys()
        self._launch(ks)

    def _launch(self, ks: list[int]) -> None:
        """Set replicas `ks` running: a live one at once, the others once started (`wait` polls them)."""
        for k in ks:
            if k in self.replicas.actors:
                self.runs[self._launch_one(k, self.replicas.actors[k])] = k
        self.replicas.begin([k for k in ks if k not in self.replicas.actors])

    def running(self) -> bool:
        """Whether any replica runs, or starts with work left for it; starting ones nobody needs are stopped."""
        if self.runs or self.waiting or (self.replicas.starting and self._work_for_starting()):
            return True
        self.replicas.cancel()
        return False

    @abc.abstractmethod
    def _work_for_starting(self) -> bool:
        """Whether prompts are left that a starting replica would run."""

    def wait(self, timeout_s: float) -> None:
        """Up to `timeout_s` for a run to end or a replica to finish starting; handles what did."""
        import ray

        ready = []
        if self.runs:
            ready, _ = ray.wait(list(self.runs), num_returns=1, timeout=timeout_s)
        for ref in ready:
            k = self.runs.pop(ref)
            try:
                stats = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._died(k, exc)
                continue
            self.parts += stats.pop("parts", [])
            self.stats[self.replicas.name(k)] = stats
            self.done_rows += stats["rows"]
            self._run_ended(k)
        started, failed = self.replicas.poll(0.0 if self.runs else timeout_s)
        self.waiting.update(started)
        for k, exc in failed.items():
            self._died(k, exc)
        if not self.first & self.replicas.starting.keys():  # the first replicas all started (or died starting)
            self.first = set()
            for k, actor in self.waiting.items():
                self.runs[self._launch_one(k, actor)] = k
            self.waiting = {}
        self._unplaced()

    def _died(self, k: int, exc: BaseException) -> None:
        """Replica `k` died (running, or starting): recorded with its node, stopped, and its work passed on."""
        stop_on_fatal(exc)  # a restart would only fill the same disk again, or write a root taken over
        interrupt.check()  # engines in the terminal's process group die of the same Ctrl-C: no restart
        self.died = True
        self.first.discard(k)  # its restart does not hold the others back
        death = self._death(k, exc)
        self.deaths.append(death)
        cut_off = not death["node_alive"] and bool(death["record"])  # it may live on: marked before its prompts move
        if cut_off:
            self.root.write_json(lost_marker(death["record"]), death)
        self.replicas.replace(k)
        self._replica_died(k, exc)
        if cut_off:  # a part it began before the mark may still land: its rows of these prompts give way
            self.root.write_json(lost_marker(death["record"]), death)  # now with what went to others
            self.replicas.engines.given_away.update((death["replica"], i) for i in death.get("unfinished", []))

    def _death(self, k: int, exc: BaseException) -> dict[str, Any]:
        """What the run's dispatch record keeps of a replica's death: which one, on which node (its address, and
        whether Ray still had the node alive then), when, and of what."""
        import ray

        node = self.replicas.nodes.get(k, "")
        seen = {n["NodeID"]: n for n in ray.nodes()}.get(node, {})
        record = self.replicas.records.pop(k, "")  # this life's; none for one that died starting
        return {"replica": self.replicas.life(k), "record": record, "restarts": self.replicas.restarts.get(k, 0),
                "node": node,
                "address": seen.get("NodeManagerAddress", ""), "node_alive": bool(seen.get("Alive", False)),
                "at": round(time.time(), 3), "cause": cause_of(exc)}

    def _unplaced(self) -> None:
        """A replica Ray cannot place (its node gone, no room elsewhere) waits beside those that run; with none
        running, the pool waits `cluster.placement_timeout_s` for room (an autoscaler's node), then fails."""
        waited = self.replicas.unplaced()
        timeout = self.cfg.cluster.placement_timeout_s
        if waited and not self.runs and not (self.replicas.starting.keys() - waited.keys()) \
                and min(waited.values()) > timeout:
            raise self.replicas.placement_error(sorted(waited))

    def _run_ended(self, k: int) -> None:  # noqa: B027 (a hook: static dispatch has nothing to do)
        """Replica `k` finished what it was given."""

    def _give_up(self, k: int, exc: BaseException, left: list[Work]) -> bool:
        """Count replica `k`'s failure; True (and `left` recorded as engine errors) once it failed too often."""
        self.failures[k] = self.failures.get(k, 0) + 1
        name = self.replicas.name(k)
        if self.failures[k] <= self.cfg.cluster.engine_restarts:
            where = self.deaths[-1]["address"] if self.deaths else ""
            log.warning("%s died%s (%s); starting it again where Ray can place it, %d of its prompts unfinished", name,
                        f" with its node at {where}" if where and not self.deaths[-1]["node_alive"] else
                        (f" on {where}" if where else ""), cause_of(exc), len(left))
            return False
        log.error("%s failed %d times; its %d unfinished prompts are recorded as engine errors (a rerun retries "
                  "them): %s", name, self.failures[k], len(left), cause_of(exc))
        error = ErrorKind.ENGINE_ERROR.format(f"{name} failed {self.failures[k]} times: {cause_of(exc)}")
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

    def close(self) -> None:
        """Free what the driver holds besides the replicas, and write the pool's dispatch record."""
        record = self._record()
        if record is not None:
            name = f"dispatch/{self.replicas.pool.name}.json"
            earlier = (self.root.json_if_exists(name) or {}).get("deaths", [])  # an earlier call's, in this root
            self.root.write_json(name, {"pool": self.replicas.pool.name, "dispatch": self.cfg.cluster.dispatch.value,
                                        **record, "deaths": [*earlier, *self.deaths]})

    @abc.abstractmethod
    def _record(self) -> dict[str, Any] | None:
        """The dispatch mode's part of the pool's dispatch record; None: no record (nothing happened worth one)."""


class StaticDriver(PoolDriver):
    """Static dispatch: each replica runs a fixed list; a restarted one runs what is left of its own list, or, when
    Ray cannot place it again (its node lost), a replica that finished its own list runs it (`MOVE_AFTER_S`)."""

    MOVE_AFTER_S = 10.0
    """How long a restarting replica's placement group may wait before an idle replica takes its list: a group
    whose node is alive is placed again at once; one that waits this long had its node lost, with no room left
    elsewhere."""

    def __init__(self, cfg: Config, replicas: PoolReplicas, work: list[list[Work]]) -> None:
        super().__init__(cfg, replicas)
        self.work = {k: w for k, w in enumerate(work) if w}
        self.moved: list[dict[str, Any]] = []
        """Lists moved from a replica Ray could not place to one that had finished its own."""

    def _work_for_starting(self) -> bool:
        return any(self.work.get(k) for k in self.replicas.starting)

    def _unplaced(self) -> None:
        busy = set(self.runs.values())
        idle = [j for j in self.replicas.actors if j not in busy and j not in self.waiting]
        for k, waited in sorted(self.replicas.unplaced().items()):
            if not idle or waited < self.MOVE_AFTER_S or not self.work.get(k):
                continue
            j = idle.pop(0)
            log.warning("%s cannot be placed again (waited %.0f s); %s, done with its own list, runs its %d prompts",
                        self.replicas.name(k), waited, self.replicas.name(j), len(self.work[k]))
            self.moved.append({"from": self.replicas.name(k), "to": self.replicas.name(j),
                               "prompts": [w.instance_id for w in self.work[k]], "at": round(time.time(), 3)})
            self.work[j], self.work[k] = self.work[k], []
            self.replicas.cancel([k])
            self._launch([j])
        super()._unplaced()

    def _record(self) -> dict[str, Any] | None:
        if not (self.deaths or self.moved):
            return None
        return {"replicas": {k: self.replicas.name(k) for k in sorted(self.work)}, "moved": self.moved}

    def start(self) -> None:
        self._start_first(list(self.work))

    def _launch_one(self, k: int, actor: Any) -> Any:
        return actor.run.remote(reads(self.work[k]), self.cfg.cluster.inflight,
                                self.cfg.cluster.commit_interval_s, self.shards, self.fence, self.group_bytes)

    def _replica_died(self, k: int, exc: BaseException) -> None:
        done = final_ids(self.root)
        left = [w for w in self.work[k] if w.instance_id not in done]
        self.done_rows += len(self.work[k]) - len(left)
        self.work[k] = left
        self.deaths[-1]["unfinished"] = [w.instance_id for w in left]
        if left and not self._give_up(k, exc, left):
            self._launch([k])


class QueueDriver(PoolDriver):
    """Dynamic dispatch: every replica takes from one `WorkQueue` actor. A dead replica's unfinished prompts go
    back to the queue at once, for the others to take while it starts again; a replica that ran out of work is
    set running again when work comes back."""

    def __init__(self, cfg: Config, replicas: PoolReplicas, rows: list[Work]) -> None:
        import ray

        super().__init__(cfg, replicas)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ks = list(range(min(replicas.pool.replicas, len(group_by_context(rows)))))
        # On the driver's node: the queue lives as long as the run does, not as long as some worker host. A hard
        # affinity (a 0-CPU actor fits any node, the head with 0 CPUs too): on three hosts a soft one put it on a
        # worker host, and the run died with that host.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = ray.remote(WorkQueue).options(num_cpus=0, scheduling_strategy=here).remote(rows, len(self.ks))
        self.idle: set[int] = set()
        """Live replicas whose run ended because the queue was empty."""

    def start(self) -> None:
        self._start_first(self.ks)

    def _work_for_starting(self) -> bool:
        import ray

        return bool(ray.get(self.queue.remaining.remote()))

    def _launch_one(self, k: int, actor: Any) -> Any:
        self.idle.discard(k)
        return actor.run_queue.remote(self.queue, k, self.cfg.cluster.inflight, self.cfg.cluster.commit_interval_s,
                                      self.shards, self.fence, self.group_bytes, self.replicas.restarts.get(k, 0))

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
        left, finished = ray.get(self.queue.give_back.remote(k, done, requeue, self.replicas.restarts.get(k, 0)))
        self.done_rows += finished
        self.deaths[-1].update(unfinished=[w.instance_id for w in left], back_to_queue=requeue)
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

    def _record(self) -> dict[str, Any] | None:
        import ray

        try:  # a record for reading a straggler or a lost node, not a result
            events = ray.get(self.queue.events.remote(), timeout=30)
        except ray.exceptions.RayError:
            events = None
        return {"replicas": {k: self.replicas.name(k) for k in self.ks}, "events": events}

    def close(self) -> None:
        import ray

        super().close()
        ray.kill(self.queue, no_restart=True)
