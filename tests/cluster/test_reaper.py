"""A run's private Ray ends with the run: after a kill -9 of the driver within seconds (Ray's agents alone wait a
minute), and after a `ray.shutdown()` without touching anything else the driver started. Real Ray, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.cli_subprocess import REPO

pytestmark = [pytest.mark.ray]

DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    import psutil
    import ray
    from longeval.config import load_config
    from longeval.cluster.ray_runtime import init_ray

    bystander = subprocess.Popen(["sleep", "300"])  # not Ray's: born just before it, must outlive its watcher
    init_ray(load_config(["cluster.num_cpus=1"]))  # one CPU: Ray starts a Python worker per CPU as it comes up
    ray.get(ray.remote(lambda: 1).remote())  # a worker too

    def ours():
        return [p for p in psutil.Process().children(recursive=True) if p.pid != bystander.pid]

    def commands():
        found = []
        for p in ours():
            try:
                found.append(" ".join(p.cmdline()))
            except psutil.Error:
                continue
        return " ".join(found)

    deadline = time.monotonic() + 60
    while not all(agent in commands() for agent in ("DashboardAgent", "RuntimeEnvAgent")):
        assert time.monotonic() < deadline, commands()
        time.sleep(0.1)  # until the agents are up
    ray_procs = ours()
    [reaper] = [p for p in ray_procs if "longeval.cluster.reaper" in " ".join(p.cmdline())]
    print(json.dumps({"ray": [[p.pid, p.create_time(), " ".join(p.cmdline())[:60]] for p in ray_procs],
                      "bystander": bystander.pid}), flush=True)
    if sys.argv[1] == "shutdown":
        ray.shutdown()
        reaper.wait(timeout=60)  # the watcher notices the head is gone and stops, leaving the bystander alone
        print(json.dumps({"bystander_alive": bystander.poll() is None}), flush=True)
        bystander.kill()
    else:
        time.sleep(600)
""")


def _driver(mode: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, text=True, env=env)
    return proc, json.loads(proc.stdout.readline())


def _alive(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _left_after(procs: list, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := [cmd for pid, started, cmd in procs if _alive(pid, started)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_kill_9_of_the_driver_leaves_no_ray_process_behind():
    proc, seen = _driver("kill")
    try:
        commands = " ".join(cmd for _, _, cmd in seen["ray"])
        assert "DashboardAgent" in commands and "RuntimeEnvAgent" in commands
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _left_after(seen["ray"], 20) == []  # the agents alone took 60 s before the watcher
    finally:
        for pid, started, _ in seen["ray"]:
            if _alive(pid, started):
                os.kill(pid, signal.SIGKILL)
        if psutil.pid_exists(seen["bystander"]):
            os.kill(seen["bystander"], signal.SIGKILL)


def test_after_ray_shutdown_the_watcher_goes_and_the_drivers_other_children_stay():
    proc, seen = _driver("shutdown")
    after = json.loads(proc.stdout.readline())
    assert proc.wait(timeout=60) == 0
    assert after["bystander_alive"]
    assert _left_after(seen["ray"], 10) == []  # the watcher itself included
