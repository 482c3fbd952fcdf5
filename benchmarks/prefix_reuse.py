"""Prefix reuse: a SYNC run on the embedded default with vLLM's prefix cache on and off.

The three tasks of a SYNC domain share one context, and the pipeline schedules them together, so with
prefix caching the engine should compute each context once and serve the other two prompts' contexts
from the cache. Prints prompt tokens, tokens served from the cache (from each prediction's
`cached_prompt_tokens`), and the infer-stage wall time of both runs (engine start excluded).
Targets: >= 60 % of prompt tokens from the cache for the 3-task groups, wall time <= 0.6x.

With `--replicas`, the cached run again on two replicas under the default dynamic dispatch (one node; with
`--two-nodes` also one replica on each node of a two-node loopback cluster): the work queue hands out a context's
prompts together, so each context should still be computed once. Target: their share of prompt tokens from the
cache >= 90 % of one replica's (issue #23).

    python benchmarks/prefix_reuse.py [--samples 3] [--lengths 4096] [--max-new-tokens 64] [--replicas [--two-nodes]]
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


def _infer(overrides: list[str], root_dir: Path, name: str) -> tuple[float, float, list[dict]]:
    """Generate, then time the infer stage alone; returns (wall s, engine start s, prediction rows)."""
    from longeval.cluster.ray_runtime import init_ray
    from longeval.config import load_config
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
    from longeval.run.pipeline import run
    from longeval.store.run_root import RunRoot

    cfg = load_config([*overrides, f"store.root={root_dir}", f"run_name={name}"])
    run(cfg, stages=("generate",))
    init_ray(cfg)
    started = time.perf_counter()
    run(cfg, stages=("infer",))
    wall = time.perf_counter() - started
    record = json.loads(sorted(Path(cfg.run_root, "engines").glob("*.json"))[-1].read_text())
    engine_start = record["engine_start_s"] + record.get("import_s", 0.0)
    root = RunRoot(cfg.run_root)
    meta = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "task", "context_id",
                                                                  "input_tokens"])
    preds = {r["instance_id"]: r for r in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}
    rows = [{**m, **preds[m["instance_id"]]} for m in meta.to_pylist()]
    return wall, engine_start, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3, help="contexts per domain and length")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="output budget (small: the benchmark is about prefill)")
    parser.add_argument("--model", default="smollm2_cpu")
    parser.add_argument("--replicas", action="store_true", help="also the cached run on two replicas")
    parser.add_argument("--two-nodes", action="store_true", help="with --replicas: also on two loopback nodes")
    args = parser.parse_args()

    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    root_dir = Path(tempfile.mkdtemp(prefix="le-prefix-"))
    base = [f"model={args.model}", "suite=sync_quick", f"suite.lengths=[{','.join(map(str, args.lengths))}]",
            f"suite.samples={args.samples}", f"suite.shard_size={args.samples}",
            f"suite.params.sync.max_new_tokens={args.max_new_tokens}"]
    results = {}
    for label, caching in (("cached", "true"), ("uncached", "false")):
        results[label] = _infer([*base, f"model.enable_prefix_caching={caching}"], root_dir, label)

    print(f"SYNC, 6 tasks x {args.samples} contexts per domain at {args.lengths}, output budget "
          f"{args.max_new_tokens}, load average {os.getloadavg()[0]:.1f}")
    for label, (wall, start, rows) in results.items():
        prompt = sum(r["input_tokens"] for r in rows)
        cached = sum(r["cached_prompt_tokens"] for r in rows)
        print(f"{label:>9}: {len(rows)} prompts, {prompt} prompt tokens, {cached} from the prefix cache "
              f"({100 * cached / prompt:.1f} %), infer {wall:.1f} s wall, {wall - start:.1f} s without engine "
              f"start ({start:.1f} s)")
    (cw, cs, _), (uw, us, _) = results["cached"], results["uncached"]
    print(f"wall-time ratio cached/uncached (engine start excluded): {(cw - cs) / (uw - us):.3f}  (target <= 0.6)")
    same = sum(a["output"] == b["output"] for a, b in zip(sorted(results["cached"][2], key=lambda r: r["instance_id"]),
                                                          sorted(results["uncached"][2],
                                                                 key=lambda r: r["instance_id"]), strict=True))
    print(f"identical outputs with and without the cache: {same}/{len(results['cached'][2])}")
    if args.replicas:
        _replicas([*base, "model.enable_prefix_caching=true"], root_dir, results["cached"][2], args.two_nodes)
    shutil.rmtree(root_dir, ignore_errors=True)


def _cached_share(rows: list[dict]) -> float:
    return sum(r["cached_prompt_tokens"] for r in rows) / sum(r["input_tokens"] for r in rows)


def _replicas(cached: list[str], root_dir: Path, one: list[dict], two_nodes: bool) -> None:
    """The cached run on two replicas (one node, then two loopback nodes): its cache share against one replica's."""
    import ray

    from longeval.cluster.launch import loopback_cluster

    two = ["cluster.replicas=2", "cluster.dispatch=dynamic"]
    ray.shutdown()
    runs = {"two replicas, one node": _infer([*cached, *two, "cluster.num_cpus=4"], root_dir, "two")}
    ray.shutdown()
    if two_nodes:
        with loopback_cluster(2) as cluster:
            runs["two replicas, two nodes"] = _infer(
                [*cached, *two, f"cluster.address={cluster.address}", "cluster.gpus_per_replica=1",
                 "store.shared_filesystem=true"], root_dir, "two-nodes")
            ray.shutdown()
    base = _cached_share(one)
    print(f"one replica: {100 * base:.1f} % of prompt tokens from the prefix cache")
    for label, (_, _, rows) in runs.items():
        share = _cached_share(rows)
        per = Counter(r["replica"] for r in rows)
        print(f"{label}: {100 * share:.1f} % from the cache, {share / base:.3f} of one replica's (target >= 0.90); "
              f"prompts per replica {dict(sorted(per.items()))}")


if __name__ == "__main__":
    main()
