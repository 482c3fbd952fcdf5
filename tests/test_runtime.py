"""Any Ray on the machine: a run beside a `ray start --head` starts its own private Ray (no traceback) and says so;
with cluster.address it joins that one. A real head in a subprocess, stopped by its own processes only (`ray stop`
would stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.cli_subprocess import REPO, flat, longeval

GENERATE = ["generate", "model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(head: subprocess.Popen, scratch: Path) -> None:
    """SIGTERM, then SIGKILL, the head's processes: its session's and any other that names its temp dir."""
    procs = [p for p in psutil.process_iter(["cmdline"])
             if str(scratch) in " ".join(p.info["cmdline"] or []) or _session(p) == head.pid]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    head.wait(timeout=10)


def _session(proc: psutil.Process) -> int | None:
    try:
        return os.getsid(proc.pid)
    except OSError:
        return None


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[str, dict[str, str]]]:
    """A `ray start --head --block` of our own (own temp dir, ports and session), and the env to run beside it: a
    TMPDIR whose `ray/ray_current_cluster` names it, as `/tmp/ray` does on a workstation."""
    scratch = Path(tempfile.mkdtemp(prefix="le-ray-", dir="/tmp"))  # short: Ray's socket paths must fit
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TMPDIR=str(scratch), RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    ray = str(Path(sys.executable).parent / "ray")
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={scratch / 'ray'}", "--num-cpus=1",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false",
         f"--dashboard-agent-listen-port={_free_port()}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        address = f"127.0.0.1:{port}"
        marker = scratch / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text().strip()):
            assert head.poll() is None, f"ray start exited with {head.returncode}"
            assert time.monotonic() < deadline, "the Ray head did not come up within 120 s"
            time.sleep(0.5)
        assert marker.read_text().strip().endswith(f":{port}")
        yield address, env
    finally:
        _stop(head, scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_run_beside_a_running_ray_starts_its_own_and_says_so(ray_head, tmp_path):
    address, env = ray_head
    proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=own", env=env)
    text = flat(proc)
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "num_cpus and num_gpus must not be provided" not in text
    assert "another Ray runs on this machine" in text and "private local Ray" in text
    assert f"cluster.address={address.split(':')[0]}" in text  # how to use that one instead
    assert any((tmp_path / "own" / "instances").iterdir())


@pytest.mark.parametrize("how", ["cluster.address", "RAY_ADDRESS"])
def test_a_named_address_joins_the_running_ray(ray_head, tmp_path, how):
    address, env = ray_head
    if how == "RAY_ADDRESS":
        proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=joined", env={**env, "RAY_ADDRESS": address})
    else:
        proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=joined", f"cluster.address={address}", env=env)
    text = flat(proc)
    assert proc.returncode == 0, text[-3000:]
    assert f"Ray: joined the cluster at {address.split(':')[0]}" in text and f"{how}={address}" in text
    assert "1 node(s), 1 CPUs" in text
    assert any((tmp_path / "joined" / "instances").iterdir())


def test_an_unreachable_address_is_one_line_not_a_traceback(tmp_path):
    proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=x", f"cluster.address=127.0.0.1:{_free_port()}",
                    env={"RAY_AUTH_MODE": "disabled"}, timeout=120)
    text = flat(proc)
    assert proc.returncode == 2, text[-3000:]
    assert "cannot join the Ray cluster at 127.0.0.1:" in text and "Traceback" not in text


@pytest.mark.parametrize(("root", "given", "seen"), [("s3://bucket/runs", None, "2"), ("s3://bucket/runs", "4", "4"),
                                                   ("runs", None, "None")])
def test_a_local_rays_workers_on_an_s3_root_allocate_from_two_heaps_unless_the_environment_says_otherwise(
    root: str, given: str | None, seen: str
) -> None:
    """Threads' own heaps kept what the S3 client freed in a replica (`runtime.MALLOC_ARENA_MAX`); Ray's workers
    inherit the limit from the run's process when its root is on S3, and a user's own setting wins."""
    code = ("import os, ray\n"
            "from longeval.config import load_config\n"
            "from longeval.runtime import init_ray\n"
            f"init_ray(load_config(['model=tiny_random', 'store.root={root}']))\n"
            "print('ARENAS', ray.get(ray.remote(lambda: os.environ.get('MALLOC_ARENA_MAX')).remote()))\n"
            "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update({"PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                **({"MALLOC_ARENA_MAX": given} if given else {})})
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ARENAS {seen}" in proc.stdout, proc.stdout[-2000:]
