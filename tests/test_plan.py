"""Planning: shards cover every instance exactly once; nothing runs."""

from __future__ import annotations

import pytest

from longeval.config import load_config
from longeval.errors import ConfigError
from longeval.plan import make_plan


def test_shards_cover_every_instance_once():
    cfg = load_config(["suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,4096]", "suite.samples=7",
                       "suite.shard_size=3"])
    plan = make_plan(cfg)
    assert plan.instances == 2 * 2 * 7
    assert len(plan.shards) == 2 * 2 * 3
    covered = {(s.task, s.target_length, i) for s in plan.shards for i in range(s.start, s.stop)}
    assert len(covered) == plan.instances
    assert len({s.name for s in plan.shards}) == len(plan.shards)


def test_pool_caps_max_model_len_at_the_models_limit():
    plan = make_plan(load_config(["suite.lengths=[1024,16384]"]))
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
    cfg = load_config(["suite=michelangelo_1m", "suite.samples=9", "suite.shard_size=100",
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
    """Qwen2.5-7B-1M on 8 x H100, from its preset's architecture block alone (no weights at /models here)."""
    cfg = load_config(["model=qwen25_7b_1m", "suite=michelangelo_1m", "cluster=h100_80gb"])
    pools = make_plan(cfg).pools
    assert [p.lengths for p in pools] == [(4096, 8192, 16384), (32768, 65536, 131072), (262144, 524288, 1048576)]
    assert [(p.tensor_parallel_size, p.replicas, p.gpus_per_replica) for p in pools] == [(1, 8, 1.0), (1, 8, 1.0),
                                                                                          (2, 4, 2.0)]
    # The 1M pool: 2,186,472 tokens of KV cache per TP-2 replica (worked out in tests/test_capacity.py).
    assert pools[2].placement.kv_tokens_per_replica == 2186472
    assert pools[0].engine_overrides(cfg.model) == {"max_model_len": 16384, "tensor_parallel_size": 1,
                                                    "max_num_batched_tokens": 16384}
    assert pools[2].engine_overrides(cfg.model) == {"tensor_parallel_size": 2}
    make_plan(cfg).check_fits()


def test_a_pool_that_fits_nowhere_fails_the_fit_check():
    cfg = load_config(["model=qwen25_7b_1m", "suite=michelangelo_1m", "cluster=a40_48gb", "cluster.num_gpus=1"])
    plan = make_plan(cfg)
    assert [p.placement.fits for p in plan.pools] == [True, True, False]
    with pytest.raises(ConfigError, match="pool2: does not fit: one sequence of 1,010,000 tokens needs 53.9 GiB"):
        plan.check_fits()
