"""Adaptive rounds on kept engines against engines started anew every round (issue #15).

Runs the same adaptive run twice on the embedded default, each on a fresh run root: once as `longeval run`
does it (`stages.infer.Engines` keeps the replicas from round to round) and once with a new engine set per
round (`run_rounds(..., keep_engines=False)`, what every round cost before). Prints rounds, engine starts and
the wall time of the rounds (generate + infer + score of every round); the decisions must be the same.

    .venv/bin/python benchmarks/adaptive_engines.py                 # tiny random model, 2 rounds
    .venv/bin/python benchmarks/adaptive_engines.py --model smollm2_cpu --samples 40 --shard-size 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _rounds(overrides: list[str], root_dir: Path, name: str, *, keep: bool) -> tuple[float, int, int, list]:
    """(wall s of the rounds, rounds, engine starts, decisions per cell)."""
    from longeval.cluster.ray_runtime import init_ray
    from longeval.config import load_config
    from longeval.engines.models import resolve_model_path
    from longeval.run.adaptive_rounds import adaptive_tables, run_rounds
    from longeval.store.run_root import RunRoot

    cfg = load_config([*overrides, f"store.root={root_dir}", f"run_name={name}"])
    root = RunRoot(cfg.run_root)
    init_ray(cfg)
    started = time.perf_counter()
    rounds = run_rounds(cfg, root, str(resolve_model_path(cfg.model.path)), keep_engines=keep)
    wall = time.perf_counter() - started
    starts = len(list(Path(cfg.run_root, "engines").glob("*.json")))
    cells = adaptive_tables(cfg, root)["adaptive"].select(["task", "target_length", "instances", "decision"])
    return wall, rounds, starts, cells.to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny_random")
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--shard-size", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    root_dir = Path(tempfile.mkdtemp(prefix="le-adaptive-engines-"))
    base = [f"model={args.model}", "suite=quick", "suite.tasks=[niah_single_1,vt]",
            f"suite.lengths=[{','.join(map(str, args.lengths))}]", f"suite.samples={args.samples}",
            f"suite.shard_size={args.shard_size}", "suite.adaptive=true", "model.max_num_seqs=4"]
    # The first run in a process pays cold caches (Ray workers, imports, the model's files): a warm-up run first,
    # then the two kinds alternate, `--repeats` times each; the fastest of each is compared.
    _rounds(base, root_dir, "warm-up", keep=True)
    runs: dict[str, list[tuple[float, int, int, list]]] = {"kept across rounds": [], "anew every round": []}
    for i in range(args.repeats):
        runs["kept across rounds"].append(_rounds(base, root_dir, f"kept{i}", keep=True))
        runs["anew every round"].append(_rounds(base, root_dir, f"fresh{i}", keep=False))
    decisions = {repr(r[3]) for rs in runs.values() for r in rs}
    assert len(decisions) == 1, "the decisions differ between runs"
    print(f"{'engines':<22} {'rounds':>6} {'engine starts':>13} {'wall s (each run)':>24}")
    best = {}
    for label, results in runs.items():
        best[label] = min(r[0] for r in results)
        walls = " ".join(f"{r[0]:.1f}" for r in results)
        print(f"{label:<22} {results[0][1]:>6} {results[0][2]:>13} {walls:>24}")
    print(f"fastest wall time, kept / anew: {best['kept across rounds'] / best['anew every round']:.2f}")


if __name__ == "__main__":
    main()
