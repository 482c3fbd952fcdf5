"""Which replica of a pool runs which prompt, and in what order: pure and deterministic.

Two aims pull together here. Every replica should get a fair share of the pool's work, or the pool finishes
when its busiest replica does. And prompts that share a context (SYNC's tasks on one graph, or any tasks with
a `context_group`) must reach the same replica, next to each other, so vLLM's prefix cache computes the
shared context once instead of once per replica.

So the unit of assignment is a context: all prompts with one `context_id`. Contexts go to replicas by
longest-processing-time-first on their cost (prompt tokens + output budget, an output token counted as
`OUTPUT_WEIGHT` prompt tokens: `cost_of`), the classic greedy that lands
within 4/3 of the best split, ties broken by replica number. Within a replica, prompts keep the order they
came in (the run's schedule), with each context's prompts moved together at its first appearance.

The same rows give the same assignment and order on every run, so the same batches reach each engine and,
with greedy decoding, outputs repeat exactly.

That is the static split (`cluster.dispatch=static`). It cannot help a replica that runs slower than the others
(another GPU type, a shared node, a restart): the others finish their lists and wait. So by default a pool's
prompts sit in one `WorkQueue` and each replica takes the next context whenever its engine has a free slot
(`cluster.dispatch=dynamic`): work goes to whichever replica is free, at the price of placement that depends
on timing (docs/architecture.md, "Dispatch"). A context a slower replica would finish last moves, with its answers
so far, to a faster one that would finish it sooner, when nothing is left to hand out or when it would otherwise
end after the rest of the pool (`WorkQueue._ask_back`).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from longeval.stages.infer.speeds import SpeedEstimates, clearly_faster

__all__ = ["AFFINITY_LOOKAHEAD", "AFFINITY_SLACK", "OPEN_SHARDS", "OUTPUT_WEIGHT", "TRACE_EVENTS", "Work", "WorkQueue",
           "assign", "cost_of", "group_by_context", "reads"]


@dataclass(frozen=True, slots=True)
class Work:
    """One prompt to place: its id, its context, its cost (`cost_of`), and the shard it is stored in."""

    instance_id: str
    context_id: str
    cost: int
    shard: str
    resumed: tuple[tuple[int, ...], str] | None = None
    """The answer so far (token ids, text) of a prompt another replica gave back part-way (`WorkQueue._ask_back`):
    the replica that takes it continues from there."""
    budget: int = 0
    """Its output budget (max new tokens), part of `cost`: what is left of it tells how long it may still run."""
    weight: int = 1
    """What each token of `budget` counts in `cost`, in prompt tokens (`OUTPUT_WEIGHT` from `cost_of`)."""

    @property
    def prompt_cost(self) -> int:
        """The part of `cost` that is its prompt (a prefill)."""
        return self.cost - self.weight * self.budget

    @property
    def tokens(self) -> int:
        """Prompt and output budget in tokens: how much KV cache and how many bytes it may take."""
        return self.prompt_cost + self.budget


OUTPUT_WEIGHT = 8
"""How many prompt tokens one output token counts as in a prompt's cost (`cost_of`). An engine prefills a prompt's
tokens many to a step but generates one token per answer per step: on this project's 2-core machine a replica
prefilled about 320 prompt tokens a second and generated about 48 (8 answers at 6 a second), and by the roofline
(`longeval.planning.cost`) an 8B model on an A100 spends 4 (4K prompts, full batch) to 37 (128K) times as long on an
output token as on a prompt token. Counted as one, every prompt of `benchmarks/dispatch.py` (1K, budgets 16 to 512) cost
about 1,024, longest-first went shard by shard, and whether the slowed replica started on all the 512-token answers
was chance (every run that missed its target did)."""


def cost_of(prompt_tokens: int, budget: int) -> int:
    """A prompt's cost for placing it: its tokens, each output token counted `OUTPUT_WEIGHT` times."""
    return prompt_tokens + OUTPUT_WEIGHT * budget


def group_by_context(rows: Sequence[Work]) -> list[list[Work]]:
    """Rows grouped by context, groups in the order of their first row, rows in their own order."""
    groups: dict[str, list[Work]] = {}
    for row in rows:
        groups.setdefault(row.context_id or row.instance_id, []).append(row)
    return list(groups.values())


def reads(rows: Sequence[Work]) -> list[tuple[str, str, int]]:
    """Each row as a replica reads it: `(instance_id, shard, how many shards its context's prompts lie in)`. A
    SYNC context spans its tasks' shards; the reader splits its read-ahead budget among them
    (`stages.infer.reader.PromptReader`)."""
    spans: dict[str, int] = {}
    for group in group_by_context(rows):
        spans[group[0].context_id or group[0].instance_id] = len({w.shard for w in group})
    return [(w.instance_id, w.shard, spans[w.context_id or w.instance_id]) for w in rows]


def assign(rows: Sequence[Work], replicas: int) -> list[list[Work]]:
    """Each replica's prompts, in engine order: contexts kept whole, cost (`cost_of`) balanced.

    Returns `replicas` lists (some empty only when there are fewer contexts than replicas).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    groups = group_by_context(rows)
    # Heaviest contexts first; equal costs keep the schedule's order, so the result does not depend on hashing.
    order = sorted(range(len(groups)), key=lambda g: (-sum(w.cost for w in groups[g]), g))
    load = [(0, r) for r in range(replicas)]  # (tokens so far, replica): the lightest replica is on top
    mine: list[list[int]] = [[] for _ in range(replicas)]
    for g in order:
        tokens, r = heapq.heappop(load)
        mine[r].append(g)
        heapq.heappush(load, (tokens + sum(w.cost for w in groups[g]), r))
    return [[w for g in sorted(gs) for w in groups[g]] for gs in mine]


TRACE_EVENTS = 512
"""How many of its latest decisions a `WorkQueue` keeps (`WorkQueue.events`): the end of a pool, where a slow
replica shows, in a bounded record whatever the pool's size."""

AFFINITY_SLACK = 0.1
"""How much cheaper than the first context in the queue another may be and still go first, for shard affinity
(`WorkQueue._pick`): within a (task, length) cell contexts cost about the same, so this keeps each pick among
the heaviest work while letting a replica stay on the shards it has open."""
AFFINITY_LOOKAHEAD = 256
"""How far down the queue `WorkQueue._pick` looks for a context from a shard no other replica has open (a context
from a shard the replica has open is found through `WorkQueue._waiting`, wherever it lies in the queue)."""
OPEN_SHARDS = 12
"""How many instance shards a replica's prompt reader keeps open (`stages.infer.reader.PromptReader`), the latest it
took prompts from: enough for a context several tasks share (each task's prompts sit in shards of its own). The
queue counts a shard as open for that long, so affinity never sends a replica back to a shard its reader has let go."""


class WorkQueue:
    """A pool's prompts, handed out a context at a time to whichever replica has room (dynamic dispatch).

    Contexts go out heaviest first, the order of longest-processing-time list scheduling: what is left when the
    queue runs dry is the cheapest work, so the last replica to finish is not the one that drew a long prompt at
    the end. A context's prompts go out together and in schedule order, so its replica's prefix cache computes
    the shared context once.

    The queue also keeps a replica from hoarding: a replica may hold at most its fair share of the cost not yet
    run unless it holds nothing (what its engine ran of a prompt it holds, by its progress, no longer counts: a
    slow replica whose last prompts were nearly done counted them whole, took nothing more, and ran out 17 s
    before the fast one in a benchmark run). Without that, the first engine to come up would take every prompt of a
    small pool into its own batches before the others asked. The share follows the replicas' measured speeds
    (cost run per second since each first asked, `speeds`) once every active replica has run something, else it
    is an even split: near the end a slower replica then holds less, and finishes when the others do, instead of
    holding half of what is left at half the speed.

    What a replica has started can still move: a replica may ask for the context a slower one would finish last
    (`_ask_back`) when nothing is left to hand out, or when that context would end the pool late; the slower one
    gives it back unfinished (`given_back`) with its answer so far, and it goes out first, to any other replica,
    which continues it.

    How fast each replica runs, and when a context would finish where, is measured and estimated apart
    (`speeds.SpeedEstimates`); the queue decides. It stays one class over the ~300-line guide because handing out,
    shares and moves all read and write the same books (what each replica holds and was handed, what is queued).

    Pure and single-threaded; the infer stage wraps it in a Ray actor that replicas call.

    `moves=False` keeps started work where it is (nothing is asked back): only to measure what moving saves.
    """

    def __init__(self, rows: Sequence[Work], replicas: int, *, moves: bool = True) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self._moves = moves
        self._active = set(range(replicas))
        """Replicas that may still take work (not retired)."""
        self._first_life = dict.fromkeys(range(replicas), 0)
        """Each replica's earliest life whose asks are answered (`give_back` raises it): a replica given up for
        dead whose host comes back would otherwise take work again, hold it as it dies for good, and keep the
        others waiting for it to be given back."""
        groups = group_by_context(rows)
        order = sorted(range(len(groups)), key=lambda g: (-sum(w.cost for w in groups[g]), g))
        self._queue: deque[list[Work]] = deque(groups[g] for g in order)
        self._position = {w.instance_id: g for g in order for w in groups[g]}
        """Each prompt's context's place in the schedule: shard by shard, rows in order."""
        self._queued_cost = sum(w.cost for w in rows)
        self._waiting: dict[str, list[list[Work]]] = {}
        """Each instance shard's queued contexts, in queue order: a replica's next context from the shards it has
        open is found here, not by scanning the queue. (A scan of its first `AFFINITY_LOOKAHEAD` contexts missed
        them once a length had thousands of contexts of about one cost: a replica opened 21 shards for 800 prompts
        and its reader kept every one's row groups.)"""
        for unit in self._queue:
            self._wait(unit, at_front=False)
        self._held: dict[int, dict[str, Work]] = {k: {} for k in range(replicas)}
        """What each replica took and has not reported finished, by instance id."""
        self._held_cost = dict.fromkeys(range(replicas), 0)
        self._handed: dict[int, list[Work]] = {k: [] for k in range(replicas)}
        """Everything each replica took in its current life (for `give_back`)."""
        self._opened: dict[int, dict[str, None]] = {k: {} for k in range(replicas)}
        """The last `OPEN_SHARDS` instance shards each replica took prompts from, oldest first (its reader has them
        open)."""
        self._readers: dict[str, set[int]] = {}
        """The other way round: which replicas have each shard open."""
        self._asked_back: dict[int, dict[str, None]] = {k: {} for k in range(replicas)}
        """Prompts each replica is asked to give back (`_ask_back`), until it gives them back or finishes them."""
        self._moved_ids: set[str] = set()
        """Prompts ever asked back: a prompt moves once at most, so two estimates can never send it to and fro."""
        self._moved: deque[tuple[list[Work], int | None]] = deque()
        """Contexts given back, with the replica that gave them (None: moves called off): the next to go out, to
        any other replica."""
        self._estimates = SpeedEstimates(replicas)
        """How fast each replica runs, from its asks and reports (`speeds`)."""
        self._started: float | None = None
        """The first ask's clock reading: the trace's zero."""
        self._trace: deque[dict] = deque(maxlen=TRACE_EVENTS)
        """The latest asks: when (s since the queue was made), who, what it reported finished and was given, what it
        held and its share (`_share`) then; the infer stage writes it beside the engine records."""

    def take(self, replica: int, room: int = 1, finished: Iterable[str] = (),
             now: float | None = None,
             given_back: Iterable[str] | Mapping[str, tuple[Sequence[int], str]] = (),
             progress: Mapping[str, int] | None = None, life: int = 0) -> list[Work] | None:
        """The next contexts for `replica`, at least one when it may take any, until `room` prompts.

        `finished`: ids it finished since it last asked (they no longer count as held); `given_back`: ids it was
        asked to give back (`reclaims`) and dropped unfinished, each with its answer so far (token ids, text) when a
        mapping; `progress`: the tokens generated so far by each prompt in its engine.
        Returns [] when the replica holds its fair share already (ask again once some of it finished), or holding
        nothing would finish the next context after the others finished everything, or work is on its way back
        from another replica (ask again in a while); None when nothing is left to hand out.
        `now`: the clock for the speeds (default `time.monotonic()`). `life`: which life of the replica asks (its
        restarts); a life given up for dead (`give_back`) gets None and changes nothing.
        """
        if life < self._first_life[replica]:
            return None
        now = time.monotonic() if now is None else now
        self._started = now if self._started is None else self._started
        self._estimates.asked(replica, now)
        held = self._held[replica]
        reported = 0
        for instance_id in finished:
            reported += 1
            self._asked_back[replica].pop(instance_id, None)
            work = held.pop(instance_id, None)
            self._estimates.finished(replica, instance_id, work, now)
            if work is not None:
                self._held_cost[replica] -= work.cost
        so_far = given_back if isinstance(given_back, Mapping) else dict.fromkeys(given_back, ((), ""))
        self._given_back(replica, so_far)
        self._estimates.progress(replica, progress or {}, held, now)
        speeds = self.speeds(now)
        share = self._share(replica, speeds)
        out = self._moved_to(replica, room, now)
        unrun = self._unrun(replica)
        while self._queue and (not out or len(out) < room):
            at = self._pick(replica)
            unit = self._queue[at]
            cost = sum(w.cost for w in unit)
            if held and unrun + cost > share:
                break
            if not held and self._sooner_elsewhere(replica, cost, speeds):
                break
            del self._queue[at]
            for shard in {w.shard for w in unit}:
                units = self._waiting[shard]
                del units[next(i for i, u in enumerate(units) if u is unit)]
            self._hand(replica, unit, now)
            unrun += cost
            out += unit
        event = {"t": round(now - self._started, 3), "replica": replica, "finished": reported,
                 "took": len(out), "took_cost": sum(w.cost for w in out), "held_cost": self._held_cost[replica],
                 "share": round(share), "queued": len(self._queue),
                 "speeds": speeds and {k: round(v, 1) for k, v in sorted(speeds.items())}}
        if so_far:
            event["given_back"] = len(so_far)
        if (rates := self._estimates.decode_rates()) is not None:
            event["decode"] = rates
        if resumed := sum(len(w.resumed[0]) for w in out if w.resumed):
            event["resumed_tokens"] = resumed  # generated before it moved: not run again
        if asked := self._ask_early(replica, now, speeds):
            event["asked_back"] = asked
        if not out and not self._queue:
            asked = self._ask_back(replica, now)
            if not (asked or self._moved or any(self._asked_back.values()) or self._may_move_to(replica)):
                self._trace.append({**event, "took": None})
                return None
            event["asked_back"] = asked
        if out or reported or so_far or event.get("asked_back"):  # not every ask of one waiting
            self._trace.append(event)
        return out

    def _hand(self, replica: int, unit: list[Work], now: float) -> None:
        cost = sum(w.cost for w in unit)
        self._estimates.handed(unit, now)
        self._open(replica, sorted({w.shard for w in unit}))
        self._queued_cost -= cost
        self._held_cost[replica] += cost
        self._held[replica].update((w.instance_id, w) for w in unit)
        self._handed[replica] += unit

    def _moved_to(self, replica: int, room: int, now: float) -> list[Work]:
        """Contexts another replica gave back, for `replica`: they go out before the queue's."""
        out: list[Work] = []
        for entry in list(self._moved):
            unit, source = entry
            if source == replica or (out and len(out) + len(unit) > room):  # None: anyone's
                continue
            self._moved.remove(entry)
            self._hand(replica, unit, now)
            out += unit
        return out

    def _ask_back(self, replica: int, now: float, by: float | None = None) -> int:
        """Ask a clearly slower replica (`speeds.clearly_faster`) to give `replica` the context it would finish
        last, if `replica` would finish it sooner. Returns how many prompts were asked back.

        `by`: with work still queued, the time the pool would end were its unfinished work split by speed: a
        context is asked back only if it would finish after that where it is. A slow replica's first batch (taken
        before any speed was known) then moves while there is time, not at the end: a run of the benchmark moved
        two long answers at 150 s, 145 tokens in at about a token a second, and the fast replica ran the rest of
        them for 34 s after the slow one had run out.

        When a context would finish where it is: by its engine's progress once known, else by how fast that
        replica has run its prompts (`SpeedEstimates.due`). On `replica`: a prefill of prompt and answer so far,
        then the rest at its decode rate (`SpeedEstimates.due_on`). A context moved keeps its answers so far
        (`Work.resumed`), and moves only once: a run of the benchmark sent contexts from the fast replica to the
        slow one and back, on estimates of prompts past their time. Nor does a context move that would finish
        where it is before `replica`'s own longest answer (`_answer_left`): the pool ends no sooner for it, and in
        a benchmark run the slow replica gave back its last short prompts one by one, then sat idle for 21 s while
        the fast one, full of long answers, ran them."""
        rate = self._estimates.prompt_speed(replica)
        if not self._moves or rate is None or self._moving() >= len(self._active) - 1:
            return 0
        finished, ran = self.speeds(now, ran=False) or {}, self.speeds(now) or {}
        last: tuple[float, list[Work], int] | None = None  # (when it would finish, context, its replica)
        for k in self._active - {replica}:
            their = self._estimates.prompt_speed(k)
            held, asked = self._held[k], self._asked_back[k]
            if not held or not clearly_faster(replica, k, finished, ran, rate, their):
                continue
            for unit in group_by_context([w for w in self._handed[k] if w.instance_id in held
                                          and w.instance_id not in asked and w.instance_id not in self._moved_ids]):
                due = self._estimates.due(unit, k, now)
                if due is None:
                    continue
                if last is None or due > last[0]:
                    last = (due, unit, k)
        if last is None:
            return 0
        mine = self._estimates.due_on(last[1], replica, now)
        if mine is None or mine >= last[0] or (by is not None and last[0] <= by) \
                or last[0] <= now + self._answer_left(replica):
            return 0
        self._asked_back[last[2]].update((w.instance_id, None) for w in last[1])
        self._moved_ids.update(w.instance_id for w in last[1])
        return len(last[1])

    def _ask_early(self, replica: int, now: float, speeds: dict[int, float] | None) -> int:
        """With work still queued, ask a slower replica for a context that would end the pool late where it is
        (`_ask_back` by the pool's projected end: its unfinished cost split by speed)."""
        if not (self._queue and speeds):
            return 0
        return self._ask_back(replica, now, by=self._projected_end(now, speeds))

    def _projected_end(self, now: float, speeds: dict[int, float]) -> float:
        """When the pool would end were the cost it has not run split by speed (`speeds`)."""
        unfinished = self._queued_cost + sum(self._unrun(k) for k in self._active)
        return now + max(0.0, unfinished) / sum(speeds.values())

    def _unrun(self, replica: int) -> int:
        """What `replica`'s engine has still to run of the prompts it holds (their cost less what it ran of them,
        `SpeedEstimates.ran`)."""
        return self._held_cost[replica] - self._estimates.ran_of(self._held[replica].values())

    def _moving(self) -> int:
        """Contexts on their way between replicas: asked back and not yet given back, or given back and not yet
        taken. `_ask_back` keeps them below the active replicas (one at a time, for two), so each ask weighs the
        pool after the last move. Asked back a context a second by the driver's reports, a benchmark run's slow
        replica gave back seven of its eight long answers at once; the fast replica, full, could start them only
        as its slots freed, over the next 27 s, and ran the last two 20 s after the slow one had run out."""
        asked = {self._held[k][i].context_id or i for k, ids in self._asked_back.items() for i in ids
                 if i in self._held[k]}
        return len(self._moved) + len(asked)

    def report(self, answers: Mapping[int, Mapping[str, int]], now: float | None = None) -> None:
        """Each replica's progress between its asks (tokens generated so far per prompt held; `take`'s
        `progress`), which the driver reads once a second: a full engine asks only when a prompt finishes.

        The early asks (`_ask_early`) are made here too, for every replica: made only when the faster replica
        asked, they waited for its next prompt to finish (6 s in a benchmark run), and meanwhile the slow one took
        four new prompts, whose prefill kept it from giving back for 33 s."""
        now = time.monotonic() if now is None else now
        for replica, progress in answers.items():
            if replica in self._active:
                self._estimates.progress(replica, progress, self._held[replica], now)
        speeds = self.speeds(now)
        for replica in sorted(self._active):
            if asked := self._ask_early(replica, now, speeds):
                self._trace.append({"t": round(now - self._started, 3), "replica": replica, "report": True,
                                    "asked_back": asked, "queued": len(self._queue)})

    def _may_move_to(self, replica: int) -> bool:
        """Whether work may yet move to `replica` (`_ask_back`): it has run a prompt and another replica holds some.
        Until then it waits, asking again, rather than ending its run: the replica that would finish last may be
        known only later (its first prompt finishes after the queue ran dry)."""
        return self._estimates.prompt_speed(replica) is not None and any(
            self._held[k] for k in self._active if k != replica)

    def _given_back(self, replica: int, so_far: Mapping[str, tuple[Sequence[int], str]]) -> None:
        """Prompts `replica` dropped unfinished when asked, with their answers so far: to the front, for any other
        replica to continue."""
        if not so_far:
            return
        ids = so_far.keys()
        asked = any(i in self._asked_back[replica] for i in ids)  # else called off: it may take them back
        back = [w if not so_far[w.instance_id][0] else replace(w, resumed=(tuple(so_far[w.instance_id][0]),
                                                                           so_far[w.instance_id][1]))
                for w in self._handed[replica] if w.instance_id in ids and w.instance_id in self._held[replica]]
        for w in back:
            self._estimates.gave_back(replica, w, len(so_far[w.instance_id][0]))  # its speed counts what it ran
            del self._held[replica][w.instance_id]
            self._asked_back[replica].pop(w.instance_id, None)
            self._held_cost[replica] -= w.cost
            self._queued_cost += w.cost
        self._handed[replica] = [w for w in self._handed[replica] if w.instance_id not in ids]
        self._moved.extend((unit, replica if asked else None) for unit in group_by_context(back))

    def reclaims(self) -> dict[int, list[str]]:
        """What each replica is asked to give back (the infer stage passes it on: `Replica.release`)."""
        return {k: list(ids) for k, ids in self._asked_back.items() if ids}

    def _pick(self, replica: int) -> int:
        """Where in the queue `replica`'s next context is: among the contexts that cost nearly what the first does
        (`AFFINITY_SLACK`), one from the shards it has open already (the latest opened first, so its reader
        finishes a shard before the next), else among the next `AFFINITY_LOOKAHEAD` one from shards no other
        replica has opened, else the first. So each instance shard is read by about one replica, a shard at a time
        (on S3 a file's requests are paid once, not by every replica of the pool; a reader holds the row groups of
        the shards it is on), while the order stays heaviest first within the slack. Of a shard's contexts, the
        one first in the schedule (its rows in order, not by a few tokens of cost): the reader reads a run of row
        groups per request on S3 (`PromptReader`), the prompts it runs next."""
        floor = sum(w.cost for w in self._queue[0]) * (1 - AFFINITY_SLACK)
        opened = self._opened[replica]
        for shard in reversed(opened):
            ours = []
            for unit in self._waiting.get(shard, ()):
                if sum(w.cost for w in unit) < floor:
                    break
                if {w.shard for w in unit} <= opened.keys():
                    ours.append(unit)
            if ours:
                unit = min(ours, key=lambda u: self._position[u[0].instance_id])
                return next(i for i, u in enumerate(self._queue) if u is unit)
        for at in range(min(AFFINITY_LOOKAHEAD, len(self._queue))):
            unit = self._queue[at]
            if sum(w.cost for w in unit) < floor:
                break
            if all(self._readers.get(w.shard, set()) <= {replica} for w in unit):
                # A shard no one reads: from its first row in the schedule, not from its heaviest.
                first = min((u for u in self._waiting[unit[0].shard] if sum(w.cost for w in u) >= floor
                             and all(self._readers.get(w.shard, set()) <= {replica} for w in u)),
                            key=lambda u: self._position[u[0].instance_id])
                return next(i for i, u in enumerate(self._queue) if u is first)
        return 0

    def _wait(self, unit: list[Work], *, at_front: bool) -> None:
        for shard in sorted({w.shard for w in unit}):
            units = self._waiting.setdefault(shard, [])
            if at_front:
                units.insert(0, unit)
            else:
                units.append(unit)

    def speeds(self, now: float, ran: bool = True) -> dict[int, float] | None:
        """Each active replica's cost run per second in its current life; None until every one has run
        something (`SpeedEstimates.speeds`; `ran=False`: the cost finished alone)."""
        return self._estimates.speeds(now, {k: self._held[k].values() for k in self._active}, ran)

    def _share(self, replica: int, speeds: dict[int, float] | None) -> float:
        """The cost `replica` may hold and not have run: the cost not yet run split by measured speed, or evenly;
        by speed, at least what it runs while another replica's longest answer runs out (`_longest_left`): the
        pool ends no sooner. Split by speed alone, a benchmark run's slow replica ran out of short prompts 17 s
        before the fast one's last 512-token answers ended, which the short prompts the fast one took in its
        stead had slowed (each prefill stalls its engine's decoding)."""
        unfinished = self._queued_cost + sum(self._unrun(k) for k in self._active)
        if speeds and replica in speeds:
            return max(unfinished * speeds[replica] / sum(speeds.values()),
                       speeds[replica] * self._longest_left(replica, speeds))
        return unfinished / max(1, len(self._active))

    def _sooner_elsewhere(self, replica: int, cost: int, speeds: dict[int, float] | None) -> bool:
        """Whether the other replicas would finish all the rest, a next context of `cost` included, before
        `replica` finished that context alone. A replica holding nothing takes work unless so: at the end of a
        pool a slower replica then leaves the last contexts to the faster ones instead of finishing last."""
        if not speeds or replica not in speeds or len(speeds) < 2:
            return False
        others = sum(speed for k, speed in speeds.items() if k != replica)
        rest = self._queued_cost + sum(self._unrun(k) for k in self._active if k != replica)
        return cost / speeds[replica] > max(rest / others, self._longest_left(replica, speeds))

    def _longest_left(self, replica: int, speeds: dict[int, float]) -> float:
        """Seconds the longest answer a replica at least as fast as `replica` holds has still to run there, by its
        budget left and that replica's decode rate (`SpeedEstimates.left`; 0 until known). Not a slower replica's:
        what would end late there moves (`_ask_back`)."""
        return max((self._answer_left(k) for k in self._active - {replica}
                    if speeds.get(k, 0.0) >= speeds[replica]), default=0.0)

    def _answer_left(self, replica: int) -> float:
        """Seconds the longest answer `replica` holds has still to run (`SpeedEstimates.left`; 0 until known)."""
        return self._estimates.answer_left(self._held[replica].values(), replica)

    def give_back(self, replica: int, done: set[str], requeue: bool = True, next_life: int | None = None
                  ) -> tuple[list[Work], int]:
        """A replica died: what it took in this life and did not finish (`done`: the ids committed) goes back to
        the front of the queue, its contexts whole and in order, for any replica to take (`requeue=False`: to
        the caller only). Returns what was left, and how many it had finished. `next_life`: the life its restart
        asks as; earlier lives are answered None from now on."""
        if next_life is not None:
            self._first_life[replica] = max(self._first_life[replica], next_life)
        handed = self._handed[replica]
        left = [w for w in handed if w.instance_id not in done]
        if requeue:
            for unit in reversed(group_by_context(left)):
                self._queue.appendleft(unit)
                self._wait(unit, at_front=True)
                self._queued_cost += sum(w.cost for w in unit)
        self._let_go(replica)
        self._call_off_moves()
        self._handed[replica] = []
        self._estimates.new_life(replica)  # a new life: its speed is measured afresh
        self._close(replica)  # and its reader starts with no shard open
        return left, len(handed) - len(left)

    def ran_out(self, replica: int) -> None:
        """A replica's run ended normally: everything it took is finished (the last of it after its last ask)."""
        self._let_go(replica)

    def retire(self, replica: int) -> None:
        """A replica that will take no more (failed too often): its share goes to the others."""
        self._active.discard(replica)
        self._let_go(replica)
        self._call_off_moves()
        self._handed[replica] = []
        self._close(replica)

    def _call_off_moves(self) -> None:
        """A replica died or retired: pending moves are off, and what was (or is yet) given back goes to any
        replica, its giver included. Else, with two replicas, a move meant for one whose host was lost waits for it
        for ever: the other may not take back what it gave, and the lost one is never placed again."""
        for asked in self._asked_back.values():
            asked.clear()
        self._moved = deque((unit, None) for unit, _ in self._moved)

    def _let_go(self, replica: int) -> None:
        """Forget what `replica` holds, with its progress and hand-out times."""
        self._estimates.forget(self._held[replica])
        self._held[replica].clear()
        self._held_cost[replica] = 0
        self._asked_back[replica].clear()

    def _open(self, replica: int, shards: list[str]) -> None:
        opened = self._opened[replica]
        for shard in shards:
            opened.pop(shard, None)
            opened[shard] = None  # the latest last
            self._readers.setdefault(shard, set()).add(replica)
        while len(opened) > OPEN_SHARDS:
            oldest = next(iter(opened))
            del opened[oldest]
            self._readers[oldest].discard(replica)

    def _close(self, replica: int) -> None:
        for shard in self._opened[replica]:
            self._readers[shard].discard(replica)
        self._opened[replica] = {}

    def held(self, replica: int) -> list[str]:
        """The ids `replica` took and has not reported finished, in the order it took them."""
        return list(self._held[replica])

    def given_back_waiting(self) -> int:
        """Contexts given back and not yet taken by another replica."""
        return len(self._moved)

    @property
    def estimates(self) -> SpeedEstimates:
        """The replicas' measured speeds and progress (read them; the queue alone updates them)."""
        return self._estimates

    def events(self) -> list[dict]:
        """The trace, oldest first."""
        return list(self._trace)

    def remaining(self) -> int:
        """Prompts not yet handed out (given back ones included)."""
        return sum(len(unit) for unit in self._queue) + sum(len(unit) for unit, _ in self._moved)

    def drain(self) -> list[Work]:
        """Everything still queued, taken out (for recording when no replica is left to run it)."""
        out = [w for unit, _ in self._moved for w in unit] + [w for unit in self._queue for w in unit]
        self._moved.clear()
        self._queue.clear()
        self._waiting.clear()
        self._queued_cost = 0
        return out
