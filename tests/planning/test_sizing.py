"""Sizing: the arithmetic on cases small enough to check by hand, and the bounds it promises (replica memory set
by the in-flight window, never by the suite's size)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from longeval.config import load_config
from longeval.planning import sizing
from longeval.planning.capacity import find_model_arch, kv_cache_tokens
from longeval.planning.cost import call_cost
from longeval.planning.plan import make_plan
from longeval.planning.sizing import TaskFigures, figures_for, size_suite, task_figures
from longeval.store import row_group_reads as store
from longeval.tasks import TASKS, get_task

ENDS = (1024, 1048576)
ROUND = TaskFigures(lengths=ENDS, disk_bytes=tuple(100 + n for n in ENDS), cpu_s=tuple(0.5 + 1e-6 * n for n in ENDS),
                    warmup_cpu_s=(2.0, 2.0), build_bytes_per_token=10.0, metadata_bytes=1000,
                    resident_bytes=5 * 2**20)
"""Round figures, linear between the two lengths (100 B + 1 B per token, 0.5 s + 1 us per token), so every expected
number below is a line of arithmetic."""

LLAMA_ON_A100 = ["model=llama31_8b", "cluster=a100_80gb", "suite=ruler"]


def _size(*overrides: str):
    cfg = load_config([*LLAMA_ON_A100, *overrides])
    plan = make_plan(cfg, check_data=False)
    return cfg, plan, size_suite(cfg, plan)


@pytest.fixture
def round_figures(monkeypatch):
    monkeypatch.setitem(task_figures(), "ruler/vt", ROUND)


def test_disk_is_instances_times_bytes_per_instance_and_grows_linearly(round_figures):
    _, _, s = _size("suite.tasks=[vt]", "suite.lengths=[4096,8192]", "suite.samples=50")
    assert s.instances_bytes == 50 * (100 + 4096) + 50 * (100 + 8192)
    assert s.tokens == 50 * 4096 + 50 * 8192
    assert s.cache_bytes == 0  # a local cache hard-links the run root's files
    _, _, on_s3 = _size("suite.tasks=[vt]", "suite.lengths=[4096,8192]", "suite.samples=50",
                        "store.root=s3://bucket/runs")
    assert on_s3.cache_bytes == on_s3.instances_bytes  # on S3 a server-side copy is a second object
    budget = get_task("ruler/vt").max_new_tokens
    row = sizing.PREDICTION_ROW_DISK + sizing.PREDICTION_DISK_PER_OUTPUT_TOKEN * budget
    assert s.predictions_bytes == round(100 * row)
    assert s.scores_bytes == round(100 * sizing.SCORE_ROW_DISK)

    _, _, ten = _size("suite.tasks=[vt]", "suite.lengths=[4096,8192]", "suite.samples=500")
    assert ten.instances_bytes == 10 * s.instances_bytes
    assert ten.predictions_bytes == pytest.approx(10 * s.predictions_bytes, abs=10)
    _, _, longer = _size("suite.tasks=[vt]", "suite.lengths=[4096,16384]", "suite.samples=50")
    assert longer.instances_bytes - s.instances_bytes == 50 * (16384 - 8192)  # 1 B per token of length

    _, _, uncached = _size("suite.tasks=[vt]", "suite.lengths=[4096]", "store.cache_instances=false")
    assert uncached.cache_bytes == 0


def test_generation_cpu_is_instances_times_seconds_plus_each_actors_warm_up(round_figures):
    cfg, plan, s = _size("suite.tasks=[vt]", "suite.lengths=[131072]", "suite.samples=100", "suite.shard_size=25")
    # 100 instances x (0.5 + 1e-6 x 131,072) s + 4 shards on 8 actors: 4 warm-ups of 2 s.
    assert s.generation_cpu_s == pytest.approx(100 * (0.5 + 0.131072) + 4 * 2.0)
    assert s.generation_actors == cfg.cluster.generate_parallelism == 8
    assert s.generation_wall_s == pytest.approx(s.generation_cpu_s / 8)
    # An actor holds one shard being built: 25 x 131,072 tokens x 10 B on top of its start (Ray's worker, the
    # tokenizer) and what the task keeps (5 MiB).
    assert s.generation_actor_bytes == sizing.GENERATION_ACTOR_START_BYTES + 5 * 2**20 + 25 * 131072 * 10


def test_an_actor_keeps_what_every_task_of_the_suite_loaded_counting_shared_corpora_once():
    """An actor builds any task of the suite and keeps each one's corpora: at suite (a)'s shape the plan counted
    the start and one task's, and the actor measured 1.8x its figure (benchmarks/README.md, "Suite (a)'s shape")."""
    known = task_figures()
    ruler = sorted(t for t in known if t.startswith("ruler/"))
    whole = sizing.family_resident()["ruler"]
    assert sum(known[t].resident_bytes for t in ruler) > whole > max(known[t].resident_bytes for t in ruler)
    assert sizing.actor_resident_bytes(set(ruler)) == whole  # the essays once, not once per task
    assert sizing.actor_resident_bytes({"ruler/vt"}) == known["ruler/vt"].resident_bytes
    sync = min(known["sync/connected_nodes"].resident_bytes, sizing.family_resident()["sync"])
    assert sizing.actor_resident_bytes({*ruler, "sync/connected_nodes"}) == whole + sync  # families add up
    unknown = sizing.actor_resident_bytes({"ruler/vt", "ruler/qa_1"})  # qa_1 needs a data file: not measured
    assert unknown == known["ruler/vt"].resident_bytes + max(f.resident_bytes for f in known.values())


def test_gpu_hours_are_call_cost_summed_over_every_call_on_its_pools_shape():
    cfg, plan, s = _size("suite.tasks=[vt,niah_single_1]", "suite.lengths=[4096,131072]", "suite.samples=20")
    arch = find_model_arch(cfg.model)
    expected = 0.0
    wall = s.generation_wall_s
    for pool in plan.pools:
        kv = kv_cache_tokens(cfg.model, placement=pool.placement)
        tp = pool.placement.tensor_parallel_size
        pool_s = 0.0
        for task in ("ruler/vt", "ruler/niah_single_1"):
            budget = get_task(task).max_new_tokens
            for length in pool.lengths:
                one = call_cost(arch, "a100_80gb", prompt_tokens=length - budget, output_tokens=budget,
                                tensor_parallel_size=tp, kv_cache_tokens=kv)
                pool_s += 20 * one.gpu_seconds
        expected += pool_s
        wall += pool_s / (pool.replicas * tp)  # the pool's GPU time spread over its GPUs
    assert s.gpu == "a100_80gb"
    assert s.gpu_cost.gpu_seconds == pytest.approx(expected)
    assert s.wall_s == pytest.approx(wall)
    assert [p.calls for p in s.pools] == [40, 40]


def test_replica_memory_is_set_by_the_window_not_by_the_suite():
    # From 5,000 samples on, the prompts of even the 4K pool fill the prompt reader's row-group budget.
    _, _, s = _size("suite.tasks=[vt,niah_single_2]", "suite.lengths=[4096,131072]", "suite.samples=5000")
    _, _, ten = _size("suite.tasks=[vt,niah_single_2]", "suite.lengths=[4096,131072]", "suite.samples=50000")
    assert all(p.row_group_bytes == store.PROMPT_GROUP_BYTES for p in s.pools)
    assert ten.instances_bytes == pytest.approx(10 * s.instances_bytes)
    assert [p.replica_bytes for p in ten.pools] == [p.replica_bytes for p in s.pools]
    assert ten.generation_actor_bytes == s.generation_actor_bytes
    assert ten.driver_parts["metadata"] == pytest.approx(10 * s.driver_parts["metadata"], rel=1e-6)  # rows, not tokens


def test_replica_memory_is_the_window_of_prompts_plus_one_shard_read_ahead_and_the_row_group_cache(round_figures):
    cfg, plan, s = _size("suite.tasks=[vt]", "suite.lengths=[131072]", "suite.samples=100", "cluster.inflight=6")
    (pool,) = s.pools
    assert pool.window == 6 and pool.longest == 131072
    per_token = sizing.PYLIST_BYTES_PER_TOKEN + sizing.ENGINE_BYTES_PER_TOKEN
    read_ahead = 25 * ((100 + 131072) + 131072 * sizing.IDS_ARROW_BYTES_PER_TOKEN)  # a shard's file and its ids
    input_batch = pool.tensor_parallel_size * pool.max_num_seqs * 131072 * sizing.INPUT_BATCH_BYTES_PER_SLOT_TOKEN
    row_groups = min(store.PROMPT_GROUP_BYTES, 100 * 131072 * sizing.IDS_ARROW_BYTES_PER_TOKEN)
    assert pool.read_ahead_bytes == read_ahead and pool.row_group_bytes == row_groups
    assert pool.replica_bytes == round(6 * 131072 * per_token + read_ahead + row_groups + input_batch)
    assert pool.replicas_per_node == min(pool.replicas, 8 // pool.tensor_parallel_size)
    assert s.replica_node_bytes == pool.replica_bytes * pool.replicas_per_node


def test_a_pool_of_shared_contexts_plans_a_row_group_budget_of_a_few_of_them():
    """SYNC's graph tasks share a context: at 1M three 4 MiB row groups in three shards, more than a replica's
    default budget holds runs of; the plan counts the budget the driver gives that pool's replicas."""
    def pools(tasks: str) -> dict:
        _, _, s = _size("model=ultralong8b_1m", f"suite.tasks=[{tasks}]", "suite.lengths=[131072,1048576]",
                        "suite.samples=100")
        return {p.lengths: p for p in s.pools}

    shared, alone = pools("connected_nodes,shortest_path,longest_path,vt"), pools("vt")
    assert shared[(1048576,)].row_group_bytes == store.PROMPT_CONTEXTS_AHEAD * 4 * 3 * 1048576
    assert alone[(1048576,)].row_group_bytes == store.PROMPT_GROUP_BYTES  # four 1M prompts fit the default
    assert shared[(131072,)].row_group_bytes == store.PROMPT_GROUP_BYTES
    extra = shared[(1048576,)].row_group_bytes - store.PROMPT_GROUP_BYTES
    assert shared[(1048576,)].replica_bytes - alone[(1048576,)].replica_bytes >= extra


def test_unknown_architecture_names_what_cannot_be_sized_and_still_sizes_disk():
    cfg = load_config(["model=tiny_random", "model.path=/nowhere/model", "suite.tasks=[vt]",
                       "suite.lengths=[4096]"])
    plan = make_plan(cfg, check_data=False)
    s = size_suite(cfg, plan)
    assert s.gpu is None and s.gpu_cost is None and s.wall_s is None
    assert all(p.replica_bytes is None for p in s.pools)
    assert len(s.unknown) == 1 and "architecture of 'tiny-random' is unknown" in s.unknown[0]
    assert "GPU-hours, wall time and replica memory" in s.unknown[0]
    assert s.instances_bytes > 0 and s.generation_cpu_s > 0  # what needs no model is still given


def test_a_task_without_measurements_is_sized_at_the_largest_figure():
    _, _, s = _size("suite.tasks=[qa_1]", "suite.lengths=[4096]", "suite.samples=10")
    assert s.unmeasured == ("ruler/qa_1",)
    upper = figures_for("ruler/qa_1")
    assert s.instances_bytes == round(10 * upper.disk(4096))
    for length in (4096, 65536, 131072, 1048576):
        assert upper.disk(length) == max(f.disk(length) for f in task_figures().values())
        assert upper.cpu(length) == max(f.cpu(length) for f in task_figures().values())


def test_figures_are_linear_between_measured_lengths_and_held_below_them():
    assert ROUND.disk(4096) == pytest.approx(100 + 4096)
    assert ROUND.disk(2 * 1048576) == pytest.approx(100 + 2 * 1048576)  # the last segment's slope beyond
    assert ROUND.disk(256) == 100 + 1024  # below the shortest: its value (figures grow with length)


def test_two_call_tasks_count_their_second_call():
    cfg = load_config(["model=llama31_8b", "cluster=a100_80gb", "suite=longbench_v2", "suite.samples=10"])
    plan = make_plan(cfg, check_data=False)
    s = size_suite(cfg, plan)
    assert s.followup_tasks == ("longbench_v2/longbench_v2",)
    assert s.calls == 20 and s.instances == 10
    assert "follow-up instances" in s.driver_parts


def test_measured_figures_are_for_registered_tasks_and_grow_with_length():
    figures = task_figures()
    assert figures, "run benchmarks/sizing_figures.py --write"
    for key, f in figures.items():
        assert key in TASKS, key
        assert f.disk(1048576) > f.disk(f.lengths[0]) > 0 and f.cpu(1048576) > 0 and f.build_bytes_per_token > 0
    assert sizing.PYLIST_BYTES_PER_TOKEN > sizing.IDS_ARROW_BYTES_PER_TOKEN
    assert "benchmarks/sizing_figures.py" in sizing.measured_on()


DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "h": 3600, "GPU-h": 3600}
SUITES = {
    "(a)": ["model=llama31_8b", "suite=ruler", "cluster=a100_80gb"],
    "(b)": ["model=ultralong8b_1m", "suite=ruler", "cluster=a100_80gb",
            "suite.lengths=[4096,8192,16384,32768,65536,131072,262144,524288,1048576]"],
    "(c)": ["model=ultralong8b_1m", "suite=michelangelo_1m", "cluster=a100_80gb"],
}


def _documented(block: str, label: str) -> object:
    """The figure of row `label` as a value with the precision it is written to (1.1 GiB: 1.05 to 1.15 GiB)."""
    found = re.search(rf"^\| {re.escape(label)} \| ([\d.,]+) ({'|'.join(UNITS)})\b", block, re.MULTILINE)
    assert found, f"docs/operations.md has no row {label!r} for this suite"
    number, unit = found.group(1).replace(",", ""), UNITS[found.group(2)]
    decimals = len(number.partition(".")[2])
    return pytest.approx(float(number) * unit, abs=0.5 * 10**-decimals * unit * 1.001)


@pytest.mark.parametrize("suite", list(SUITES))
def test_the_docs_sizing_tables_are_what_longeval_plan_prints(suite):
    """docs/operations.md ("Three suites on 8 x A100 80GB") shows `longeval plan`'s figures: re-measured figures
    (benchmarks/sizing_figures.py --write) or a changed model mean updating those tables."""
    text = DOCS.read_text(encoding="utf-8")
    start = text.index(f"**{suite} ")
    end = min((text.index(f"**{other} ") for other in SUITES if text.index(f"**{other} ") > start), default=len(text))
    block = text[start:end]
    cfg = load_config(SUITES[suite])
    s = size_suite(cfg, make_plan(cfg, check_data=False))
    pool = s.pools[-1]
    for label, value in (("disk: instances", s.instances_bytes), ("disk: total", s.disk_bytes),
                         ("memory: driver", s.driver_bytes), ("memory: generation actor", s.generation_actor_bytes),
                         ("memory: head node", max(s.replica_node_bytes, s.generation_node_bytes) + s.driver_bytes),
                         ("GPU", s.gpu_cost.gpu_seconds), ("wall time", s.wall_s)):
        assert value == _documented(block, label), label
    longest = f"memory: replica, {'32K–128K' if pool.longest == 131072 else '256K–1M'} pool"
    assert pool.replica_bytes == _documented(block, longest)


def test_a_replica_pulling_work_holds_max_num_seqs_prompts_and_one_given_a_list_twice_that():
    """Dynamic dispatch takes a context when the engine has a free slot; a static list keeps the next batch ready."""
    overrides = ("suite.tasks=[vt]", "suite.lengths=[131072]", "suite.samples=100")
    _, _, dynamic = _size(*overrides)
    _, _, static = _size(*overrides, "cluster.dispatch=static")
    (d,), (s,) = dynamic.pools, static.pools
    assert d.window == d.max_num_seqs and s.window == 2 * s.max_num_seqs
    per_token = sizing.PYLIST_BYTES_PER_TOKEN + sizing.ENGINE_BYTES_PER_TOKEN
    assert s.replica_bytes - d.replica_bytes == round(d.max_num_seqs * 131072 * per_token)


def test_the_stand_in_engines_pools_are_sized_as_the_replica_sizes_them_without_vllms_copies_or_gpu_time():
    """`longeval plan` for a scale run (`benchmarks/scale.py`) predicts what the harness measures: the planner's
    max_num_seqs per pool, the replica's own list of ids and its reads, and no vLLM copies, input batch or GPU."""
    overrides = ["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[4096,131072]", "suite.samples=100",
                 "cluster.bucket_edges=[8192]", "model.max_model_len=131072"]
    vllm_cfg = load_config(overrides)
    stand_in_cfg = load_config([*overrides, "model.engine=stand_in", "model.name=stand-in"])
    vllm, stand_in = (size_suite(c, make_plan(c, check_data=False)) for c in (vllm_cfg, stand_in_cfg))
    assert stand_in.gpu_cost is None and stand_in.wall_s is None and all(p.cost is None for p in stand_in.pools)
    for v, s in zip(vllm.pools, stand_in.pools, strict=True):
        assert s.window == v.window and s.max_num_seqs == v.max_num_seqs and s.window  # the same planner
        assert s.bytes_per_token == sizing.PYLIST_BYTES_PER_TOKEN
        assert s.replica_bytes == round(s.window * s.longest * sizing.PYLIST_BYTES_PER_TOKEN + s.read_ahead_bytes
                                        + s.row_group_bytes)
        assert s.replica_bytes < v.replica_bytes
