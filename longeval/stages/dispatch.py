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
    (`stages.infer.PromptReader`)."""
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


def shares(assignment: Sequence[Sequence[Work]]) -> list[float]:
    """Each replica's share of the rows relative to an even split (1.0 = exactly its share)."""
    total = sum(len(a) for a in assignment)
    if not total:
        return [0.0 for _ in assignment]
    even = total / len(assignment)
    return [len(a) / even for a in assignment]


TRACE_EVENTS = 512
"""How many of its latest decisions a `WorkQueue` keeps (`WorkQueue.trace`): the end of a pool, where a slow
replica shows, in a bounded record whatever the pool's size."""

AFFINITY_SLACK = 0.1
"""How much cheaper than the first context in the queue another may be and still go first, for shard affinity
(`WorkQueue._pick`): within a (task, length) cell contexts cost about the same, so this keeps each pick among
the heaviest work while letting a replica stay on the shards it has open."""
AFFINITY_LOOKAHEAD = 256
"""How far down the queue `WorkQueue._pick` looks for a context from a shard no other replica has open (a context
from a shard the replica has open is found through `WorkQueue.waiting`, wherever it lies in the queue)."""
OPEN_SHARDS = 12
"""How many instance shards a replica's prompt reader keeps open (`stages.infer.PromptReader`), the latest it
took prompts from: enough for a context several tasks share (each task's prompts sit in shards of its own). The
queue counts a shard as open for that long, so affinity never sends a replica back to a shard its reader has let go."""


MOVE_SPEEDUP = 1.5
"""How much faster a replica must run (cost finished per second) than another to take that one's work
(`WorkQueue._ask_back`): clearly faster, so replicas of one speed, whose measured speeds differ by batch and noise,
do not trade work."""


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
    (cost run per second since each first asked, `_speeds`) once every active replica has run something, else it
    is an even split: near the end a slower replica then holds less, and finishes when the others do, instead of
    holding half of what is left at half the speed.

    What a replica has started can still move: a replica may ask for the context a slower one would finish last
    (`_ask_back`) when nothing is left to hand out, or when that context would end the pool late; the slower one
    gives it back unfinished (`given_back`) with its answer so far, and it goes out first, to any other replica,
    which continues it.

    Pure and single-threaded; the infer stage wraps it in a Ray actor that replicas call.
    """

    def __init__(self, rows: Sequence[Work], replicas: int) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.active = set(range(replicas))
        """Replicas that may still take work (not retired)."""
        groups = group_by_context(rows)
        order = sorted(range(len(groups)), key=lambda g: (-sum(w.cost for w in groups[g]), g))
        self.queue: deque[list[Work]] = deque(groups[g] for g in order)
        self.position = {w.instance_id: g for g in order for w in groups[g]}
        """Each prompt's context's place in the schedule: shard by shard, rows in order."""
        self.queued_cost = sum(w.cost for w in rows)
        self.waiting: dict[str, list[list[Work]]] = {}
        """Each instance shard's queued contexts, in queue order: a replica's next context from the shards it has
        open is found here, not by scanning the queue. (A scan of its first `AFFINITY_LOOKAHEAD` contexts missed
        them once a length had thousands of contexts of about one cost: a replica opened 21 shards for 800 prompts
        and its reader kept every one's row groups.)"""
        for unit in self.queue:
            self._wait(unit, at_front=False)
        self.held: dict[int, dict[str, Work]] = {k: {} for k in range(replicas)}
        """What each replica took and has not reported finished, by instance id."""
        self.held_cost = dict.fromkeys(range(replicas), 0)
        self.handed: dict[int, list[Work]] = {k: [] for k in range(replicas)}
        """Everything each replica took in its current life (for `give_back`)."""
        self.first_ask: dict[int, float] = {}
        """When each replica first asked in its current life (`time.monotonic`, or the caller's clock)."""
        self.done_cost = dict.fromkeys(range(replicas), 0)
        """Cost each replica finished in its current life, and of what it gave back what it ran (`_ran`)."""
        self.opened: dict[int, dict[str, None]] = {k: {} for k in range(replicas)}
        """The last `OPEN_SHARDS` instance shards each replica took prompts from, oldest first (its reader has them
        open)."""
        self.readers: dict[str, set[int]] = {}
        """The other way round: which replicas have each shard open."""
        self.since: dict[str, float] = {}
        """When each prompt held was handed out."""
        self.latency: dict[int, list[float]] = {k: [0.0, 0.0] for k in range(replicas)}
        """Each replica's cost finished and the seconds its prompts took, hand-out to finish, in its current life:
        how fast it runs a prompt (`_ask_back`), batch and all, not how much it runs at once."""
        self.asked_back: dict[int, dict[str, None]] = {k: {} for k in range(replicas)}
        """Prompts each replica is asked to give back (`_ask_back`), until it gives them back or finishes them."""
        self.moved_ids: set[str] = set()
        """Prompts ever asked back: a prompt moves once at most, so two estimates can never send it to and fro."""
        self.moved: deque[tuple[list[Work], int]] = deque()
        """Contexts given back, with the replica that gave them: the next to go out, to any other replica."""
        self.generated: dict[str, tuple[int, float]] = {}
        """Of each prompt held, the tokens its engine had generated at its replica's latest ask, and when."""
        self.decode: dict[int, list[float]] = {k: [0.0, 0.0] for k in range(replicas)}
        """Each replica's tokens generated per sequence and the seconds they took, from the progress it reports: how
        fast it generates one answer, batch and all (`_ask_back`)."""
        self.started: float | None = None
        """The first ask's clock reading: the trace's zero."""
        self.trace: deque[dict] = deque(maxlen=TRACE_EVENTS)
        """The latest asks: when (s since the queue was made), who, what it reported finished and was given, what it
        held and its share (`_share`) then; the infer stage writes it beside the engine records."""

    def take(self, replica: int, room: int = 1, finished: Iterable[str] = (),
             now: float | None = None,
             given_back: Iterable[str] | Mapping[str, tuple[Sequence[int], str]] = (),
             progress: Mapping[str, int] | None = None) -> list[Work] | None:
        """The next contexts for `replica`, at least one when it may take any, until `room` prompts.

        `finished`: ids it finished since it last asked (they no longer count as held); `given_back`: ids it was
        asked to give back (`reclaims`) and dropped unfinished, each with its answer so far (token ids, text) when a
        mapping; `progress`: the tokens generated so far by each prompt in its engine.
        Returns [] when the replica holds its fair share already (ask again once some of it finished), or holding
        nothing would finish the next context after the others finished everything, or work is on its way back
        from another replica (ask again in a while); None when nothing is left to hand out.
        `now`: the clock for the speeds (default `time.monotonic()`).
        """
        now = time.monotonic() if now is None else now
        self.started = now if self.started is None else self.started
        self.first_ask.setdefault(replica, now)
        held = self.held[replica]
        reported = 0
        for instance_id in finished:
            reported += 1
            self.asked_back[replica].pop(instance_id, None)
            work = held.pop(instance_id, None)
            self.generated.pop(instance_id, None)
            if work is not None:
                self.held_cost[replica] -= work.cost
                self.done_cost[replica] += work.cost
                self.latency[replica][0] += work.cost
                self.latency[replica][1] += now - self.since.pop(instance_id, now)
        so_far = given_back if isinstance(given_back, Mapping) else dict.fromkeys(given_back, ((), ""))
        self._given_back(replica, so_far)
        self._progress(replica, progress or {}, now)
        speeds = self._speeds(now)
        share = self._share(replica, speeds)
        out = self._moved_to(replica, room, now)
        unrun = self._unrun(replica)
        while self.queue and (not out or len(out) < room):
            at = self._pick(replica)
            unit = self.queue[at]
            cost = sum(w.cost for w in unit)
            if held and unrun + cost > share:
                break
            if not held and self._sooner_elsewhere(replica, cost, speeds):
                break
            del self.queue[at]
            for shard in {w.shard for w in unit}:
                units = self.waiting[shard]
                del units[next(i for i, u in enumerate(units) if u is unit)]
            self._hand(replica, unit, now)
            unrun += cost
            out += unit
        event = {"t": round(now - self.started, 3), "replica": replica, "finished": reported,
                 "took": len(out), "took_cost": sum(w.cost for w in out), "held_cost": self.held_cost[replica],
                 "share": round(share), "queued": len(self.queue),
                 "speeds": speeds and {k: round(v, 1) for k, v in sorted(speeds.items())}}
        if so_far:
            event["given_back"] = len(so_far)
        if any(tokens for tokens, _ in self.decode.values()):
            event["decode"] = {k: round(t / s, 2) for k, (t, s) in sorted(self.decode.items()) if s > 0}
        if resumed := sum(len(w.resumed[0]) for w in out if w.resumed):
            event["resumed_tokens"] = resumed  # generated before it moved: not run again
        if asked := self._ask_early(replica, now, speeds):
            event["asked_back"] = asked
        if not out and not self.queue:
            asked = self._ask_back(replica, now)
            if not (asked or self.moved or any(self.asked_back.values()) or self._may_move_to(replica)):
                self.trace.append({**event, "took": None})
                return None
            event["asked_back"] = asked
        if out or reported or so_far or event.get("asked_back"):  # not every ask of one waiting
            self.trace.append(event)
        return out

    def _hand(self, replica: int, unit: list[Work], now: float) -> None:
        cost = sum(w.cost for w in unit)
        self.since.update((w.instance_id, now) for w in unit)
        self._open(replica, sorted({w.shard for w in unit}))
        self.queued_cost -= cost
        self.held_cost[replica] += cost
        self.held[replica].update((w.instance_id, w) for w in unit)
        self.handed[replica] += unit

    def _moved_to(self, replica: int, room: int, now: float) -> list[Work]:
        """Contexts another replica gave back, for `replica`: they go out before the queue's."""
        out: list[Work] = []
        for entry in list(self.moved):
            unit, source = entry
            if source == replica or (out and len(out) + len(unit) > room):
                continue
            self.moved.remove(entry)
            self._hand(replica, unit, now)
            out += unit
        return out

    def _ask_back(self, replica: int, now: float, by: float | None = None) -> int:
        """Ask a clearly slower replica (`_clearly_faster`) to give `replica` the context it would finish last, if
        `replica` would finish it sooner. Returns how many prompts were asked back.

        `by`: with work still queued, the time the pool would end were its unfinished work split by speed: a
        context is asked back only if it would finish after that where it is. A slow replica's first batch (taken
        before any speed was known) then moves while there is time, not at the end: a run of the benchmark moved
        two long answers at 150 s, 145 tokens in at about a token a second, and the fast replica ran the rest of
        them for 34 s after the slow one had run out.

        When a context would finish where it is: by its engine's progress once known (`_left`: budget left at that
        replica's decode rate), else by how fast that replica has run its prompts (`latency`), a context past that
        time being taken to need as long again as it has run (LATE, Zaharia et al., OSDI 2008). On `replica`: a
        prefill of prompt and answer so far at its prompt speed (which errs long), then the rest at its decode
        rate; from scratch at its prompt speed until it reported progress. A context moved keeps its answers so far
        (`Work.resumed`), and moves only once: a run of the benchmark sent contexts from the fast replica to the
        slow one and back, on estimates of prompts past their time. Nor does a context move that would finish
        where it is before `replica`'s own longest answer (`_answer_left`): the pool ends no sooner for it, and in
        a benchmark run the slow replica gave back its last short prompts one by one, then sat idle for 21 s while
        the fast one, full of long answers, ran them."""
        rate = self._prompt_speed(replica)
        if rate is None or self._moving() >= len(self.active) - 1:
            return 0
        finished, ran = self._speeds(now, ran=False) or {}, self._speeds(now) or {}
        last: tuple[float, list[Work], int] | None = None  # (when it would finish, context, its replica)
        for k in self.active - {replica}:
            their = self._prompt_speed(k)
            held, asked = self.held[k], self.asked_back[k]
            if not held or not self._clearly_faster(replica, k, finished, ran, rate, their):
                continue
            for unit in group_by_context([w for w in self.handed[k] if w.instance_id in held
                                          and w.instance_id not in asked and w.instance_id not in self.moved_ids]):
                left = [self._left(w, k) for w in unit]
                if None not in left:  # its engine's progress tells
                    due = now + max(left)
                elif their is None:  # neither a prompt finished there nor progress: no estimate
                    continue
                else:
                    since = min(self.since[w.instance_id] for w in unit)
                    due = since + sum(w.cost for w in unit) / their
                    if due < now:  # overdue (a longer answer than that replica's average): as long again
                        due = now + (now - since)
                if last is None or due > last[0]:
                    last = (due, unit, k)
        if last is None:
            return 0
        mine = now + sum(w.cost for w in last[1]) / rate
        left = [self._left(w, replica) for w in last[1]]
        if None not in left:  # a prefill of prompt and answer so far (at its prompt speed, which errs long), then
            # the rest of each answer at this replica's decode rate
            generated = sum(self.generated.get(w.instance_id, (0, 0.0))[0] for w in last[1])
            mine = now + (sum(w.prompt_cost for w in last[1]) + generated) / rate + max(left)
        if mine >= last[0] or (by is not None and last[0] <= by) or last[0] <= now + self._answer_left(replica):
            return 0
        self.asked_back[last[2]].update((w.instance_id, None) for w in last[1])
        self.moved_ids.update(w.instance_id for w in last[1])
        return len(last[1])

    def _ask_early(self, replica: int, now: float, speeds: dict[int, float] | None) -> int:
        """With work still queued, ask a slower replica for a context that would end the pool late where it is
        (`_ask_back` by the pool's projected end: its unfinished cost split by speed)."""
        if not (self.queue and speeds):
            return 0
        return self._ask_back(replica, now, by=self._projected_end(now, speeds))

    def _projected_end(self, now: float, speeds: dict[int, float]) -> float:
        """When the pool would end were the cost it has not run split by speed (`_speeds`)."""
        unfinished = self.queued_cost + sum(self._unrun(k) for k in self.active)
        return now + max(0.0, unfinished) / sum(speeds.values())

    def _unrun(self, replica: int) -> int:
        """What `replica`'s engine has still to run of the prompts it holds (their cost less `_ran_held`)."""
        return self.held_cost[replica] - self._ran_held(replica)

    def _ran_held(self, replica: int) -> int:
        """What `replica`'s engine ran of the prompts it holds (`_ran`)."""
        return sum(self._ran(w) for w in self.held[replica].values())

    def _ran(self, work: Work, generated: int = 0) -> int:
        """How much of a held prompt's cost its engine ran: its prompt once it generated a token, and its tokens
        (`generated`, else as last reported)."""
        generated = generated or self.generated.get(work.instance_id, (0, 0.0))[0]
        return work.prompt_cost + work.weight * min(generated, work.budget) if generated else 0

    def _moving(self) -> int:
        """Contexts on their way between replicas: asked back and not yet given back, or given back and not yet
        taken. `_ask_back` keeps them below the active replicas (one at a time, for two), so each ask weighs the
        pool after the last move. Asked back a context a second by the driver's reports, a benchmark run's slow
        replica gave back seven of its eight long answers at once; the fast replica, full, could start them only
        as its slots freed, over the next 27 s, and ran the last two 20 s after the slow one had run out."""
        asked = {self.held[k][i].context_id or i for k, ids in self.asked_back.items() for i in ids
                 if i in self.held[k]}
        return len(self.moved) + len(asked)

    def report(self, answers: Mapping[int, Mapping[str, int]], now: float | None = None) -> None:
        """Each replica's progress between its asks (tokens generated so far per prompt held; `take`'s
        `progress`), which the driver reads once a second: a full engine asks only when a prompt finishes.

        The early asks (`_ask_early`) are made here too, for every replica: made only when the faster replica
        asked, they waited for its next prompt to finish (6 s in a benchmark run), and meanwhile the slow one took
        four new prompts, whose prefill kept it from giving back for 33 s."""
        now = time.monotonic() if now is None else now
        for replica, progress in answers.items():
            if replica in self.active:
                self._progress(replica, progress, now)
        speeds = self._speeds(now)
        for replica in sorted(self.active):
            if asked := self._ask_early(replica, now, speeds):
                self.trace.append({"t": round(now - self.started, 3), "replica": replica, "report": True,
                                   "asked_back": asked, "queued": len(self.queue)})

    def _progress(self, replica: int, progress: Mapping[str, int], now: float) -> None:
        """Each prompt's tokens generated so far, and from their growth since the last report the replica's tokens
        per second per sequence (the prefill's report, 0 tokens, is a starting point only)."""
        for instance_id, tokens in progress.items():
            if instance_id not in self.held[replica]:
                continue
            before = self.generated.get(instance_id)
            if before is not None and before[0] > 0 and tokens > before[0] and now > before[1]:
                self.decode[replica][0] += tokens - before[0]
                self.decode[replica][1] += now - before[1]
            self.generated[instance_id] = (tokens, now)

    def _left(self, work: Work, replica: int) -> float | None:
        """Seconds `replica` needs to finish `work` from where it is: its budget left at the replica's decode rate
        (an upper bound: an answer may stop before its budget); None until both are known."""
        tokens, seconds = self.decode[replica]
        generated = self.generated.get(work.instance_id, (0, 0.0))[0]
        if not (work.budget and tokens and seconds > 0):
            return None
        return max(0, work.budget - generated) * seconds / tokens

    def _may_move_to(self, replica: int) -> bool:
        """Whether work may yet move to `replica` (`_ask_back`): it has run a prompt and another replica holds some.
        Until then it waits, asking again, rather than ending its run: the replica that would finish last may be
        known only later (its first prompt finishes after the queue ran dry)."""
        return self._prompt_speed(replica) is not None and any(
            self.held[k] for k in self.active if k != replica)

    def _clearly_faster(self, replica: int, other: int, finished: dict[int, float], ran: dict[int, float],
                        rate: float, their: float | None) -> bool:
        """Whether `replica` runs `MOVE_SPEEDUP` times as fast as `other`: by the cost each finished per second
        (`_speeds(ran=False)`: by cost run, a replica that prefilled its batch counts those prompts' prefills at
        once) once every replica finished something; before `other` finished anything, by the cost each ran
        (`_speeds()`), so a slow replica's first batch can move while there is time (it finished its first prompt
        at 55-58 s in benchmark runs, and the long answers that then moved ended the pool 15-20 s after it ran
        out); else by prompt speed (`rate`, `their`). Not by how fast answers
        grow (`decode`): that follows what else shares a step, and two replicas of one speed measured 2.5 and 0.6
        tokens a second per answer in a benchmark run (prefills in one engine's steps), and traded work."""
        if replica in finished and other in finished:
            return finished[replica] >= MOVE_SPEEDUP * finished[other]
        if replica in ran and other in ran and their is None:
            return ran[replica] >= MOVE_SPEEDUP * ran[other]
        return their is not None and rate >= MOVE_SPEEDUP * their

    def _prompt_speed(self, replica: int) -> float | None:
        """Cost per second of a prompt on `replica` (`latency`); None until it finished one."""
        cost, seconds = self.latency[replica]
        return cost / seconds if cost and seconds > 0 else None

    def _given_back(self, replica: int, so_far: Mapping[str, tuple[Sequence[int], str]]) -> None:
        """Prompts `replica` dropped unfinished when asked, with their answers so far: to the front, for any other
        replica to continue."""
        if not so_far:
            return
        ids = so_far.keys()
        back = [w if not so_far[w.instance_id][0] else replace(w, resumed=(tuple(so_far[w.instance_id][0]),
                                                                           so_far[w.instance_id][1]))
                for w in self.handed[replica] if w.instance_id in ids and w.instance_id in self.held[replica]]
        for w in back:
            self.done_cost[replica] += self._ran(w, len(so_far[w.instance_id][0]))  # its speed counts what it ran
            del self.held[replica][w.instance_id]
            self.since.pop(w.instance_id, None)
            self.generated.pop(w.instance_id, None)
            self.asked_back[replica].pop(w.instance_id, None)
            self.held_cost[replica] -= w.cost
            self.queued_cost += w.cost
        self.handed[replica] = [w for w in self.handed[replica] if w.instance_id not in ids]
        self.moved.extend((unit, replica) for unit in group_by_context(back))

    def reclaims(self) -> dict[int, list[str]]:
        """What each replica is asked to give back (the infer stage passes it on: `Replica.release`)."""
        return {k: list(ids) for k, ids in self.asked_back.items() if ids}

    def _pick(self, replica: int) -> int:
        """Where in the queue `replica`'s next context is: among the contexts that cost nearly what the first does
        (`AFFINITY_SLACK`), one from the shards it has open already (the latest opened first, so its reader
        finishes a shard before the next), else among the next `AFFINITY_LOOKAHEAD` one from shards no other
        replica has opened, else the first. So each instance shard is read by about one replica, a shard at a time
        (on S3 a file's requests are paid once, not by every replica of the pool; a reader holds the row groups of
        the shards it is on), while the order stays heaviest first within the slack. Of a shard's contexts, the
        one first in the schedule (its rows in order, not by a few tokens of cost): the reader reads a run of row
        groups per request on S3 (`PromptReader`), the prompts it runs next."""
        floor = sum(w.cost for w in self.queue[0]) * (1 - AFFINITY_SLACK)
        opened = self.opened[replica]
        for shard in reversed(opened):
            ours = []
            for unit in self.waiting.get(shard, ()):
                if sum(w.cost for w in unit) < floor:
                    break
                if {w.shard for w in unit} <= opened.keys():
                    ours.append(unit)
            if ours:
                unit = min(ours, key=lambda u: self.position[u[0].instance_id])
                return next(i for i, u in enumerate(self.queue) if u is unit)
        for at in range(min(AFFINITY_LOOKAHEAD, len(self.queue))):
            unit = self.queue[at]
            if sum(w.cost for w in unit) < floor:
                break
            if all(self.readers.get(w.shard, set()) <= {replica} for w in unit):
                # A shard no one reads: from its first row in the schedule, not from its heaviest.
                first = min((u for u in self.waiting[unit[0].shard] if sum(w.cost for w in u) >= floor
                             and all(self.readers.get(w.shard, set()) <= {replica} for w in u)),
                            key=lambda u: self.position[u[0].instance_id])
                return next(i for i, u in enumerate(self.queue) if u is first)
        return 0

    def _wait(self, unit: list[Work], *, at_front: bool) -> None:
        for shard in sorted({w.shard for w in unit}):
            units = self.waiting.setdefault(shard, [])
            if at_front:
                units.insert(0, unit)
            else:
                units.append(unit)

    def _speeds(self, now: float, ran: bool = True) -> dict[int, float] | None:
        """Each active replica's cost run per second in its current life; None until every one has run
        something. Cost run: the prompts it finished and, by its engine's progress, what it ran of those it holds
        or gave back (`_ran`). By finished cost alone a replica's first batch counts for nothing until its prompts
        finish, and what it gave back never: a benchmark run's slow replica measured 19 a second at 54 s (one
        prompt finished of eight prefilled), which put the pool's end at 267 s (it ended at 168 s) so that its
        long answers were asked back only at 95 s, and after moves its share kept it at two or three prompts
        while the fast replica took the long answers left in the queue, and it ran out 21 s before the end.
        `ran=False`: the cost finished alone (what "clearly faster" goes by, `_clearly_faster`)."""
        cost_run = {k: self.done_cost[k] + (self._ran_held(k) if ran else 0) for k in self.active}
        speeds = {k: cost_run[k] / (now - self.first_ask[k]) for k in self.active
                  if k in self.first_ask and now > self.first_ask[k] and cost_run[k] > 0}
        return speeds if self.active and len(speeds) == len(self.active) else None

    def _share(self, replica: int, speeds: dict[int, float] | None) -> float:
        """The cost `replica` may hold and not have run: the cost not yet run split by measured speed, or evenly;
        by speed, at least what it runs while another replica's longest answer runs out (`_longest_left`): the
        pool ends no sooner. Split by speed alone, a benchmark run's slow replica ran out of short prompts 17 s
        before the fast one's last 512-token answers ended, which the short prompts the fast one took in its
        stead had slowed (each prefill stalls its engine's decoding)."""
        unfinished = self.queued_cost + sum(self._unrun(k) for k in self.active)
        if speeds and replica in speeds:
            return max(unfinished * speeds[replica] / sum(speeds.values()),
                       speeds[replica] * self._longest_left(replica, speeds))
        return unfinished / max(1, len(self.active))

    def _sooner_elsewhere(self, replica: int, cost: int, speeds: dict[int, float] | None) -> bool:
        """Whether the other replicas would finish all the rest, a next context of `cost` included, before
        `replica` finished that context alone. A replica holding nothing takes work unless so: at the end of a
        pool a slower replica then leaves the last contexts to the faster ones instead of finishing last."""
        if not speeds or replica not in speeds or len(speeds) < 2:
            return False
        others = sum(speed for k, speed in speeds.items() if k != replica)
        rest = self.queued_cost + sum(self._unrun(k) for k in self.active if k != replica)
        return cost / speeds[replica] > max(rest / others, self._longest_left(replica, speeds))

    def _longest_left(self, replica: int, speeds: dict[int, float]) -> float:
        """Seconds the longest answer a replica at least as fast as `replica` holds has still to run there, by its
        budget left and that replica's decode rate (`_left`; 0 until known). Not a slower replica's: what would
        end late there moves (`_ask_back`)."""
        return max((self._answer_left(k) for k in self.active - {replica} if speeds.get(k, 0.0) >= speeds[replica]),
                   default=0.0)

    def _answer_left(self, replica: int) -> float:
        """Seconds the longest answer `replica` holds has still to run (`_left`; 0 until known)."""
        return max((left for w in self.held[replica].values() if (left := self._left(w, replica)) is not None),
                   default=0.0)

    def give_back(self, replica: int, done: set[str], requeue: bool = True) -> tuple[list[Work], int]:
        """A replica died: what it took in this life and did not finish (`done`: the ids committed) goes back to
        the front of the queue, its contexts whole and in order, for any replica to take (`requeue=False`: to
        the caller only). Returns what was left, and how many it had finished."""
        handed = self.handed[replica]
        left = [w for w in handed if w.instance_id not in done]
        if requeue:
            for unit in reversed(group_by_context(left)):
                self.queue.appendleft(unit)
                self._wait(unit, at_front=True)
                self.queued_cost += sum(w.cost for w in unit)
        self._let_go(replica)
        self.handed[replica] = []
        self.latency[replica] = [0.0, 0.0]
        self.decode[replica] = [0.0, 0.0]
        self.first_ask.pop(replica, None)  # a new life: its speed is measured afresh
        self.done_cost[replica] = 0
        self._close(replica)  # and its reader starts with no shard open
        return left, len(handed) - len(left)

    def ran_out(self, replica: int) -> None:
        """A replica's run ended normally: everything it took is finished (the last of it after its last ask)."""
        self._let_go(replica)

    def retire(self, replica: int) -> None:
        """A replica that will take no more (failed too often): its share goes to the others."""
        self.active.discard(replica)
        self._let_go(replica)
        self.handed[replica] = []
        self._close(replica)

    def _let_go(self, replica: int) -> None:
        """Forget what `replica` holds, with its progress and hand-out times."""
        for instance_id in self.held[replica]:
            self.generated.pop(instance_id, None)
            self.since.pop(instance_id, None)
        self.held[replica].clear()
        self.held_cost[replica] = 0
        self.asked_back[replica].clear()

    def _open(self, replica: int, shards: list[str]) -> None:
        opened = self.opened[replica]
        for shard in shards:
            opened.pop(shard, None)
            opened[shard] = None  # the latest last
            self.readers.setdefault(shard, set()).add(replica)
        while len(opened) > OPEN_SHARDS:
            oldest = next(iter(opened))
            del opened[oldest]
            self.readers[oldest].discard(replica)

    def _close(self, replica: int) -> None:
        for shard in self.opened[replica]:
            self.readers[shard].discard(replica)
        self.opened[replica] = {}

    def events(self) -> list[dict]:
        """The trace, oldest first."""
        return list(self.trace)

    def remaining(self) -> int:
        """Prompts not yet handed out (given back ones included)."""
        return sum(len(unit) for unit in self.queue) + sum(len(unit) for unit, _ in self.moved)

    def drain(self) -> list[Work]:
        """Everything still queued, taken out (for recording when no replica is left to run it)."""
        out = [w for unit, _ in self.moved for w in unit] + [w for unit in self.queue for w in unit]
        self.moved.clear()
        self.queue.clear()
        self.waiting.clear()
        self.queued_cost = 0
        return out
