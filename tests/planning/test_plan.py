"""Planning: shards cover every instance exactly once; nothing runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from longeval.config import load_config
from longeval.errors import ConfigError
from longeval.planning.plan import adaptive_threshold, check_config, make_plan, size_pool
from longeval.tasks import FAMILIES, Threshold


def test_shards_cover_every_instance_once():
    cfg = load_config(["suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,4096]", "suite.samples=7",
                       "suite.shard_size=3"])
    plan = make_plan(cfg)
    assert plan.instances == 2 * 2 * 7
    assert len(plan.shards) == 2 * 2 * 3
    covered = {(s.task, s.target_length, i) for s in plan.shards for i in range(s.start, s.stop)}
    assert len(covered) == plan.instances
    assert len({s.name for s in plan.shards}) == len(plan.shards)


def test_a_shuffled_plan_lays_each_cell_out_in_a_seeded_random_order():
    """`suite.shuffle` (adaptive runs): a cell's shards hold all its indices once, in an order fixed by the seed,
    shared by tasks that share contexts, and a cell's first shards are spread over the generators' cycles."""
    base = ["suite=ruler", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024]", "suite.samples=400",
            "suite.adaptive=true"]
    plan = make_plan(load_config(base), check_data=False)
    assert all(s.shuffled and s.population == 400 and s.stop - s.start == 10 for s in plan.shards)
    for task in ("ruler/niah_single_1", "ruler/vt"):
        held = [i for s in plan.shards if s.task == task for i in s.indices()]
        assert sorted(held) == list(range(400)) and held != list(range(400))
    first = [s for s in plan.shards if s.task == "ruler/niah_single_1"][:4]
    depths = {i % 40 for s in first for i in s.indices()}  # RULER NIAH's depth cycle: index order would give 0..39
    assert min(depths) < 10 and max(depths) >= 30
    again = make_plan(load_config(base), check_data=False)
    assert [s.indices() for s in again.shards] == [s.indices() for s in plan.shards]
    other = make_plan(load_config([*base, "suite.seed=7"]), check_data=False)
    assert [s.indices() for s in other.shards] != [s.indices() for s in plan.shards]
    sync = make_plan(load_config(["suite.tasks=[connected_nodes,shortest_path]", "suite.lengths=[4096]",
                                  "suite.samples=30", "suite.adaptive=true"]), check_data=False)
    orders = {s.task: s.indices() for s in sync.shards if s.shard_index == 0}
    assert len({tuple(v) for v in orders.values()}) == 1  # one context group: the same contexts first
    plain = make_plan(load_config(base[:-1]), check_data=False)
    assert not plain.shards[0].shuffled and plain.shards[0].indices() == list(range(25))


def test_pool_caps_max_model_len_at_the_models_limit():
    plan = make_plan(load_config(["suite.lengths=[1024,16384]", "suite.allow_too_long=true"]))
    assert plan.pools[0].max_model_len == 8192
    plan = make_plan(load_config(["suite.lengths=[1024,2048]"]))
    assert plan.pools[0].max_model_len == 2048


def test_qa_without_data_is_refused_at_plan_time():
    with pytest.raises(ConfigError, match="suite.data.hotpotqa_path"):
        make_plan(load_config(["suite.tasks=[qa_2]"]))


def test_bucket_edges_split_lengths_into_contiguous_pools():
    cfg = load_config(["model=llama31_8b", "suite=ruler", "suite.tasks=[vt]", "cluster.bucket_edges=[16384]"])
    pools = make_plan(cfg).pools
    assert [p.lengths for p in pools] == [(4096, 8192, 16384), (32768, 65536, 131072)]
    assert [p.max_model_len for p in pools] == [16384, 131072]


def test_stacked_subsets_add_their_counts_per_length():
    """Michelangelo §3.2: three subsets of 9 samples over 4K..1M; short lengths get samples from all three."""
    cfg = load_config(["model=ultralong8b_1m", "suite=michelangelo_1m", "suite.samples=9", "suite.shard_size=100",
                       "suite.subsets=[32k,128k,1m]"])
    counts = {}
    for shard in make_plan(cfg).shards:
        if shard.task == "michelangelo/idk":
            counts[shard.target_length] = counts.get(shard.target_length, 0) + shard.stop - shard.start
    # 32k: 9 over 4 lengths -> 3,2,2,2; 128k: 9 over 6 -> 2,2,2,1,1,1; 1m: 9 over 9 -> 1 each
    assert counts == {4096: 6, 8192: 5, 16384: 5, 32768: 4, 65536: 2, 131072: 2, 262144: 1, 524288: 1,
                      1048576: 1}


def test_unknown_subset_is_refused():
    with pytest.raises(ConfigError, match="suite.subsets has '64k'; choices: 32k, 128k, 1m"):
        load_config(["suite=michelangelo", "suite.subsets=[64k]"])


def test_without_a_gpu_pools_only_override_max_model_len():
    cfg = load_config(["model=llama31_8b", "suite=ruler", "suite.tasks=[vt]", "cluster.bucket_edges=[16384]"])
    short, long = make_plan(cfg).pools
    assert (short.placement, short.max_num_seqs, short.max_num_batched_tokens) == (None, None, None)
    assert short.engine_overrides(cfg.model) == {"max_model_len": 16384}
    assert long.engine_overrides(cfg.model) == {}


def test_gpu_planning_sets_each_pools_engine():
    """UltraLong-8B-1M on 8 x H100, from its preset's architecture block alone (no weights at /models here)."""
    cfg = load_config(["model=ultralong8b_1m", "suite=michelangelo_1m", "cluster=h100_80gb"])
    pools = make_plan(cfg, check_data=False).pools
    assert [p.lengths for p in pools] == [(4096, 8192, 16384), (32768, 65536, 131072), (262144, 524288, 1048576)]
    assert [(p.tensor_parallel_size, p.replicas, p.gpus_per_replica) for p in pools] == [(1, 8, 1.0), (1, 8, 1.0),
                                                                                          (4, 2, 4.0)]
    # 81,559 MiB x 0.9 = 76,968,728,986 B per GPU. At 1,048,576 tokens (128 GiB of KV cache) TP 1 keeps 439,604
    # tokens and TP 2 2 x 33,180,345,634 B / 65,536 B = 1,012,456: neither holds one sequence. TP 4: weights
    # 4,015,130,624 B, activations 16,384 x (8,192 + 3 x 14,336 / 4) x 2 = 620,756,992 B + 1.5 GiB overhead leave
    # 70,722,228,634 B per GPU / 32,768 B per token per GPU = 2,158,271 tokens: 2 sequences, 2 replicas.
    assert pools[2].placement.kv_tokens_per_replica == 2158271
    assert pools[2].placement.sequences_fit == 2
    assert pools[0].engine_overrides(cfg.model) == {"max_model_len": 16384, "max_num_seqs": 26,
                                                    "max_num_batched_tokens": 16384}
    assert pools[2].engine_overrides(cfg.model) == {"tensor_parallel_size": 4, "max_num_seqs": 2,
                                                    "max_num_batched_tokens": 16384}
    assert all(p.warnings == () for p in pools)
    make_plan(cfg, check_data=False).check_fits()


def test_a_pool_that_fits_nowhere_fails_the_fit_check():
    cfg = load_config(["model=ultralong8b_1m", "suite=michelangelo_1m", "cluster=a40_48gb", "cluster.num_gpus=1"])
    plan = make_plan(cfg, check_data=False)
    assert [p.placement.fits for p in plan.pools] == [True, True, False]
    with pytest.raises(ConfigError, match="pool2: does not fit: one sequence of 1,048,576 tokens needs 128.0 GiB"):
        plan.check_fits()


@pytest.mark.parametrize("model", ["ultralong8b_1m", "llama31_8b", "llama33_70b_tp8", "qwen25_7b_1m",
                                   "qwen25_14b_1m"])
def test_presets_plan_their_lengths_on_8_a100_80gb(model):
    """Every GPU preset at its own max_model_len plans with no warning; the 1M one at michelangelo_1m's 1M."""
    suite = ["suite=michelangelo_1m"] if model == "ultralong8b_1m" else ["suite=ruler", "suite.tasks=[vt]"]
    cfg = load_config([f"model={model}", *suite, "cluster=a100_80gb", "cluster.num_gpus=8",
                       "cluster.bucket_edges=[131072]"])
    cfg.suite.lengths = [n for n in cfg.suite.lengths if n <= cfg.model.max_model_len] + [cfg.model.max_model_len]
    plan = make_plan(cfg, check_data=False)
    plan.check_fits()
    assert plan.pools[-1].max_model_len == cfg.model.max_model_len
    assert all(p.warnings == () for p in plan.pools), [p.warnings for p in plan.pools]


def test_a_length_beyond_max_model_len_is_refused_naming_both_numbers():
    cfg = load_config(["model=qwen25_7b_1m", "suite=michelangelo_1m", "cluster=a100_80gb"])
    with pytest.raises(ConfigError) as refused:
        make_plan(cfg)
    text = str(refused.value)
    assert "suite.lengths has 1,048,576 tokens but qwen2.5-7b-instruct-1m's model.max_model_len is 262,144" in text
    assert "every instance at 524,288, 1,048,576 would be prompt_too_long" in text
    assert "set suite.allow_too_long=true" in text
    # A length equal to max_model_len fits: it counts input and output tokens.
    make_plan(load_config(["suite.tasks=[vt]", "suite.lengths=[4096,8192]"]))


def test_allow_too_long_keeps_recording_them():
    cfg = load_config(["suite.tasks=[vt]", "suite.lengths=[4096,16384]", "suite.allow_too_long=true",
                       "cluster.bucket_edges=[4096]"])
    plan = make_plan(cfg)
    assert [p.max_model_len for p in plan.pools] == [4096, 8192]  # 16384 planned, its pool capped at 8192
    assert {s.target_length for s in plan.shards} == {4096, 16384}


def test_a_dual_chunk_attention_checkpoint_is_refused_at_plan_time():
    qwen_dir = Path(__file__).parents[1] / "fixtures" / "models" / "Qwen2.5-7B-Instruct-1M"
    cfg = load_config(["model=qwen25_7b_1m", f"model.path={qwen_dir}", "suite.tasks=[vt]", "suite.lengths=[4096]"])
    with pytest.raises(ConfigError, match="cannot load a model whose config.json has dual_chunk_attention_config"):
        make_plan(cfg)
    cfg.model.engine = "openai"  # a server elsewhere may run its own vLLM: not ours to refuse
    make_plan(cfg)


def test_size_pool_from_the_prompts_on_gpu():
    """The 32K-128K pool of Llama-3.1-8B on 8 x A100 80GB: 442,203 tokens of KV cache
    (tests/planning/test_capacity.py)."""
    cfg = load_config(["model=llama31_8b", "suite=ruler", "suite.tasks=[vt]", "cluster=a100_80gb",
                       "cluster.bucket_edges=[16384]"])
    pool = make_plan(cfg, check_data=False).pools[1]
    assert (pool.max_model_len, pool.max_num_seqs) == (131072, 3)  # before sizing: full-length sequences
    # Mostly 32K prompts (+ the vt output budget): p90 32,798 -> 2,050 blocks of 16 = 32,800: 442,192 // 32,800 = 13.
    sized = size_pool(cfg, pool, [32768 + 30] * 90 + [131072] * 10)
    assert (sized.max_num_seqs, sized.max_num_batched_tokens) == (13, 16384)
    assert sized.engine_overrides(cfg.model)["max_num_seqs"] == 13
    assert size_pool(cfg, pool, [131072] * 100).max_num_seqs == 3
    assert size_pool(cfg, pool, []) is pool
    explicit = replace(cfg, model=replace(cfg.model, max_num_seqs=5))
    assert size_pool(explicit, pool, [32798] * 100).max_num_seqs == 5  # the user's number wins
    api = replace(cfg, model=replace(cfg.model, engine="openai"))
    assert size_pool(api, pool, [32798] * 100) is pool


def test_size_pool_on_cpu_from_the_kv_cache_space(tiny_model_path):
    """The tiny model (2 layers, 1 KV head, head_dim 64, float32): 1,024 B/token; VLLM_CPU_KVCACHE_SPACE=1 GiB
    is 8,192 blocks of 128 = 1,048,576 tokens. 4K prompts: 3 of them, so 3 sequences; capped at 256 for 300."""
    cfg = load_config(["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[4096]"])
    pool = make_plan(cfg).pools[0]
    assert pool.max_num_seqs is None
    assert size_pool(cfg, pool, [4000, 4096, 4096]).max_num_seqs == 3
    sized = size_pool(cfg, pool, [4096] * 300)
    assert (sized.max_num_seqs, sized.max_num_batched_tokens) == (256, None)  # vLLM's CPU default budget: 4,096
    assert sized.engine_overrides(cfg.model) == {"max_model_len": 4096, "max_num_seqs": 256}
    # An explicit max_num_seqs above vLLM's smallest default budget (2,048) gets a budget that covers it.
    many = replace(cfg, model=replace(cfg.model, max_num_seqs=3000))
    big = size_pool(many, pool, [4096] * 300)
    assert (big.max_num_seqs, big.max_num_batched_tokens) == (3000, 3000)


def test_an_adaptive_run_over_families_with_different_thresholds_asks_for_one(monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = ["model=tiny_random", "suite=quick", "suite.tasks=[niah_single_1,shortest_path]", "suite.adaptive=true"]
    assert adaptive_threshold(load_config(overrides)) == 85.6  # RULER's, and SYNC borrows it
    monkeypatch.setitem(FAMILIES, "sync", replace(FAMILIES["sync"], threshold=Threshold(60.0, "a test's own")))
    with pytest.raises(ConfigError, match=r"declare several \(ruler 85.6, sync 60\); set suite.effective_threshold"):
        check_config(load_config(overrides))
    assert adaptive_threshold(load_config([*overrides, "suite.effective_threshold=70"])) == 70.0
