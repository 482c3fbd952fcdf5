"""The watcher behind tests/started.py, in a process of its own: the standard library and psutil only, so that it
is up before the worker's first test starts anything.

    python tests/watch_processes.py WORKER_PID OUT.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

WORKER_ENV = "LONGEVAL_TEST_WORKER"
"""Set by tests/started.py in each pytest worker to its pid: every process the worker starts inherits it."""
POLL_S = 0.2


def kind_of(name: str, cmdline: list[str]) -> str | None:
    """The real part a process belongs to, from its name and command line (None: not one of ours to count)."""
    line = " ".join(cmdline)
    if name == "weed" or line.startswith("weed "):
        return "s3"
    if name.startswith(("slurm", "sbatch", "srun")):
        return "slurm"
    if "chrom" in name:
        return "browser"
    if line.startswith(("ray::Replica", "VLLM::EngineCore")) or "vllm.entrypoints" in line:
        return "engine"
    if name in ("gcs_server", "raylet") or (line.startswith("ray::") and line != "ray::IDLE"):
        return "ray"  # a Ray it started, or a worker of one it uses at work
    return None


def _clock_offset() -> float:
    """What to add to psutil's `create_time` for the wall clock: psutil adds start ticks to the boot time, which the
    kernel gives in whole seconds (here about half a second off), while uptime is exact to 10 ms."""
    with open("/proc/uptime", encoding="ascii") as uptime:
        up = float(uptime.read().split()[0])
    return time.time() - (psutil.boot_time() + up)


def multi_node(raylets: list[str]) -> bool:
    """Two raylets of one Ray (one GCS): a cluster of nodes, not two separate Rays of one test."""
    clusters = [next((a.rsplit(":", 1)[-1] for a in doing.split() if a.startswith("--gcs-address=")), doing)
                for doing in raylets]  # by the GCS port: a node may name the head by another of its addresses
    return len(clusters) > len(set(clusters))


def watch(worker: int, out: Path) -> None:
    """The watcher's loop, in a process of its own (a thread would add its /proc reads to the worker's I/O counters,
    which tests/stages/test_score.py measures): a JSON line per process of `worker` that is a real part, with its
    creation time (`new`), and again at each change of what it does (a Ray worker's next task or actor), and a
    `cluster` line whenever two raylets of one of its Rays are alive. Ends when the worker does."""
    seen: dict[int, str | None] = {}  # pid -> what it was last seen doing (its command line); None: not ours
    partial = out.with_suffix(".tmp")
    with open(partial, "a", encoding="utf-8") as sink:
        first = True
        while psutil.pid_exists(worker):
            pids = set(psutil.pids())
            for pid in pids - seen.keys():
                seen[pid] = None
                try:
                    if psutil.Process(pid).environ().get(WORKER_ENV) == str(worker) and pid != os.getpid():
                        seen[pid] = ""
                except (psutil.Error, OSError):
                    continue
            for pid, was in list(seen.items()):
                if was is None:
                    continue
                try:  # looked at on every poll: a fork is `python` until it execs, and a Ray worker is
                    proc = psutil.Process(pid)  # `ray::IDLE` until it runs a task or becomes an actor
                    name, line = proc.name(), proc.cmdline()
                except (psutil.Error, OSError):
                    continue
                doing = f"{name} {' '.join(line)}"
                kind = kind_of(name, line)
                if kind and doing != was:  # a new process: when it was made; an old one's new job: now
                    at = proc.create_time() + _clock_offset() if was == "" else time.time()
                    sink.write(json.dumps({"t": at, "kind": kind, "new": was == ""}) + "\n")
                seen[pid] = doing
            for pid in seen.keys() - pids:
                del seen[pid]
            if multi_node([doing for doing in seen.values() if doing and doing.startswith("raylet ")]):
                sink.write(json.dumps({"t": time.time(), "kind": "cluster", "new": False}) + "\n")
            sink.flush()
            if first:  # the file appears under its name once the first look is written: the worker waits for it
                partial.rename(out)
                first = False
            time.sleep(POLL_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]), Path(sys.argv[2]))
