#!/usr/bin/env python
"""Measure what `longeval.planning.sizing` extrapolates from, with the real generator and the store's real codec.

Run from the repository root (about 10 minutes on 2 cores; the 256K-1M shards dominate):

    .venv/bin/python benchmarks/sizing_figures.py --write       # measure, write longeval/planning/sizing_figures.json
    .venv/bin/python benchmarks/sizing_figures.py --tasks ruler/vt ruler/cwe --lengths 4096 131072 --n 5

Per task (every registered task that generates without a data file; each in a fresh subprocess, so its peak RSS
is its own), by generating real shards (`stages.generate.generate_shard`, the tokenizer of `--model`, default the
tiny model's, i.e. SmolLM2's) and committing them through `RunRoot.write_table` (zstd Parquet):

* at every length: the committed shard's bytes per instance, generation CPU-seconds per instance (process CPU
  time, steady state: a warm-up instance of the cell comes first) and the warm-up's extra CPU-seconds;
* what the task keeps in a generation actor once it has built a shard (its corpora and caches: the essay split,
  word lists), and the actor's peak RSS above that per token of the largest shard: a shard's rows stay Python
  objects until the shard is encoded and written;
* the instance metadata in Arrow per instance (every column but `prompt` and `prompt_token_ids`);
* one prompt's token ids as the replica builds them (`to_pylist` of the Arrow column), bytes per token
  (tracemalloc).

Per family: what one process keeps once it has built a shard of each of the family's tasks (an actor builds
every task of the suite, and tasks share corpora: a sum of their own figures would count the essays several
times).

Once: predictions and scores of synthetic rows through the same codec (outputs are distinct stretches of the
default essay corpus, decoded), the RSS of a fresh process that imported Ray, Ray Data and the pipeline, and a
real generation actor's RSS once started (a Ray Data actor holding `ShardGenerator`: Ray's worker, the imports and
the tokenizer).

`--write` stores the per-task tables in longeval/planning/sizing_figures.json with the run's provenance; the scalar
figures printed at the end are named constants in longeval/planning/sizing.py. benchmarks/README.md
(`sizing_figures.py`) has the last run; docs/operations.md ("Sizing") how `longeval plan` uses them.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LENGTHS = tuple(2**k for k in range(10, 21))  # 1K ... 1M, the powers of two the suites use
FIGURES_FILE = REPO / "longeval" / "sizing_figures.json"
SMALL_SHARD = 10
"""Instances of a second shard at the longest length, built right after the first (Michelangelo's 1M suite has
shards of 10). Per token its peak is the higher: fewer instances share the fixed part, and freed Python objects of
the shard before stay resident where a few live ones pin their arenas (an actor at suite (c)'s shape measured
718 MiB where 25-instance figures planned 523)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=None,
                   help="registry keys (ruler/vt); default: every registered task that needs no data file")
    p.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), help="target lengths (tokens)")
    p.add_argument("--n", type=int, default=25, help="instances per shard (the default suite.shard_size is 25)")
    p.add_argument("--model", default=None, help="tokenizer folder; default: the tiny model built by setup")
    p.add_argument("--write", action="store_true", help=f"write the per-task tables to {FIGURES_FILE.name}")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every raw figure to this JSON file")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--driver-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--family-child", nargs="+", default=None, help=argparse.SUPPRESS)
    p.add_argument("--actor-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def setup_env() -> None:
    os.environ.setdefault("LONGEVAL_CACHE", str(REPO / ".cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's resident high-water mark since `reset_peak` (Linux /proc: VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def reset_peak() -> None:
    """Give back what the heap freed (as a generation actor does after each shard) and restart the high-water mark
    from the resident set now."""
    from longeval.heap import release_freed_memory

    release_freed_memory()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def model_path(args: argparse.Namespace) -> str:
    if args.model:
        return str(Path(args.model).expanduser())
    from longeval.engines.models import resolve_model_path

    return str(resolve_model_path("packaged:tiny-random"))


def context(path: str):
    from longeval.config import load_config
    from longeval.stages.generate import make_context

    return make_context(load_config(["model=tiny_random"]), path)


# -- one task (child process) -----------------------------------------------------------------------------


def measure_task(args: argparse.Namespace) -> dict:
    """Every figure of one task at every length it can generate, in this (fresh) process."""
    import tracemalloc

    import pyarrow.compute as pc

    from longeval.errors import LongevalError
    from longeval.planning.plan import ShardSpec
    from longeval.stages.generate import generate_shard
    from longeval.store.run_root import RunRoot

    ctx = context(model_path(args))
    task = args.child
    start_rss = rss_bytes()
    out: dict = {"task": task, "start_rss": start_rss, "lengths": {}, "skipped": {}}
    warm_up(ctx, task, args.lengths)  # the task's own start in an actor (corpora, caches)
    gc.collect()
    resident_rss = out["resident_rss"] = rss_bytes()
    with tempfile.TemporaryDirectory(prefix="sizing-") as tmp:
        root = RunRoot(tmp)
        for length in sorted(args.lengths):
            try:
                c0 = time.process_time()
                generate_shard(ctx, ShardSpec(task, length, 42, 1, args.n, args.n + 1))  # the cell's warm-up
                first = time.process_time() - c0
            except LongevalError as exc:  # too short for the task's template, or data it lacks: not a size
                out["skipped"][str(length)] = str(exc).splitlines()[0][:200]
                continue
            reset_peak()
            c0 = time.process_time()
            table = generate_shard(ctx, ShardSpec(task, length, 42, 0, 0, args.n))
            cpu = time.process_time() - c0
            name = f"{task.replace('/', '-')}-{length}"
            root.write_table("instances", name, table)
            peak = peak_rss_bytes() - resident_rss
            tracemalloc.start()
            as_list = table["prompt_token_ids"][0].as_py()  # what Replica._requests holds per prompt
            py_bytes, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            out["lengths"][str(length)] = {
                "n": table.num_rows, "tokens": int(pc.sum(table["input_tokens"]).as_py()),
                "disk_bytes": root.commit_record("instances", name)["bytes"],
                "cpu_s": cpu, "warmup_cpu_s": max(0.0, first - cpu / table.num_rows),
                "arrow_bytes": table.nbytes, "ids_arrow_bytes": table["prompt_token_ids"].nbytes,
                "metadata_arrow_bytes": table.drop_columns(["prompt", "prompt_token_ids"]).nbytes,
                "pylist_bytes_per_token": py_bytes / max(1, len(as_list)),
                "peak_rss_above_resident": peak,
            }
            del table, as_list
        longest = max((int(length) for length in out["lengths"]), default=None)
        if longest is not None and args.n > SMALL_SHARD:
            # A second, smaller shard right after the first, as an actor builds one after another: per token its
            # peak is the higher one (fewer instances share the fixed part, and it sits on what the first left).
            reset_peak()
            small = generate_shard(ctx, ShardSpec(task, longest, 42, 2, 2 * args.n, 2 * args.n + SMALL_SHARD))
            root.write_table("instances", "small", small)
            out["small_shard"] = {"n": small.num_rows, "tokens": int(pc.sum(small["input_tokens"]).as_py()),
                                  "peak_rss_above_resident": peak_rss_bytes() - resident_rss}
    return out


def warm_up(ctx, task: str, lengths: list[int]) -> None:
    """One instance of `task` at the shortest length it can generate: what it loads stays in the process."""
    from longeval.errors import LongevalError
    from longeval.planning.plan import ShardSpec
    from longeval.stages.generate import generate_shard

    for length in sorted(lengths):
        try:
            generate_shard(ctx, ShardSpec(task, length, 7, 0, 0, 1))
            return
        except LongevalError:
            continue


def measure_family(args: argparse.Namespace) -> dict:
    """What one process keeps once it has built a shard of each of these tasks (a family's), in this process."""
    ctx = context(model_path(args))
    start_rss = rss_bytes()
    for task in args.family_child:
        warm_up(ctx, task, args.lengths)
    gc.collect()
    return {"resident_bytes": rss_bytes() - start_rss}


def actor_child(args: argparse.Namespace) -> dict:
    """A real generation actor's RSS once started: `ShardGenerator` in a Ray Data actor on a local Ray."""
    import numpy as np
    import ray
    import ray.data

    from longeval.config import load_config
    from longeval.stages.generate import ShardGenerator

    path = model_path(args)

    class Probe:
        def __init__(self) -> None:
            self.generator = ShardGenerator(load_config(["model=tiny_random"]), path, tempfile.mkdtemp())

        def __call__(self, batch: dict) -> dict:
            return {"rss": np.array([rss_bytes()])}

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        rows = ray.data.from_items([{"x": 0}]).map_batches(Probe, concurrency=1, batch_size=1).take_all()
    finally:
        ray.shutdown()
    return {"actor_start_rss": int(rows[0]["rss"])}


# -- driver, predictions and scores (once) ----------------------------------------------------------------


def driver_child() -> dict:
    """A fresh process that imports what the driver imports: its RSS before any data."""
    import ray  # noqa: F401
    import ray.data  # noqa: F401

    import longeval.cli  # noqa: F401
    import longeval.run.pipeline  # noqa: F401

    return {"driver_import_rss": rss_bytes()}


def measure_outputs(path: str) -> dict:
    """Predictions and scores of synthetic rows through the store's codec, at several output budgets."""
    import pyarrow as pa

    from longeval.planning.plan import ShardSpec
    from longeval.records import PREDICTION_SCHEMA, SCORE_SCHEMA
    from longeval.stages.generate import generate_shard
    from longeval.store.run_root import RunRoot

    ctx = context(path)
    # 98,304 tokens of the default essay corpus (about 104K tokens long) do not repeat: distinct stretches of
    # it are distinct outputs, as a model's are.
    essay = generate_shard(ctx, ShardSpec("ruler/niah_single_2", 98304, 42, 0, 0, 1))
    ids = essay["prompt_token_ids"][0].as_py()
    rows_per_part = 25
    stride = len(ids) // (rows_per_part + 1)
    figures: dict = {"predictions": {}}
    with tempfile.TemporaryDirectory(prefix="sizing-") as tmp:
        root = RunRoot(tmp)
        for budget in (32, 128, 512, 1024, 2048):
            rows = [{"instance_id": f"{i:020x}", "model_id": "llama-3.1-8b-instruct",
                     "output": ctx.encoder.tokenizer.decode(ids[(i + 1) * stride:(i + 1) * stride + budget]),
                     "output_tokens": budget, "finish_reason": "length", "cached_prompt_tokens": 0,
                     "latency_s": 12.345678 + i, "error": "", "replica": "pool1/r3#0", "node": f"{i:056x}"}
                    for i in range(rows_per_part)]
            table = pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA)
            root.write_table("predictions", f"p{budget}", table)
            figures["predictions"][str(budget)] = {
                "rows": rows_per_part, "disk_bytes": root.commit_record("predictions", f"p{budget}")["bytes"],
                "arrow_bytes": table.nbytes,
            }
        scores = [{"instance_id": f"{i:020x}", "model_id": "llama-3.1-8b-instruct", "family": "ruler",
                   "task": "niah_multikey_2", "target_length": 131072, "depth": (i % 40) / 40,
                   "metric": "string_match", "score": float(i % 2), "parsed_answer": f"{1000000 + i * 7919}",
                   "error_type": "", "extra": "{}", "complexity": ""} for i in range(2000)]
        table = pa.Table.from_pylist(scores, schema=SCORE_SCHEMA)
        root.write_table("scores", "scores", table)
        figures["scores"] = {"rows": len(scores), "disk_bytes": root.commit_record("scores", "scores")["bytes"],
                             "arrow_bytes": table.nbytes}
    return figures


# -- parent -----------------------------------------------------------------------------------------------


class ChildFailed(Exception):
    """A measurement subprocess failed (e.g. a task whose data is not configured): reported, not fatal."""


def default_tasks() -> list[str]:
    from longeval.tasks import TASKS

    return sorted(key for key, spec in TASKS.items() if not spec.needs)


def run_child(args: argparse.Namespace, *extra: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *extra, "--n", str(args.n),
           "--lengths", *map(str, args.lengths)]
    if args.model:
        cmd += ["--model", args.model]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise ChildFailed(lines[-1] if lines else f"exit {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table_for(task: dict) -> dict:
    """The per-task entry of sizing_figures.json: per-length tables, and the figures of the largest shard."""
    cells = sorted(((int(length), c) for length, c in task["lengths"].items()), key=lambda item: item[0])
    _, big = cells[-1]
    return {
        "lengths": [length for length, _ in cells],
        "disk_bytes": [round(c["disk_bytes"] / c["n"]) for _, c in cells],
        "cpu_s": [round(c["cpu_s"] / c["n"], 6) for _, c in cells],
        "warmup_cpu_s": [round(c["warmup_cpu_s"], 6) for _, c in cells],
        "resident_bytes": task["resident_rss"] - task["start_rss"],
        "build_bytes_per_token": round(max(c["peak_rss_above_resident"] / c["tokens"]
                                           for c in (big, task.get("small_shard", big))), 1),
        "metadata_bytes": round(statistics.fmean(c["metadata_arrow_bytes"] / c["n"] for _, c in cells)),
    }


def dump_figures(provenance: str, tables: dict, families: dict[str, int]) -> str:
    """sizing_figures.json: one line per task and figure, so a new measurement's diff reads task by task."""
    lines = ["{", f'  "measured": {json.dumps(provenance)},', f'  "families": {json.dumps(families)},',
             '  "tasks": {']
    for i, (task, table) in enumerate(tables.items()):
        fields = [f'    "{key}": {json.dumps(value)}' for key, value in table.items()]
        end = "," if i < len(tables) - 1 else ""
        lines += [f"   {json.dumps(task)}: {{", ",\n".join(fields), f"   }}{end}"]
    return "\n".join([*lines, "  }", "}", ""])


def git_commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_env()
    if args.child:
        print(json.dumps(measure_task(args)))
        return 0
    if args.driver_child:
        print(json.dumps(driver_child()))
        return 0
    if args.family_child:
        print(json.dumps(measure_family(args)))
        return 0
    if args.actor_child:
        print(json.dumps(actor_child(args)))
        return 0
    raw, tables, skipped = {}, {}, {}
    for task in args.tasks or default_tasks():
        began = time.perf_counter()
        try:
            raw[task] = run_child(args, "--child", task)
        except ChildFailed as exc:
            skipped[task] = str(exc)
        else:
            if raw[task]["lengths"]:
                tables[task] = table_for(raw[task])
            else:
                skipped[task] = next(iter(raw[task]["skipped"].values()), "no length generated")
        print(f"  .. {task:<34} {time.perf_counter() - began:6.1f} s", file=sys.stderr, flush=True)
    families = {}
    for family in sorted({task.split("/")[0] for task in tables}):
        members = [task for task in tables if task.split("/")[0] == family]
        families[family] = run_child(args, "--family-child", *members)["resident_bytes"]
    driver = run_child(args, "--driver-child")
    actor = run_child(args, "--actor-child")
    outputs = measure_outputs(model_path(args))

    print(f"lengths {args.lengths}, {args.n} instances per shard, tokenizer {model_path(args)}")
    print(f"{'task':<34} {'L':>9} {'disk B/inst':>12} {'B/token':>8} {'CPU s/inst':>10} {'warm-up s':>9}")
    for task, t in tables.items():
        for length, disk, cpu, warm in zip(t["lengths"], t["disk_bytes"], t["cpu_s"], t["warmup_cpu_s"], strict=True):
            print(f"{task:<34} {length:>9,} {disk:>12,} {disk / length:>8.3f} {cpu:>10.4f} {warm:>9.3f}")
        print(f"{task:<34} keeps {t['resident_bytes'] / 2**20:.1f} MiB, build {t['build_bytes_per_token']} B/token, "
              f"metadata {t['metadata_bytes']} B/instance")
    for family, kept in families.items():
        own = sum(t["resident_bytes"] for task, t in tables.items() if task.split("/")[0] == family)
        print(f"{family}: an actor that built all its tasks keeps {kept / 2**20:.1f} MiB (their own figures sum to "
              f"{own / 2**20:.1f} MiB)")
    for task, why in skipped.items():
        print(f"{task}: not measured ({why[:160]})")
    pylist = [c["pylist_bytes_per_token"] for r in raw.values() for c in r["lengths"].values()]
    ids_arrow = [c["ids_arrow_bytes"] / c["tokens"] for r in raw.values() for c in r["lengths"].values()]
    print("\n# scalar figures (named constants in longeval/planning/sizing.py)")
    print(f"PYLIST_BYTES_PER_TOKEN: {min(pylist):.1f}-{max(pylist):.1f}")
    print(f"ids column in Arrow, B/token: {min(ids_arrow):.2f}-{max(ids_arrow):.2f}")
    print(f"GENERATION_ACTOR_START_BYTES: {actor['actor_start_rss'] / 2**20:.0f} MiB")
    print(f"DRIVER_IMPORT_BYTES: {driver['driver_import_rss'] / 2**20:.0f} MiB")
    preds = outputs["predictions"]
    for budget, p in preds.items():
        print(f"predictions at budget {budget:>4}: {p['disk_bytes'] / p['rows']:7.0f} B/row on disk, "
              f"{p['arrow_bytes'] / p['rows']:7.0f} B/row in Arrow")
    lo, hi = min(preds, key=int), max(preds, key=int)
    for unit, key in (("disk", "disk_bytes"), ("Arrow", "arrow_bytes")):
        a, b = preds[lo][key] / preds[lo]["rows"], preds[hi][key] / preds[hi]["rows"]
        slope = (b - a) / (int(hi) - int(lo))
        print(f"PREDICTION ({unit}): {a - slope * int(lo):.0f} B/row + {slope:.2f} B/output token")
    scores = outputs["scores"]
    print(f"SCORE_ROW: {scores['disk_bytes'] / scores['rows']:.1f} B on disk, "
          f"{scores['arrow_bytes'] / scores['rows']:.1f} B in Arrow")
    if args.write:
        provenance = (f"benchmarks/sizing_figures.py on {datetime.date.today().isoformat()}, commit {git_commit()}, "
                      f"{os.cpu_count()} cores ({platform.machine()}), the tokenizer of {Path(model_path(args)).name}, "
                      f"{args.n}-instance shards, the default essay corpus")
        FIGURES_FILE.write_text(dump_figures(provenance, tables, families), encoding="utf-8")
        print(f"wrote {FIGURES_FILE}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tasks": raw, "skipped": skipped, "driver": driver, "actor": actor,
                                               "families": families,
                                               "outputs": outputs, "args": vars(args)}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
