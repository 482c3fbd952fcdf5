"""Dispatch: fair shares, whole contexts, and the same answer every time (pure; no Ray)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.stages.infer import dispatch
from longeval.stages.infer.dispatch import (
    OPEN_SHARDS,
    Work,
    WorkQueue,
    assign,
    group_by_context,
    reads,
)
from longeval.stages.infer.speeds import MOVE_SPEEDUP


def _rows(n: int, *, per_context: int = 1, cost: int = 100) -> list[Work]:
    return [Work(f"i{k:04d}", f"c{k // per_context:04d}", cost, "s") for k in range(n)]


def test_equal_rows_split_evenly_over_replicas():
    out = assign(_rows(100), 4)
    assert [len(a) for a in out] == [25, 25, 25, 25]
    assert sorted(w.instance_id for a in out for w in a) == [f"i{k:04d}" for k in range(100)]


def test_a_context_stays_on_one_replica_and_its_prompts_stay_together():
    rows = _rows(60, per_context=3)
    out = assign(rows, 2)
    for replica in out:
        contexts = [w.context_id for w in replica]
        for c in set(contexts):
            first = contexts.index(c)
            assert contexts[first:first + 3] == [c, c, c]  # adjacent: the prefix cache computes c once
    where = {w.context_id: r for r, replica in enumerate(out) for w in replica}
    assert len(where) == 20
    assert all(sum(1 for w in out[r] if w.context_id == c) == 3 for c, r in where.items())


def test_token_cost_is_balanced_not_only_row_counts():
    # one 32K prompt and many 4K ones: the long one's replica gets fewer rows
    rows = [Work("long", "long", 32768, "s")] + [Work(f"s{k}", f"s{k}", 4096, "s") for k in range(16)]
    out = assign(rows, 2)
    costs = sorted(sum(w.cost for w in a) for a in out)
    assert costs == [49152, 49152]


def test_replica_order_follows_the_schedule():
    rows = _rows(10)
    out = assign(rows, 3)
    for replica in out:
        ids = [w.instance_id for w in replica]
        assert ids == sorted(ids)


def test_more_replicas_than_contexts_leaves_some_idle_and_none_twice():
    out = assign(_rows(6, per_context=3), 4)
    assert sorted(len(a) for a in out) == [0, 0, 3, 3]


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5000)), min_size=1, max_size=200),
       st.integers(1, 8))
def test_assignment_is_a_partition_and_does_not_depend_on_anything_but_the_rows(spec, replicas):
    rows = [Work(f"i{k}", f"c{c}", cost, "s") for k, (c, cost) in enumerate(spec)]
    out = assign(rows, replicas)
    assert len(out) == replicas
    assert sorted(w.instance_id for a in out for w in a) == sorted(w.instance_id for w in rows)
    assert out == assign(list(rows), replicas)
    # whole contexts, and LPT's bound: no replica above the even share plus the largest context
    groups = group_by_context(rows)
    biggest = max(sum(w.cost for w in g) for g in groups)
    even = sum(w.cost for w in rows) / replicas
    assert max(sum(w.cost for w in a) for a in out) <= even + biggest


# -- the dynamic queue ------------------------------------------------------------------------------------------


def _simulate(rows: list[Work], speeds: list[float], slots: int, seconds: Callable[[Work], float] | None = None
              ) -> tuple[list[float], dict[str, int]]:
    """Replicas of the given speeds (cost units per second per slot) pulling from one WorkQueue, each running at
    most `slots` prompts at once; returns each replica's busy-until time and which replica ran each prompt.
    `seconds`: what a prompt takes at speed 1, when not its cost."""
    seconds = seconds or (lambda w: w.cost)
    queue = WorkQueue(rows, len(speeds))
    running: list[list[tuple[float, Work]]] = [[] for _ in speeds]  # (finish time, work)
    clock, busy_until, ran_on = 0.0, [0.0] * len(speeds), {}
    finished: list[list[str]] = [[] for _ in speeds]
    while True:
        for k in range(len(speeds)):
            while len(running[k]) < slots:
                got = queue.take(k, 1, finished[k], now=clock)
                finished[k] = []
                if not got:
                    break
                for w in got:
                    running[k].append((clock + seconds(w) / speeds[k], w))
                    ran_on[w.instance_id] = k
        pending = [t for r in running for t, _ in r]
        if not pending:
            return busy_until, ran_on
        clock = min(pending)
        for k in range(len(speeds)):
            for t, w in [item for item in running[k] if item[0] <= clock]:
                running[k].remove((t, w))
                finished[k].append(w.instance_id)
                busy_until[k] = max(busy_until[k], t)


def test_the_queue_hands_every_prompt_out_once_and_keeps_contexts_whole_and_in_order():
    rows = _rows(60, per_context=3)
    queue = WorkQueue(rows, 2)
    got: list[list[Work]] = [[], []]
    while True:
        out = [queue.take(k, 4) for k in (0, 1)]
        if all(o is None for o in out):
            break
        for k, o in enumerate(out):
            got[k] += o or []
            queue.ran_out(k)  # finished at once
    ids = sorted(w.instance_id for g in got for w in g)
    assert ids == sorted(w.instance_id for w in rows)
    for g in got:
        contexts = [w.context_id for w in g]
        for c in set(contexts):
            first = contexts.index(c)
            assert [w.instance_id for w in g[first:first + 3]] == [f"i{int(c[1:]) * 3 + j:04d}" for j in range(3)]


def test_a_replica_reads_each_prompt_knowing_how_many_shards_its_context_spans():
    """A SYNC context's prompts lie in its three tasks' shards: the reader gives each a share of its budget."""
    rows = [Work(f"{t}{k}", f"c{k}", 100, f"sync.{t}") for k in range(2) for t in ("a", "b", "c")]
    rows.append(Work("alone", "", 100, "ruler.vt"))
    assert reads(rows) == [(w.instance_id, w.shard, 3) for w in rows[:-1]] + [("alone", "ruler.vt", 1)]


def test_heaviest_contexts_go_out_first():
    rows = [Work(f"i{k}", f"c{k}", cost, "s") for k, cost in enumerate([10, 500, 40, 500, 10])]
    queue = WorkQueue(rows, 1)
    order = [w.instance_id for w in queue.take(0, 10)]
    assert order == ["i1", "i3", "i2", "i0", "i4"]  # equal costs keep the schedule's order


def test_a_replica_takes_an_open_shards_prompts_in_row_order_among_near_equal_costs():
    """Long prompts of one cell differ by a few tokens, so strictly heaviest first took a shard's rows in a
    scrambled order; on S3 a replica's reader reads a run of rows per request (`PromptReader._run`), so within
    the affinity slack the schedule's order wins, from the shard's first row (not its heaviest). Clearly heavier
    work still goes first."""
    costs = [1_000_000, 1_000_300, 999_800, 1_000_100, 1_000_200, 999_900]
    rows = [Work(f"i{k}", f"c{k}", cost, "s") for k, cost in enumerate(costs)]
    rows.append(Work("big", "cbig", 2_000_000, "t"))
    queue = WorkQueue(rows, 1)
    taken = [w.instance_id for _ in range(len(rows)) for w in queue.take(0, 1, finished=[])]
    assert taken == ["big", "i0", "i1", "i2", "i3", "i4", "i5"]  # a shard opened at its first row, then row order


def test_a_replica_holding_its_fair_share_waits_and_one_holding_nothing_always_gets_work():
    queue = WorkQueue(_rows(8), 2)
    first = queue.take(0, 100)
    assert len(first) == 4  # half of the pool's cost: the other replica gets the rest, not nothing
    assert queue.take(0, 100) == []  # held back until some of it finishes
    second = queue.take(1, 100)
    assert len(second) == 4
    # nothing left to hand out, but it waits: the other's work may yet move to it
    assert queue.take(0, 1, finished=[w.instance_id for w in first]) == []
    assert queue.take(1, 1, finished=[w.instance_id for w in second]) is None
    assert queue.take(0, 1) is None


def test_a_slow_replica_leaves_the_fast_one_almost_no_idle_time():
    # output budgets 16..512 as in the measurement; one replica at half speed
    costs = [16, 32, 64, 128, 256, 512]
    rows = [Work(f"i{k:03d}", f"c{k:03d}", 1024 + costs[k % 6], "s") for k in range(96)]
    busy, ran_on = _simulate(rows, [1.0, 0.5], slots=8)
    span = max(busy)
    idle = sum(span - b for b in busy) / (len(busy) * span)
    ideal = sum(w.cost for w in rows) / (8 * 1.5)  # total work / summed speeds
    assert idle <= 0.05, idle
    assert span <= 1.10 * ideal, (span, ideal)
    assert sum(1 for k in ran_on.values() if k == 0) > 1.5 * sum(1 for k in ran_on.values() if k == 1)
    # the static split leaves the fast replica idle a quarter of the time
    static = [sum(w.cost for w in a) / s / 8 for a, s in zip(assign(rows, 2), [1.0, 0.5], strict=True)]
    assert sum(max(static) - b for b in static) / (2 * max(static)) > 0.2


def _one_task_a_shard(weight: int) -> list[Work]:
    """The benchmark's workload (benchmarks/dispatch.py): six tasks of 8 prompts at 1K, each task's prompts in a
    shard of its own, output budgets 16..512 (RULER's length counts the budget: prompt = 1024 - budget)."""
    return [Work(f"t{t}-{k}", f"t{t}-{k}", 1024 - budget + weight * budget, f"task{t}", budget=budget, weight=weight)
            for t, budget in enumerate([16, 32, 64, 128, 256, 512]) for k in range(8)]


def test_output_tokens_weigh_more_than_prompt_tokens_so_long_answers_go_first_to_every_replica():
    """An engine prefills many prompt tokens a step and generates one token per answer a step. With both counted
    alike every prompt here cost about 1,024: the order was shard by shard, and the slow replica's first batch (taken
    before any speed is known) was all 512-token answers, its fast peer ran the rest and sat idle a third of the
    time. Weighed as `cost_of` does, the long answers go out first to both replicas."""
    rows = _one_task_a_shard(dispatch.OUTPUT_WEIGHT)
    assert [w.cost for w in rows[::8]] == [dispatch.cost_of(1024 - b, b) for b in [16, 32, 64, 128, 256, 512]]
    queue = WorkQueue(rows, 2)
    firsts: list[list[int]] = [[], []]
    for _ in range(8):  # two engines that came up together ask in turn
        for k in (0, 1):
            firsts[k] += [w.budget for w in queue.take(k, 1, now=0.0)]
    assert all(sorted(first) == [256] * 4 + [512] * 4 for first in firsts), firsts

    def seconds(w: Work) -> float:  # the simulated engines' truth: an output token takes 8 prompt tokens' time
        return w.prompt_cost + 8 * w.budget

    def idle(busy: list[float]) -> float:
        return sum(max(busy) - b for b in busy) / (len(busy) * max(busy))

    weighed, _ = _simulate(rows, [1.0, 0.5], slots=8, seconds=seconds)
    alike, _ = _simulate(_one_task_a_shard(1), [1.0, 0.5], slots=8, seconds=seconds)
    assert idle(weighed) <= 0.05 and idle(alike) > 0.15, (weighed, alike)


def test_a_dead_replicas_unfinished_work_goes_back_to_the_front_for_any_replica():
    rows = _rows(12, per_context=2)
    queue = WorkQueue(rows, 2)
    mine = queue.take(0, 4)
    left, finished = queue.give_back(0, done={mine[0].instance_id, mine[1].instance_id})
    assert finished == 2 and [w.instance_id for w in left] == [w.instance_id for w in mine[2:]]
    again = queue.take(1, 2)
    assert [w.instance_id for w in again] == [w.instance_id for w in mine[2:4]]  # first in line, context whole


def test_a_replica_given_up_for_dead_that_asks_again_gets_nothing_and_holds_nothing():
    """Its host's link came back after Ray marked the node dead: the old life's asks are answered None and leave
    the queue as it was, so the other replica takes its work and is never kept waiting on it; its restart (the
    next life) takes work as any replica does."""
    rows = _rows(12, per_context=2)
    queue = WorkQueue(rows, 2)
    mine = queue.take(1, 4)
    left, _ = queue.give_back(1, done=set(), next_life=1)
    assert left == mine
    assert queue.take(1, 4, life=0) is None and queue.remaining() == 12
    again = queue.take(0, 12)
    assert {w.instance_id for w in again} >= {w.instance_id for w in mine}  # first in line
    assert queue.take(1, 4, life=0, finished=[mine[0].instance_id]) is None
    ran = [w.instance_id for w in again]
    while (got := queue.take(0, 12, finished=ran[-len(again):])) is not None:  # never [] for the dead life's sake
        assert got, "replica 0 was kept waiting"
        again = got
        ran += [w.instance_id for w in got]
    assert sorted(ran) == sorted(w.instance_id for w in rows)
    assert queue.take(1, 4, life=1) is None  # its restart finds the queue empty, as any replica would


def test_a_retired_replicas_work_is_not_passed_on_and_its_share_goes_to_the_others():
    rows = _rows(8)
    queue = WorkQueue(rows, 2)
    mine = queue.take(0, 2)
    left, _ = queue.give_back(0, done=set(), requeue=False)
    queue.retire(0)
    assert left == mine and queue.remaining() == 6
    assert len(queue.take(1, 100)) == 6  # the only active replica: its fair share is everything left


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 2000)), min_size=1, max_size=40),
       st.integers(1, 4), st.integers(1, 8))
def test_the_queue_never_loses_or_repeats_a_prompt_whatever_the_speeds(contexts, replicas, slots):
    rows = [Work(f"i{c}-{j}", f"c{c}", cost, "s") for c, (n, cost) in enumerate(contexts) for j in range(n)]
    _, ran_on = _simulate(rows, [1.0 + k for k in range(replicas)], slots)
    assert sorted(ran_on) == sorted(w.instance_id for w in rows)


def _readers_per_shard(monkeypatch: pytest.MonkeyPatch, slack: float) -> float:
    """Two equal replicas of 4 slots over 20 shards of 10 contexts each (costs within 5 % of one another): how
    many replicas take prompts from a shard, on average."""
    monkeypatch.setattr(dispatch, "AFFINITY_SLACK", slack)
    rows = [Work(f"i{s:02d}-{c}", f"c{s:02d}-{c}", 1000 + (s * 7 + c * 13) % 50, f"shard{s:02d}")
            for s in range(20) for c in range(10)]
    _, ran_on = _simulate(rows, [1.0, 1.0], slots=4)
    readers: dict[str, set[int]] = {}
    for w in rows:
        readers.setdefault(w.shard, set()).add(ran_on[w.instance_id])
    return sum(len(r) for r in readers.values()) / len(readers)


def test_a_replica_stays_on_the_shards_it_has_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 every replica that reads a shard pays its requests (a HEAD and range GETs): with shard affinity
    about one replica reads each shard; taking strictly the heaviest context first, nearly both do."""
    assert _readers_per_shard(monkeypatch, dispatch.AFFINITY_SLACK) <= 1.2
    assert _readers_per_shard(monkeypatch, 0.0) >= 1.8


def test_affinity_prefers_a_shard_the_replicas_reader_still_has_open_over_one_it_let_go():
    """A reader keeps the last `OPEN_SHARDS` shards; a shard taken from longer ago would be read again."""
    first = [Work(f"a{i}", f"a{i}", 100, f"s{i:02d}") for i in range(OPEN_SHARDS + 2)]
    later = [Work("b0", "b0", 50, "s00"), Work("b-last", "b-last", 50, f"s{OPEN_SHARDS + 1:02d}")]
    queue = WorkQueue([*first, *later], replicas=1)
    taken = [queue.take(0, room=1) for _ in first]
    assert [w.shard for [w] in taken] == [w.shard for w in first]
    assert [w.instance_id for w in queue.take(0, room=1)] == ["b-last"]  # s00 was let go; s13 is open


def test_a_replica_finishes_a_shard_before_it_opens_the_next_however_long_the_queue():
    """1,000 contexts of about one cost (a length's cell at 10x the samples), far more than `AFFINITY_LOOKAHEAD`:
    the replica's next context from its open shards is found wherever it lies in the queue. A scan of the queue's
    head missed them, so a replica left 21 shards part-taken at once and its reader held all their row groups."""
    rows = [Work(f"i{s:02d}-{c:02d}", f"c{s:02d}-{c:02d}", 16_000 + (s * 7919 + c * 104_729) % 800, f"shard{s:02d}")
            for s in range(40) for c in range(25)]
    assert len(rows) > 3 * dispatch.AFFINITY_LOOKAHEAD
    queue = WorkQueue(rows, replicas=1)
    left = {f"shard{s:02d}": 25 for s in range(40)}
    part_taken: set[str] = set()
    most = 0
    while (got := queue.take(0, 1)) is not None:
        for w in got:
            left[w.shard] -= 1
            part_taken.add(w.shard)
            if not left[w.shard]:
                part_taken.discard(w.shard)
        most = max(most, len(part_taken))
    assert most == 1 and not any(left.values())
    _, ran_on = _simulate(rows, [1.0, 1.0], slots=4)  # and two replicas still split the shards between them
    readers: dict[str, set[int]] = {}
    for w in rows:
        readers.setdefault(w.shard, set()).add(ran_on[w.instance_id])
    assert sum(len(r) for r in readers.values()) / len(readers) <= 1.2


def test_the_queue_keeps_a_bounded_trace_of_its_latest_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """What each ask got, held and was allowed (its share), for reading a straggler after a run; bounded, so a
    pool of any size keeps only its end."""
    monkeypatch.setattr(dispatch, "TRACE_EVENTS", 5)
    queue = WorkQueue(_rows(8), 2)
    first = queue.take(0, 100, now=10.0)
    assert queue.take(0, 1, now=11.0) == []
    base = {"replica": 0, "finished": 0, "held_cost": 400, "share": 400, "queued": 4, "speeds": None}
    assert queue.events() == [{**base, "t": 0.0, "took": 4, "took_cost": 400}]  # not the ask that got nothing
    second = queue.take(1, 100, now=12.0)
    assert queue.take(1, 1, finished=[w.instance_id for w in second], now=13.0) == []
    assert queue.take(0, 1, finished=[w.instance_id for w in first], now=13.0) is None
    assert queue.events()[-1] | {"share": 0, "speeds": None} == {
        **base, "t": 3.0, "finished": 4, "took": None, "took_cost": 0, "held_cost": 0, "share": 0, "queued": 0}
    for k in range(10):
        queue.take(1, 1, now=14.0 + k)
    assert len(queue.events()) == 5 and queue.events()[-1]["t"] == 13.0


def _one_asked_back() -> WorkQueue:
    """Replica 1 (slow) took c0000 and c0001 at t=0 and finished i0000 at t=20 (5/s a prompt); replica 0 (fast)
    finished c0002 and c0003 by t=5 (20/s). At t=20 it would finish c0001 by t=30, replica 1 by t=40: c0001 is
    asked back."""
    queue = WorkQueue(_rows(8, per_context=2), 2)
    slow, fast = queue.take(1, 4, now=0.0), queue.take(0, 4, now=0.0)
    assert [w.context_id for w in slow] == ["c0000", "c0000", "c0001", "c0001"]
    assert queue.take(0, 4, finished=[w.instance_id for w in fast], now=5.0) == []  # no speed for the other yet
    assert queue.take(1, 1, finished=["i0000"], now=20.0) is None  # nothing to take; it runs what it holds
    assert queue.take(0, 4, now=20.0) == []  # waits for the work moved to it
    return queue


def test_a_slow_replica_gives_the_context_it_would_finish_last_to_a_free_one_that_finishes_it_sooner():
    """With nothing left to hand out, the replica that would finish last is asked for that context; once it
    gives it back (unfinished), only another replica may take it, and nothing is lost or run twice."""
    queue = _one_asked_back()
    assert queue.reclaims() == {1: ["i0002", "i0003"]}  # c0001, whole
    assert queue.take(0, 4, now=22.0) == []  # still on the slow replica: nothing to take yet
    assert queue.reclaims() == {1: ["i0002", "i0003"]}  # one context on its way at a time (`_moving`)
    # given back, and not to the one that gave it
    assert queue.take(1, 2, given_back=["i0002", "i0003"], now=23.0) == []
    assert [w.instance_id for w in queue.take(0, 4, now=23.0)] == ["i0002", "i0003"]
    assert queue.take(0, 1, now=23.5) == [] and queue.reclaims() == {1: ["i0001"]}  # then i0001, past its time
    # i0001 finished before the ask reached the engine: finished, not given back
    assert queue.take(1, 1, finished=["i0001"], now=24.0) == []  # it might still take work back: it waits
    assert queue.reclaims() == {}
    assert queue.take(0, 1, finished=["i0002", "i0003"], now=31.0) is None
    assert queue.take(1, 1, now=32.0) is None


def test_nothing_is_asked_back_that_the_free_replica_would_not_finish_first():
    queue = WorkQueue(_rows(3), 2)
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["i0000"]
    assert [w.instance_id for w in queue.take(0, 1, now=0.0)] == ["i0001"]
    assert [w.instance_id for w in queue.take(1, 1, finished=["i0000"], now=10.0)] == ["i0002"]  # 10/s: due at 20
    assert queue.take(0, 1, finished=["i0001"], now=12.0) == []  # 8.3/s: it would finish i0002 at 24
    assert queue.reclaims() == {}
    assert queue.take(1, 1, finished=["i0002"], now=20.0) is None
    assert queue.take(0, 1, now=21.0) is None


def test_a_prompt_past_its_time_is_taken_to_need_as_long_again():
    """LATE's estimate: replica 1 (10/s a prompt) took i0002 at t=10, due at t=20. At t=15 replica 0 (16.7/s) would
    finish it at t=21: it stays. At t=25 it is past its time, taken to end at t=40 there, and replica 0 would finish
    it by t=31: it is asked back."""
    queue = WorkQueue(_rows(3), 2)
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["i0000"]
    assert [w.instance_id for w in queue.take(0, 1, now=9.0)] == ["i0001"]
    assert [w.instance_id for w in queue.take(1, 1, finished=["i0000"], now=10.0)] == ["i0002"]
    assert queue.take(0, 1, finished=["i0001"], now=15.0) == [] and queue.reclaims() == {}
    assert queue.take(0, 1, now=25.0) == [] and queue.reclaims() == {1: ["i0002"]}


def test_work_moves_only_to_a_faster_replica_and_only_once():
    """A run of benchmarks/dispatch.py sent contexts from the fast replica to the slow one and back again, and the
    fast one ran them all from scratch."""
    queue = _one_asked_back()  # c0001 asked back from replica 1 (5/s) for replica 0 (20/s)
    queue.take(1, 2, given_back=["i0002", "i0003"], now=21.0)
    assert [w.instance_id for w in queue.take(0, 4, now=21.0)] == ["i0002", "i0003"]
    # long past their time on replica 0 now: the slower replica may not ask for them, nor may replica 0 again
    assert queue.take(1, 1, finished=["i0001"], now=200.0) == [] and queue.reclaims() == {}


def test_a_prompt_given_back_part_way_goes_out_with_its_answer_so_far():
    """The slow replica's engine had generated part of i0002's answer: the replica that takes it continues from
    there (`Work.resumed`), and the trace says how many tokens were not run again."""
    queue = _one_asked_back()
    queue.take(1, 2, given_back={"i0002": ([5, 6, 7], " so far"), "i0003": ([], "")}, now=21.0)
    moved = queue.take(0, 4, now=21.0)
    assert [(w.instance_id, w.resumed) for w in moved] == [("i0002", ((5, 6, 7), " so far")), ("i0003", None)]
    assert queue.events()[-1]["resumed_tokens"] == 3
    # should the taker die, its prompts go back to the queue with their answers so far, for the next one
    left, _ = queue.give_back(0, done=set())
    assert ("i0002", ((5, 6, 7), " so far")) in [(w.instance_id, w.resumed) for w in left]


def test_a_context_that_would_end_the_pool_late_is_asked_back_while_work_is_still_queued():
    """Replica 1 took i0000 and i0001 at t=0 and finished i0000 at t=20 (5/s a prompt); replica 0 runs a prompt
    every 5 s (20/s). At t=25 the pool would end at t=50 split by speed, and i0001, past its time, is taken to end
    at t=50 there: it stays. At t=30 it is taken to end at t=60, after the pool's t=51.4, and replica 0 would
    finish it by t=35: it is asked back though four prompts are still queued, and replica 0 goes on taking them."""
    queue = WorkQueue(_rows(12), 2)
    assert [w.instance_id for w in queue.take(1, 2, now=0.0)] == ["i0000", "i0001"]
    got = queue.take(0, 1, now=0.0)
    for t in (5.0, 10.0, 15.0, 20.0, 25.0, 30.0):
        if t == 20.0:
            assert [w.instance_id for w in queue.take(1, 1, finished=["i0000"], now=t)] == ["i0006"]
        got = queue.take(0, 1, finished=[got[0].instance_id], now=t)
        assert len(got) == 1  # queued work goes on being taken
        assert queue.reclaims() == ({1: ["i0001"]} if t == 30.0 else {}), t
    assert queue.remaining() == 2 and queue.events()[-1]["asked_back"] == 1


def test_the_drivers_report_asks_early_between_the_faster_replicas_asks():
    """Replica 0 runs a prompt every 5 s; replica 1's answers grow half a token a second. At t=7 replica 0 is in
    the middle of a prompt and does not ask, but the driver's report of the replicas' progress, once a second,
    asks for i0000 (98 tokens left: 196 s there, 5 s on replica 0) with work still queued, though replica 1 has
    finished nothing yet: by cost run it is clearly slower (29 a second against 44). Made only on replica 0's
    asks, the ask would wait for its next prompt to finish, while replica 1 might take new prompts whose prefill
    holds up the give-back (33 s in a benchmark run); made only once replica 1 finished a prompt, it came at
    55-58 s in benchmark runs, and the long answers that then moved ended the pool 15-20 s after it ran out."""
    queue = WorkQueue([Work(f"i{k:04d}", f"c{k:04d}", 200, "s", budget=100) for k in range(12)], 2)
    assert [w.instance_id for w in queue.take(1, 2, now=0.0)] == ["i0000", "i0001"]
    got = queue.take(0, 1, now=0.0)
    queue.report({0: {got[0].instance_id: 10}, 1: {"i0000": 1, "i0001": 1}}, now=2.0)
    got = queue.take(0, 1, finished=[got[0].instance_id], now=5.0)
    assert queue.reclaims() == {}  # 40 a second each by cost run
    queue.report({0: {got[0].instance_id: 10}, 1: {"i0000": 3, "i0001": 3}}, now=7.0)
    assert queue.reclaims() == {1: ["i0000"]}
    assert queue.events()[-1] == {"t": 7.0, "replica": 0, "report": True, "asked_back": 1, "queued": 8}
    queue.report({1: {"i0000": 4, "i0001": 4}}, now=8.0)  # once
    assert len([e for e in queue.events() if e.get("report")]) == 1


def test_the_pools_end_counts_what_the_engines_ran_not_only_what_finished():
    """Replica 1 took four prompts at t=0 (170 prompt tokens, budget 30), prefilled them by t=8 and generates half
    a token a second per answer; replica 0 finishes a prompt every 6 s. At t=24 replica 1 finishes its first. By
    finished cost alone it ran 8.3 a second and the pool would end at t=77, after i0001 would end there (t=68);
    counting the prompts replica 1 prefilled and the tokens it generated, the pool ends at t=50, and i0001, its
    context that would end last, is asked back (replica 0 would run it in 6 s)."""
    queue = WorkQueue([Work(f"i{k:04d}", f"c{k:04d}", 200, "s", budget=30) for k in range(16)], 2)
    assert [w.instance_id for w in queue.take(1, 4, now=0.0)] == ["i0000", "i0001", "i0002", "i0003"]
    got = queue.take(0, 1, now=0.0)
    for t in range(2, 26, 2):
        if t % 6 == 0:
            got = queue.take(0, 1, finished=[got[0].instance_id], now=t)
        if t == 24:
            queue.take(1, 1, finished=["i0000"], now=t)
        queue.report({1: dict.fromkeys(queue.held(1), max(0, (t - 8) // 2))}, now=t)
        assert queue.reclaims() == ({1: ["i0001"]} if t == 24 else {}), t


def test_a_replicas_speed_counts_what_its_engine_ran():
    """Prompts of 200 (100 of them the budget). By t=20 replica 0 finished one; replica 1 finished none, but gave
    i0002 back 20 tokens in (120 run) and holds i0003, 10 tokens in (110 run). For its share and the pool's
    projected end replica 1 ran 11.5 a second, against 10; "clearly faster" goes by what was finished (and given
    back): 6."""
    queue = WorkQueue([Work(f"i{k:04d}", f"c{k:04d}", 200, "s", budget=100) for k in range(8)], 2)
    assert [w.instance_id for w in queue.take(0, 2, now=0.0)] == ["i0000", "i0001"]
    assert [w.instance_id for w in queue.take(1, 2, now=0.0)] == ["i0002", "i0003"]
    queue.take(0, 1, finished=["i0000"], now=10.0)
    queue.report({1: {"i0002": 5, "i0003": 10}}, now=15.0)
    queue.take(1, 1, given_back={"i0002": (tuple(range(20)), "so far")}, now=20.0)
    assert queue.events()[-1]["speeds"] == {0: 10.0, 1: 11.5}
    assert queue.speeds(20.0, ran=False) == {0: 10.0, 1: 6.0}


@pytest.mark.parametrize(("generated", "moves"), [(15, True), (98, False)])
def test_the_engines_progress_tells_which_answer_is_near_its_end(generated: int, moves: bool) -> None:
    """Replica 1 generates a token a second per answer, replica 0 twenty (from the progress each reports). At t=21
    i0001 (budget 100) is past its time on replica 1, so without progress it would be taken to need as long again
    and move. With 85 tokens left it moves (85 s there; a prefill and 4 s on replica 0); with 2 left it stays."""
    queue = WorkQueue([Work(f"i{k:04d}", f"c{k:04d}", 200, "s", budget=100) for k in range(4)], 2)
    assert [w.instance_id for w in queue.take(1, 2, now=0.0)] == ["i0000", "i0001"]
    assert [w.instance_id for w in queue.take(0, 1, now=0.0)] == ["i0002"]
    assert [w.instance_id for w in queue.take(0, 1, progress={"i0002": 10}, now=1.0)] == ["i0003"]
    queue.take(0, 1, progress={"i0002": 30, "i0003": 10}, now=2.0)
    assert queue.take(0, 1, finished=["i0002", "i0003"], now=4.0) == []
    queue.take(1, 1, progress={"i0000": 5, "i0001": generated - 10}, now=10.0)
    assert queue.take(1, 1, finished=["i0000"], progress={"i0001": generated}, now=20.0) is None
    assert queue.estimates.decode == {0: (20.0, 1.0), 1: (10.0, 10.0)}
    assert queue.take(0, 1, now=21.0) == []
    assert queue.reclaims() == ({1: ["i0001"]} if moves else {})


def test_answers_that_grow_faster_do_not_make_a_replica_faster():
    """Replica 0's answers grow ten tokens a second, replica 1's one, but both finish about the same cost a second
    (6.3 and 5.6 at t=18): nothing moves. (How fast answers grow follows what shares an engine's steps: two
    replicas of one speed measured 2.5 and 0.6 in a benchmark run.)"""
    queue = WorkQueue([Work(f"i{k:04d}", f"c{k:04d}", 100, "s", budget=100) for k in range(3)], 2)
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["i0000"]
    assert [w.instance_id for w in queue.take(0, 1, now=2.0)] == ["i0001"]
    queue.take(0, 1, progress={"i0001": 10}, now=3.0)
    queue.take(0, 1, progress={"i0001": 60}, now=8.0)
    assert [w.instance_id for w in queue.take(1, 1, finished=["i0000"], now=10.0)] == ["i0002"]
    assert queue.take(0, 1, finished=["i0001"], now=10.0) == [] and queue.reclaims() == {}  # no decode rate: r1
    queue.take(1, 1, progress={"i0002": 5}, now=12.0)
    assert queue.take(1, 1, progress={"i0002": 10}, now=17.0) is None  # nothing to take; it runs i0002
    assert queue.events()[-1]["decode"] == {0: 10.0, 1: 1.0}
    assert queue.take(0, 1, now=18.0) == [] and queue.reclaims() == {}


def test_progress_the_driver_reads_between_asks_counts_as_on_an_ask():
    """A full engine asks only when a prompt finishes; the driver reads every replica's progress once a second
    (`Replica.answers`) and reports it, so a slow replica's answers are tracked between its asks."""
    queue = WorkQueue([Work("i0", "c0", 200, "s", budget=100)], 1)
    assert [w.instance_id for w in queue.take(0, 1, now=0.0)] == ["i0"]
    queue.report({0: {"i0": 10}}, now=5.0)
    queue.report({0: {"i0": 30, "not-held": 5}, 7: {"x": 1}}, now=7.0)  # not its prompt, not a replica: ignored
    assert queue.estimates.decode[0] == (20.0, 2.0) and queue.estimates.generated == {"i0": (30, 7.0)}
    assert queue.take(0, 1, finished=["i0"], now=8.0) is None and queue.estimates.generated == {}


@pytest.mark.parametrize("end", ["ran_out", "give_back", "retire"])
def test_a_replica_let_go_leaves_no_progress_behind(end: str) -> None:
    """Whether its run ended, it died or it was retired, the progress of what it held is dropped: a prompt
    requeued after a death starts from nothing on its next replica, as its engine does."""
    queue = WorkQueue([Work(f"i{k}", f"c{k}", 200, "s", budget=100) for k in range(4)], 2)
    queue.take(0, 2, now=0.0)
    queue.report({0: {"i0": 10, "i1": 12}}, now=1.0)
    assert set(queue.estimates.generated) == {"i0", "i1"}
    getattr(queue, end)(0, *([set()] if end == "give_back" else []))
    assert queue.estimates.generated == {} and queue.estimates.handed_out == {}


def test_replicas_of_about_one_speed_do_not_trade_work():
    """Within `MOVE_SPEEDUP` of each other: replica 1 at 10/s a prompt, replica 0 at 12.5/s; i0002 is long past
    its time on replica 1, yet it stays."""
    queue = WorkQueue(_rows(3), 2)
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["i0000"]
    assert [w.instance_id for w in queue.take(0, 1, now=2.0)] == ["i0001"]
    assert [w.instance_id for w in queue.take(1, 1, finished=["i0000"], now=10.0)] == ["i0002"]
    assert queue.take(0, 1, finished=["i0001"], now=10.0) == []
    assert queue.take(0, 1, now=60.0) == [] and queue.reclaims() == {}
    assert MOVE_SPEEDUP > 12.5 / 10


def test_a_finished_prompt_that_was_asked_back_counts_as_finished_once():
    queue = _one_asked_back()
    assert queue.reclaims() == {1: ["i0002", "i0003"]}
    # it finished them before it saw the ask: they are done, not moved
    assert queue.take(1, 1, finished=["i0001", "i0002", "i0003"], now=22.0) is None
    assert queue.reclaims() == {} and queue.remaining() == 0
    assert queue.take(0, 2, now=23.0) is None


def test_a_replica_that_dies_after_giving_back_does_not_requeue_what_it_gave():
    queue = _one_asked_back()
    queue.take(1, 1, given_back=["i0002", "i0003"], now=22.0)
    left, finished = queue.give_back(1, done={"i0000"})
    assert [w.instance_id for w in left] == ["i0001"] and finished == 1
    taken = [w.instance_id for w in queue.take(0, 8, now=23.0)]
    taken += [w.instance_id for w in queue.take(0, 8, finished=taken, now=24.0)]
    assert taken == ["i0002", "i0003", "i0001"]  # each once, what was moved first
    assert queue.take(0, 8, finished=["i0001"], now=25.0) is None


@pytest.mark.parametrize("given_back_first", [True, False])
def test_a_move_meant_for_a_replica_that_dies_goes_to_any_replica(given_back_first: bool):
    """Replica 0 asked for c0001, then died (its host lost: it may never be placed again). What replica 1 gives
    back, before the death or after it (the ask had reached its engine), replica 1 may take again; nothing is
    asked back any more. Before, replica 1 could not take it, and the run waited for replica 0 forever."""
    queue = _one_asked_back()
    assert queue.reclaims() == {1: ["i0002", "i0003"]}
    if given_back_first:
        assert queue.take(1, 2, given_back=["i0002", "i0003"], now=21.0) == []  # for another replica
    queue.give_back(0, done={"i0004", "i0005", "i0006", "i0007"}, next_life=1)
    assert queue.reclaims() == {}
    if given_back_first:
        taken = [w.instance_id for w in queue.take(1, 4, now=23.0)]
    else:  # given back and taken again in one ask
        taken = [w.instance_id for w in queue.take(1, 4, given_back=["i0002", "i0003"], now=22.0)]
    assert taken == ["i0002", "i0003"]
    assert queue.take(1, 4, finished=["i0001", *taken], now=30.0) is None
    assert queue.remaining() == 0


def test_a_move_meant_for_a_replica_that_retires_goes_to_any_replica():
    queue = _one_asked_back()
    queue.take(1, 2, given_back=["i0002", "i0003"], now=21.0)
    queue.retire(0)
    assert [w.instance_id for w in queue.take(1, 4, now=22.0)] == ["i0002", "i0003"]


def _simulate_with_give_back(rows: list[Work], speeds: list[float], slots: int, *, ahead: list[int],
                             moves: bool = True, dies: tuple[int, float, bool] | None = None
                             ) -> tuple[list[float], dict[str, int]]:
    """As `_simulate`, with the replicas giving back what the queue asks for (the engine drops a prompt in flight),
    and replica k's first `ahead[k]` prompts taken before any other replica asks (a slow replica's first batch,
    committed before any speed is known); `moves=False`: the queue asks nothing back. `dies=(k, t, mid_move)`:
    replica k dies at time t with what it runs (as with its host: it is never placed again), and the driver gives
    its unfinished prompts back (`give_back`); `mid_move`: at the first move after t instead, half done (asked back
    and given back, not yet taken: a window a real replica's death can fall in). Fails if a prompt finishes
    twice."""
    queue = WorkQueue(rows, len(speeds), moves=moves)
    done: Counter[str] = Counter()
    dead: set[int] = set()
    running: list[list[tuple[float, Work]]] = [[] for _ in speeds]
    clock, busy_until, ran_on = 0.0, [0.0] * len(speeds), {}
    finished: list[list[str]] = [[] for _ in speeds]
    given: list[list[str]] = [[] for _ in speeds]
    stalled = 0

    def die(now: float, mid_move: bool) -> None:
        if dies is not None and not dead and now >= dies[1] and mid_move == dies[2]:
            dead.add(dies[0])
            running[dies[0]], finished[dies[0]], given[dies[0]] = [], [], []
            queue.give_back(dies[0], set(done), next_life=1)

    for k, n in enumerate(ahead):
        for w in queue.take(k, n, now=0.0) or []:
            running[k].append((w.cost / speeds[k], w))
            ran_on[w.instance_id] = k
    while True:
        for _ in range(50):  # asked back, given back, taken elsewhere: replicas ask again soon (`REASK_S`)
            for k, ids in queue.reclaims().items():
                for t, w in [item for item in running[k] if item[1].instance_id in ids]:
                    running[k].remove((t, w))
                    given[k].append(w.instance_id)
            if any(given):
                die(clock, mid_move=True)
            ended, waiting = 0, False
            for k in set(range(len(speeds))) - dead:
                while len(running[k]) < slots:
                    got = queue.take(k, 1, finished[k], now=clock, given_back=given[k])
                    finished[k], given[k] = [], []
                    ended += got is None
                    waiting |= got == []
                    if not got:
                        break
                    for w in got:
                        running[k].append((clock + w.cost / speeds[k], w))
                        ran_on[w.instance_id] = k
            if not (queue.reclaims() or queue.given_back_waiting()):
                break
        die(clock, mid_move=False)
        pending = [t for r in running for t, _ in r]
        if not pending:
            if ended == len(speeds) - len(dead):
                assert set(done.values()) <= {1}, [i for i, n in done.items() if n > 1]
                return busy_until, ran_on
            stalled += 1  # a replica asked before another reported: they ask again (`REASK_S`)
            assert stalled < 3, "replicas wait with nothing running anywhere"
            continue
        stalled = 0
        death = [dies[1]] if dies is not None and not dead and not dies[2] and dies[1] > clock else []
        clock = min(pending + [clock + 1.0] * waiting + death)
        for k in range(len(speeds)):
            for t, w in [item for item in running[k] if item[0] <= clock]:
                running[k].remove((t, w))
                finished[k].append(w.instance_id)
                done[w.instance_id] += 1
                busy_until[k] = max(busy_until[k], t)


def test_a_slow_replicas_first_batch_moves_to_the_free_replica_at_the_end() -> None:
    """The slow replica's first batch (the heaviest contexts, at a quarter of the other's speed) is taken before
    any speed is known: without giving work back the fast replica ran out with most of the pool's time to go."""
    costs = [100, 150, 200, 300]
    rows = [Work(f"i{k:03d}", f"c{k:03d}", costs[k % 4], "s") for k in range(24)]
    busy, ran_on = _simulate_with_give_back(rows, [1.0, 0.25], slots=8, ahead=[0, 8])
    assert sorted(ran_on) == sorted(w.instance_id for w in rows)
    kept, kept_on = _simulate_with_give_back(rows, [1.0, 0.25], slots=8, ahead=[0, 8], moves=False)

    def idle(busy: list[float]) -> float:
        return sum(max(busy) - b for b in busy) / (len(busy) * max(busy))

    assert idle(kept) > 0.3 and idle(busy) < 0.15, (kept, busy)
    assert max(busy) < 0.95 * max(kept)
    assert sum(1 for k in ran_on.values() if k == 1) < sum(1 for k in kept_on.values() if k == 1)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 2000)), min_size=1, max_size=30),
       st.lists(st.floats(0.1, 4.0), min_size=1, max_size=3), st.integers(1, 6))
def test_giving_back_never_loses_or_repeats_a_prompt(contexts, speeds, slots):
    rows = [Work(f"i{c}-{j}", f"c{c}", cost, "s") for c, (n, cost) in enumerate(contexts) for j in range(n)]
    _, ran_on = _simulate_with_give_back(rows, speeds, slots, ahead=[0] * len(speeds))
    assert sorted(ran_on) == sorted(w.instance_id for w in rows)


@settings(deadline=None, max_examples=80)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 2000)), min_size=2, max_size=30),
       st.lists(st.floats(0.1, 4.0), min_size=2, max_size=3), st.integers(1, 6), st.integers(0, 2),
       st.floats(0.0, 2000.0), st.booleans(), st.integers(0, 8))
def test_the_others_finish_a_replica_that_dies_for_good_whenever_it_dies(contexts, speeds, slots, victim, at,
                                                                          mid_move, ahead):
    """A replica that dies and is never placed again (its host lost), at any time, moves or no moves under way:
    the others run every prompt, none twice, and never wait for it."""
    rows = [Work(f"i{c}-{j}", f"c{c}", cost, "s") for c, (n, cost) in enumerate(contexts) for j in range(n)]
    _, ran_on = _simulate_with_give_back(rows, speeds, slots, ahead=[0] * (len(speeds) - 1) + [ahead],
                                         dies=(victim % len(speeds), at, mid_move))
    assert sorted(ran_on) == sorted(w.instance_id for w in rows)


def _one_long_answer_and_ten_short() -> list[Work]:
    """A prompt of 100 tokens with a 100-token budget, first in the queue, then ten of 100 with 10-token budgets."""
    return [Work("long", "long", 200, "s", budget=100)] + [Work(f"s{k}", f"s{k}", 110, "s", budget=10)
                                                          for k in range(10)]


def test_a_slower_replica_may_hold_what_it_runs_while_a_faster_ones_longest_answer_runs_out():
    """Replica 0 (twice as fast) holds a long answer with 90 tokens to go at a token a second: the pool ends no
    sooner than t=100. Split by speed alone replica 1 could hold a third of what is left (two short prompts) and
    would run out long before; it may hold what it runs by then."""
    queue = WorkQueue(_one_long_answer_and_ten_short(), 2)
    assert [w.instance_id for w in queue.take(0, 2, now=0.0)] == ["long", "s0"]
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["s1"]
    queue.report({0: {"long": 1}}, now=1.0)
    queue.report({0: {"long": 10}}, now=10.0)  # a token a second
    assert [w.instance_id for w in queue.take(0, 1, finished=["s0"], now=10.0)] == ["s2"]  # 22 a second
    # Replica 1 (11 a second) takes all seven left, 770 of cost (70 s) within the 90 s replica 0 still runs;
    # by speed alone it would take two (a third of 970 not yet run).
    assert len(queue.take(1, 8, finished=["s1"], now=10.0)) == 7


def test_a_faster_replicas_share_does_not_grow_with_a_slower_ones_long_answers():
    """The other way round: a slower replica's long answer would move (`_ask_back`), so it sets no floor; replica 0
    keeps its share by speed (22 against 20.6 a second, of the 984 not yet run), four short prompts, not all eight
    it would run while replica 1's long answer (95 tokens at 0.44 a second) runs out."""
    queue = WorkQueue(_one_long_answer_and_ten_short(), 2)
    assert [w.instance_id for w in queue.take(1, 2, now=0.0)] == ["long", "s0"]
    assert [w.instance_id for w in queue.take(0, 1, now=0.0)] == ["s1"]
    queue.report({1: {"long": 1}}, now=1.0)
    assert [w.instance_id for w in queue.take(0, 1, finished=["s1"], now=5.0)] == ["s2"]
    queue.report({1: {"long": 5, "s0": 1}}, now=10.0)
    assert len(queue.take(0, 8, finished=["s2"], now=10.0)) == 4


@pytest.mark.parametrize(("long_tokens", "moves"), [(4, False), (94, True)])
def test_no_context_moves_that_would_finish_where_it_is_before_the_askers_own_longest_answer(
        long_tokens: int, moves: bool) -> None:
    """Replica 0 ran three short prompts in 6 s, then took a long answer; replica 1, far slower, has 8 tokens of
    s0 to go at a token in 9 s (72 s). With the long answer at a token a second (96 s to go), moving s0 to replica
    0 would end the pool no sooner and leave replica 1 idle: it stays. With the long answer nearly done, it moves."""
    rows = [Work(f"s{k}", f"s{k}", 200, "s", budget=10) for k in range(4)] + [Work("long", "long", 150, "s",
                                                                                      budget=100)]
    queue = WorkQueue(rows, 2)
    assert [w.instance_id for w in queue.take(1, 1, now=0.0)] == ["s0"]
    assert [w.instance_id for w in queue.take(0, 1, now=0.0)] == ["s1"]
    queue.report({1: {"s0": 1}}, now=1.0)
    for t, done in ((2.0, "s1"), (4.0, "s2"), (6.0, "s3")):
        queue.take(0, 1, finished=[done], now=t)
    assert "long" in queue.held(0)
    queue.report({0: {"long": 1}}, now=7.0)
    queue.report({0: {"long": long_tokens}, 1: {"s0": 2}}, now=10.0)
    assert queue.take(0, 1, now=10.0) == []
    assert queue.reclaims() == ({1: ["s0"]} if moves else {})
