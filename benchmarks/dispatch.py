"""Dispatch: how idle a pool of two replicas sits when one of them runs at half speed, static vs dynamic.

One workload (RULER tasks at 1K with output budgets 16 to 512, as `engine_throughput.py`) is generated once; the
infer stage then runs it on two replicas of the real model four times: {static, dynamic} dispatch x {both
replicas at full speed, replica r1 slowed}. A replica is slowed the way issue 23 measured it: its processes (the
replica actor and vLLM's engine core) are stopped and continued (SIGSTOP/SIGCONT) on a duty cycle, 0.5 s each
by default, so it runs half the time.

Per run it prints each replica's prompts and busy time (first request to last prediction, from its engine
record: a replica of a dynamic pool waits after that while another holds work that may move to it), the pool's
span (the longest busy time), and

    idle fraction = sum over replicas of (span - busy) / (replicas x span)
    ideal span    = total work / summed speeds, a replica's speed = its work / its busy time (work in tokens:
                    prompt + output), i.e. the span had the work been split in proportion to the speeds

Targets (issue 23): dynamic with a slowed replica: idle fraction <= 0.05 and span <= 1.10 x ideal; dynamic with
equal replicas no worse than static.

    python benchmarks/dispatch.py [--samples 8] [--max-num-seqs 8] [--stop-s 0.5 --run-s 0.5] [--two-nodes]
        [--modes static dynamic] [--cases equal slowed] [--json FILE] [OVERRIDE ...]

With --json, each dynamic run's record includes the queue's trace (`queue_events`, from dispatch/pool0.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

BUDGETS = {"niah_single_1": 16, "vt": 32, "fwe": 64, "cwe": 128, "niah_multivalue": 256, "niah_multiquery": 512}
"""Output budget per task: 16 to 512 tokens."""


def replica_pids(records: Path, replica: str) -> list[int]:
    """The processes of `replica` (its actor and vLLM's engine core), from its engine record; [] until written."""
    for file in sorted(records.glob("*.json")) if records.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(file.read_text())
            if record.get("replica") == replica:
                return [int(record["pid"]), *map(int, record.get("engine_core_pids") or [])]
    return []


def duty_cycle(records: Path, replica: str, stop_s: float, run_s: float, done: threading.Event) -> None:
    """Stop and continue `replica`'s processes on a duty cycle until `done` (SIGSTOP/SIGCONT)."""
    pids: list[int] = []
    while not pids and not done.is_set():
        pids = replica_pids(records, replica)
        time.sleep(0.05)

    def send(sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    try:
        while pids and not done.is_set():
            send(signal.SIGSTOP)
            done.wait(stop_s)
            send(signal.SIGCONT)
            done.wait(run_s)
    finally:
        send(signal.SIGCONT)


def figures(run_root: str) -> dict:
    """Per replica: prompts, busy seconds and work (tokens); the pool's span, idle fraction and ideal span."""
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
    from longeval.store.run_root import RunRoot

    root = RunRoot(run_root)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "replica", "output_tokens"])
    inst = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "input_tokens"])
    prompt = dict(zip(inst["instance_id"].to_pylist(), inst["input_tokens"].to_pylist(), strict=True))
    work: Counter[str] = Counter()
    for iid, replica, out in zip(preds["instance_id"].to_pylist(), preds["replica"].to_pylist(),
                                 preds["output_tokens"].to_pylist(), strict=True):
        work[replica] += prompt[iid] + out
    busy: dict[str, float] = {}
    for file in sorted(Path(run_root, "engines").glob("*.json")):
        record = json.loads(file.read_text())
        if "stats" in record:  # to its last prediction: a replica of a dynamic pool then waits for work to move
            stats = record["stats"]
            busy[record["replica"]] = busy.get(record["replica"], 0.0) + stats.get("last_row_s", stats["run_s"])
    span = max(busy.values())
    trace = Path(run_root, "dispatch", "pool0.json")  # the queue's latest decisions (dynamic dispatch)
    events = json.loads(trace.read_text())["events"] if trace.exists() else []
    speeds = sum(work[r] / busy[r] for r in busy if busy[r] > 0)
    return {
        "prompts": dict(Counter(preds["replica"].to_pylist())), "busy_s": busy, "span_s": span,
        "idle_fraction": sum(span - b for b in busy.values()) / (len(busy) * span),
        "ideal_s": sum(work.values()) / speeds, "queue_events": events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2_cpu")
    parser.add_argument("--samples", type=int, default=8, help="samples per task (6 tasks)")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="per replica; fewer slots than prompts")
    parser.add_argument("--stop-s", type=float, default=0.5)
    parser.add_argument("--run-s", type=float, default=0.5)
    parser.add_argument("--modes", nargs="+", default=["static", "dynamic"])
    parser.add_argument("--cases", nargs="+", default=["equal", "slowed"], choices=["equal", "slowed"])
    parser.add_argument("--two-nodes", action="store_true", help="one replica on each node of a loopback cluster")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("overrides", nargs="*", help="more config overrides for every run, e.g. "
                        "model.max_num_batched_tokens=1024")
    args = parser.parse_args()

    os.environ.setdefault("LONGEVAL_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from longeval.config import load_config
    from longeval.run.pipeline import run

    scratch = Path(tempfile.mkdtemp(prefix="le-dispatch-"))
    base = [f"model={args.model}", f"suite.tasks=[{','.join(BUDGETS)}]", f"suite.lengths=[{args.length}]",
            f"suite.samples={args.samples}", f"suite.shard_size={args.samples}", f"store.root={scratch}",
            f"model.max_num_seqs={args.max_num_seqs}", "cluster.replicas=2",
            *(f"+suite.params.{task}.max_new_tokens={n}" for task, n in BUDGETS.items()), *args.overrides]
    results: dict[str, dict] = {}
    cluster_cm = contextlib.nullcontext(None)
    if args.two_nodes:
        from longeval.cluster.launch import loopback_cluster

        cluster_cm = loopback_cluster(2)
    with cluster_cm as cluster:
        where = ([f"cluster.address={cluster.address}", "cluster.gpus_per_replica=1", "store.shared_filesystem=true"]
                 if cluster is not None else ["cluster.num_cpus=4"])
        first = load_config([*base, *where, "run_name=generated"])
        run(first, stages=("generate",))
        for mode in args.modes:
            for slowed in [case == "slowed" for case in args.cases]:
                name = f"{mode}-{'slowed' if slowed else 'equal'}"
                cfg = load_config([*base, *where, f"run_name={name}", f"cluster.dispatch={mode}"])
                for folder in ("instances", "_manifest/instances"):  # the shards and their commit records
                    shutil.copytree(Path(first.run_root, folder), Path(cfg.run_root, folder))
                done = threading.Event()
                slower = threading.Thread(target=duty_cycle, daemon=True, args=(
                    Path(cfg.run_root, "engines"), "pool0/r1", args.stop_s, args.run_s, done))
                if slowed:
                    slower.start()
                began = time.perf_counter()
                try:
                    run(cfg, stages=("infer",))
                finally:
                    done.set()
                    if slowed:
                        slower.join()
                if cluster is None:
                    ray.shutdown()
                results[name] = {**figures(cfg.run_root), "infer_wall_s": round(time.perf_counter() - began, 1)}
                r = results[name]
                print(f"{name:16} span {r['span_s']:7.1f} s  ideal {r['ideal_s']:7.1f} s  "
                      f"span/ideal {r['span_s'] / r['ideal_s']:5.2f}  idle fraction {r['idle_fraction']:.3f}  "
                      f"prompts {r['prompts']}  busy {({k: round(v, 1) for k, v in r['busy_s'].items()})}",
                      flush=True)
    print(f"\nworkload: {6 * args.samples} prompts at {args.length}, output budgets 16..512, max_num_seqs "
          f"{args.max_num_seqs}, r1 slowed by SIGSTOP {args.stop_s} s / SIGCONT {args.run_s} s"
          f"{', two loopback nodes' if args.two_nodes else ', one node'}")
    if "dynamic-slowed" in results:
        r = results["dynamic-slowed"]
        ok = r["idle_fraction"] <= 0.05 and r["span_s"] <= 1.10 * r["ideal_s"]
        print(f"target dynamic, slowed: idle <= 0.05 and span <= 1.10 x ideal: {'met' if ok else 'NOT met'}")
    if {"dynamic-equal", "static-equal"} <= set(results):
        d, s = results["dynamic-equal"], results["static-equal"]
        print(f"equal replicas: dynamic span {d['span_s']:.1f} s vs static {s['span_s']:.1f} s "
              f"({d['span_s'] / s['span_s']:.3f}x)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results},
                                        indent=1))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
