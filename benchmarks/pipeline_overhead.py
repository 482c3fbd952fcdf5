"""Pipeline overhead: the same prompts through plain `vllm.LLM.generate` and through longeval's infer stage.

Generation is excluded (instances are generated first), and so is engine start: the pipeline's infer
wall time minus the engine start measured inside its actor, against the plain engine's generate time
for the same token-id prompts and sampling parameters. Target: ratio <= 1.15.

    python benchmarks/pipeline_overhead.py [--samples 4] [--lengths 1024 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--tasks", nargs="+", default=["niah_single_1", "niah_single_2", "vt", "fwe"])
    parser.add_argument("--model", default="smollm2_cpu")
    args = parser.parse_args()

    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    from longeval.config import load_config
    from longeval.models import resolve_model_path
    from longeval.pipeline import init_ray, make_plan, run
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
    from longeval.store import RunRoot

    root_dir = Path(tempfile.mkdtemp(prefix="le-overhead-"))
    overrides = [f"model={args.model}", f"suite.tasks=[{','.join(args.tasks)}]",
                 f"suite.lengths=[{','.join(map(str, args.lengths))}]", f"suite.samples={args.samples}",
                 f"suite.shard_size={args.samples}", f"store.root={root_dir}"]
    cfg = load_config(overrides)
    run(cfg, stages=("generate",))
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    n_prompts = len(instances)

    # 1. the whole infer stage (engine start measured inside the actor and subtracted)
    init_ray(cfg)
    started = time.perf_counter()
    run(cfg, stages=("infer",))
    pipeline_wall = time.perf_counter() - started
    records = sorted(Path(cfg.run_root, "engines").glob("*.json"))
    record = json.loads(records[-1].read_text()) if records else {}
    # The actor's start: `import vllm` in the fresh worker process plus building the engine.
    engine_start = record["engine_start_s"] + record.get("import_s", 0.0) if record else None
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)

    # 2. plain vLLM on the same token ids, same sampling, same batch size
    import vllm

    from longeval.engines.vllm_engine import engine_kwargs

    for key, value in cfg.model.env.items():
        os.environ.setdefault(key, str(value))
    pool = make_plan(cfg).pools[0]
    t0 = time.perf_counter()
    llm = vllm.LLM(**engine_kwargs(cfg.model, str(resolve_model_path(cfg.model.path)), pool.max_model_len))
    plain_start = time.perf_counter() - t0
    batch = cfg.cluster.batch_size
    t0 = time.perf_counter()
    plain_outputs = []
    batch_done: list[float] = []
    for i in range(0, n_prompts, batch):
        chunk = instances[i : i + batch]
        prompts = [vllm.TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in chunk]
        params = [vllm.SamplingParams(temperature=0.0, max_tokens=r["max_new_tokens"], seed=0) for r in chunk]
        plain_outputs += llm.generate(prompts, params, use_tqdm=False)
        batch_done.append(time.time())
    plain = time.perf_counter() - t0
    # Steady state: from the first finished batch to the last, in both (start-up of every kind excluded).
    parts = sorted(p.stat().st_mtime for p in Path(cfg.run_root, "predictions").glob("*.parquet"))
    pipe_steady = parts[-1] - parts[0] if len(parts) > 1 else float("nan")
    plain_steady = batch_done[-1] - batch_done[0] if len(batch_done) > 1 else float("nan")

    start = engine_start if engine_start is not None else plain_start
    pipeline = pipeline_wall - start
    same = sum(
        o.outputs[0].text == p
        for o, p in zip(plain_outputs, [dict(zip(preds["instance_id"].to_pylist(), preds["output"].to_pylist(),
                                                   strict=True))[r["instance_id"]] for r in instances], strict=True)
    )
    print(f"prompts: {n_prompts} ({', '.join(args.tasks)} at {args.lengths}), batch size {batch}, "
          f"load average {os.getloadavg()[0]:.1f}")
    actor = f"{engine_start:.1f}" if engine_start is not None else "n/a"
    print(f"engine start: pipeline actor {actor} s (import vllm + engine), plain {plain_start:.1f} s (engine)")
    print(f"plain vllm.LLM.generate: {plain:.1f} s")
    print(f"longeval infer stage:    {pipeline_wall:.1f} s wall, {pipeline:.1f} s without engine start")
    print(f"ratio pipeline/plain:    {pipeline / plain:.3f}  (whole stage less the actor's start; includes Ray "
          "Data start-up and the worker process spawn)")
    print(f"steady state, first to last finished batch ({len(parts) - 1} batches): pipeline {pipe_steady:.1f} s, "
          f"plain {plain_steady:.1f} s, ratio {pipe_steady / plain_steady:.3f}  (target <= 1.15)")
    print(f"identical outputs:       {same}/{n_prompts}")
    shutil.rmtree(root_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
