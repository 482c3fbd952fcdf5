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
    # No drain on SIGTERM (Ray's default waits up to 30 s for its node to drain; there is nothing to drain), as in
    # cluster/ray_cluster.sh: the teardown then needs no SIGKILL after its 10 s.
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={scratch / 'ray'}", "--num-cpus=1",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false",
         f"--dashboard-agent-listen-port={_free_port()}"],
        env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
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


@pytest.mark.ray
def test_a_run_beside_a_running_ray_starts_its_own_says_so_and_prints_no_ray_deprecation_warning(ray_head, tmp_path):
    """One whole run (every stage, so the generate and score pools too) in a process of its own, for what reaches
    its terminal: beside a running Ray it starts a private one and says so, with no traceback; and it prints no
    `RayDeprecationWarning: ray_remote_args is deprecated`, which the pools' max_restarts=0
    (`runtime.NO_ACTOR_RESTARTS`, which keeps Ray's #53727 line away) printed on every run. The stand-in engine:
    this is about Ray's lines, not the outputs."""
    address, env = ray_head
    proc = longeval("run", "model=tiny_random", "model.engine=stand_in", "suite.tasks=[vt]", "suite.lengths=[1024]",
                    "suite.samples=1", f"store.root={tmp_path}", "run_name=own", env=env)
    text = flat(proc)
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "num_cpus and num_gpus must not be provided" not in text
    assert "another Ray runs on this machine" in text and "private local Ray" in text
    assert f"cluster.address={address.split(':')[0]}" in text  # how to use that one instead
    assert any((tmp_path / "own" / "instances").iterdir())
    assert "results: " in text  # it ran every stage, generate and score pools included
    assert "RayDeprecationWarning" not in text and "ray_remote_args" not in text, text[-3000:]
    assert "53727" not in text and "max_restarts > 0" not in text


@pytest.mark.parametrize("how", ["cluster.address", "RAY_ADDRESS"])
@pytest.mark.ray
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


ARENA_CASES = [("s3://bucket/runs", None, "2"), ("s3://bucket/runs", "4", "4"), ("runs", None, "None")]

# Each case a private local Ray of its own, started after the case's environment is set, as a run's process starts
# one: in one process for the three (`ray.shutdown` ends each Ray, and the next starts from the environment then).
# One CPU each: Ray starts a Python worker per CPU as it comes up, and one task needs one.
ARENAS = """
import os, sys, ray
from longeval.config import load_config
from longeval.cluster.ray_runtime import init_ray
for case in sys.argv[1:]:
    root, given = case.split(",")
    os.environ.pop("MALLOC_ARENA_MAX", None)
    if given:
        os.environ["MALLOC_ARENA_MAX"] = given
    init_ray(load_config(["model=tiny_random", f"store.root={root}", "cluster.num_cpus=1"]))
    seen = ray.get(ray.remote(lambda: os.environ.get("MALLOC_ARENA_MAX")).remote())
    print("ARENAS", root, given or "-", seen, flush=True)
    ray.shutdown()
"""


@pytest.fixture(scope="module")
def arenas() -> str:
    """What a worker of each case's local Ray saw, one line per case."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update({"PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    proc = subprocess.run([sys.executable, "-c", ARENAS, *(f"{root},{given or ''}" for root, given, _ in ARENA_CASES)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(("root", "given", "seen"), ARENA_CASES)
@pytest.mark.ray
def test_a_local_rays_workers_on_an_s3_root_allocate_from_two_heaps_unless_the_environment_says_otherwise(
    arenas: str, root: str, given: str | None, seen: str
) -> None:
    """Threads' own heaps kept what the S3 client freed in a replica (`runtime.MALLOC_ARENA_MAX`); Ray's workers
    inherit the limit from the run's process when its root is on S3, and a user's own setting wins."""
    assert f"ARENAS {root} {given or '-'} {seen}\n" in arenas, arenas[-2000:]


def test_the_pinned_rays_map_batches_still_takes_max_restarts():
    """`runtime.map_pool` passes max_restarts=0 through `**ray_remote_args` (Ray 2.60 has no named parameter
    for it); a Ray that drops that route, or names the parameter, must fail here before it fails a run."""
    import inspect

    import ray.data

    params = inspect.signature(ray.data.Dataset.map_batches).parameters
    assert "max_restarts" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


@pytest.mark.ray
@pytest.mark.parametrize(("deaths", "finishes"), [(2, True), (3, False)])
def test_a_stage_task_whose_worker_dies_is_retried_twice_then_the_stage_fails(tmp_path, deaths, finishes):
    """`runtime.map_pool` gives a task two retries (`TASK_RETRIES`): Ray Data's own default retried a task
    whose worker died without end, so a shard that kills its worker every time would hang the run."""
    import ray

    from longeval.cluster.ray_runtime import init_ray, map_pool
    from longeval.config import load_config
    from tests.cluster.cluster_helpers import dies_first

    init_ray(load_config([f"store.root={tmp_path}"]))
    ds = map_pool(ray.data.from_items([{"x": 1}]), dies_first, fn_kwargs={"folder": str(tmp_path), "deaths": deaths},
                  batch_size=1)
    if finishes:
        assert ds.take_all() == [{"x": 1}]
    else:
        with pytest.raises(Exception, match="(?i)worker|died|crash|exit"):
            ds.take_all()
    assert len(os.listdir(tmp_path)) == min(deaths + 1, 3)  # the first attempt and two retries at most


def _error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip().startswith("error:")]


@pytest.mark.ray
def test_a_ray_whose_port_is_taken_is_one_error_line_naming_the_port_its_holder_and_the_setting(tmp_path):
    """Ray's node times out at start-up when its metrics agent cannot bind its port, as on a machine where another
    process holds it: Ray's `Exception: The current node timed out during startup` traceback and exit 1 became one
    line that names the port, who holds it and the setting that moves it, and exit 2."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=x", f"cluster.metrics_export_port={port}",
                        timeout=300)
    text = flat(proc)
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "Exception:" not in text, text[-3000:]
    [line] = _error_lines(proc)
    assert line.startswith(f"error: Ray's node did not come up within Ray's 30 s: port {port} "
                           f"(cluster.metrics_export_port) is taken by pid {os.getpid()} ("), line
    assert "To fix: set cluster.metrics_export_port to a free port, or to null (a free one Ray picks)" in line
    assert "Ray's logs: " in line and not any((tmp_path / "x" / "instances").glob("*.parquet"))


@pytest.mark.ray
def test_a_ray_start_up_timeout_is_one_error_line_naming_the_setting(tmp_path):
    """Ray's own start-up wait, made tiny: `RuntimeError: Timed out waiting for file .../gcs_server_port_...`
    was a traceback too."""
    proc = longeval(*GENERATE, f"store.root={tmp_path}", "run_name=x", env={"RAY_gcs_server_port_wait_time_s": "0"},
                    timeout=300)
    text = flat(proc)
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "RuntimeError" not in text, text[-3000:]
    [line] = _error_lines(proc)
    assert line.startswith("error: Ray's GCS did not report its port in time (RAY_gcs_server_port_wait_time_s=0): ")
    assert "To fix: raise RAY_gcs_server_port_wait_time_s (now 0) or unset it (Ray's default is 30 s)" in line


def test_a_bad_metrics_port_is_refused_before_ray_starts():
    from longeval.config import load_config
    from longeval.errors import ConfigError

    with pytest.raises(ConfigError, match=r"cluster.metrics_export_port=80: expected a port from 1024 to 65535"):
        load_config(["cluster.metrics_export_port=80"])
    assert load_config(["cluster.metrics_export_port=9100"]).cluster.metrics_export_port == 9100
