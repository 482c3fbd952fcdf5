#!/usr/bin/env python
"""Benchmark of the instance cache: the generate stage's actor work with a cold cache, then a warm one.

Run from the repository root:

    .venv/bin/python benchmarks/instance_cache.py                         # 4 RULER tasks at 16K and 64K
    .venv/bin/python benchmarks/instance_cache.py --lengths 131072 --samples 8 --store s3://bucket/bench

It drives `pipeline.ShardGenerator` (what each Ray actor of the generate stage runs) directly, so the figures
are the work itself, without Ray's start-up: every shard of the plan generated and written with an empty
cache (cold), then the same plan under a new run name (warm: every shard read from the cache and copied).
Prints seconds for each, the ratio warm / cold, and the bytes the cache holds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--tasks", nargs="+", default=["niah_single_2", "niah_multikey_1", "vt", "cwe"])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--model", default="smollm2_cpu")
    p.add_argument("--store", default=None, help="store.root (default: a temp folder, removed afterwards)")
    args = p.parse_args(argv)

    import numpy as np

    from longeval.config import load_config
    from longeval.engines.models import resolve_model_path
    from longeval.planning.plan import make_plan
    from longeval.stages.generate import ShardGenerator, generate_shard

    store = args.store or tempfile.mkdtemp(prefix="le-cache-bench-")
    overrides = [f"model={args.model}", f"suite.tasks=[{','.join(args.tasks)}]",
                 f"suite.lengths=[{','.join(map(str, args.lengths))}]", f"suite.samples={args.samples}",
                 f"store.root={store}", "suite.allow_too_long=true"]  # generation only: lengths past the model are fine
    figures = {}
    try:
        for label in ("cold", "warm"):
            cfg = load_config([*overrides, f"run_name={label}"])
            rows = [s.to_row() for s in make_plan(cfg).shards]
            batch = {k: np.array([r[k] for r in rows]) for k in rows[0]}
            generator = ShardGenerator(cfg, str(resolve_model_path(cfg.model.path)), cfg.run_root)
            for spec in make_plan(cfg).shards:  # warm the tokenizer and corpora outside the timing (no cache)
                generate_shard(generator.ctx, replace(spec, seed=spec.seed + 1, stop=spec.start + 1))
            began = time.perf_counter()
            cached = generator(batch)["cached"]
            figures[label] = (time.perf_counter() - began, sum(bool(c) for c in cached), len(cached))
        size = sum(f.stat().st_size for f in Path(store, "_cache").rglob("*") if f.is_file()) if not args.store else 0
    finally:
        if not args.store:
            shutil.rmtree(store, ignore_errors=True)
    for label, (seconds, hits, shards) in figures.items():
        print(f"{label}: {seconds:8.2f} s for {shards} shards ({hits} from the cache)")
    print(f"warm / cold: {figures['warm'][0] / figures['cold'][0]:.3f}")
    if size:
        print(f"cache size: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
