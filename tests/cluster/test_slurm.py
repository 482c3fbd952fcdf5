"""cluster/slurm/longeval.sbatch on a real single-node Slurm, configured and started by the test on localhost.

slurmctld and slurmd (Debian's slurm-wlm) run in the foreground with all their state in the test's folder, on
free ports, with auth/none + cred/none (no munge) and proctrack/pgid (so a job's processes die with it). The
real sbatch script then runs under `sbatch --wait`: a Ray head started with srun on the one node, a wait for the
node to show in `ray status`, `ray job submit` of the quick suite on the tiny model, and the teardown; the batch
job's exit code is the evaluation's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from longeval.cluster.launch import free_ports
from tests.cluster.cluster_helpers import (
    BAD_OVERRIDES,
    JOB_TIMEOUT_S,
    REPO,
    SBATCH_SCRIPT,
    SLURM_CONF_COMMON,
    TINY_OVERRIDES,
    assert_cluster_came_up_and_job_succeeded,
    assert_tiny_run,
    job_env,
    new_tag,
    short_tmpdir,
    stop_leftovers,
    wait_until_no_processes,
)

pytestmark = pytest.mark.engine

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
MISSING = [tool for tool in TOOLS if shutil.which(tool, path=SBIN_PATH) is None]
if MISSING:
    pytest.skip(f"Slurm is not installed (no {', '.join(MISSING)}): `make system` installs slurm-wlm as root",
                allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the single-node Slurm runs as root (SlurmUser=root; slurmd starts jobs as their user)",
                allow_module_level=True)

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


@dataclass
class LocalSlurm:
    """slurmctld + slurmd on localhost; `env` points the client commands (sbatch, scontrol) at them."""

    workdir: Path
    env: dict[str, str]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, *argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.run([shutil.which(argv[0], path=SBIN_PATH) or argv[0], *argv[1:]], env=self.env,
                              capture_output=True, text=True, **kwargs)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.workdir.glob("*.log")))


def _real_memory_mb() -> int:
    """90 % of the memory available now: slurmd drains a node that has less than its RealMemory."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(int(line.split()[1]) / 1024 * 0.9)
    return 1024


def _write_conf(workdir: Path, spool: Path) -> Path:
    ctld_port, slurmd_port = free_ports(2)
    (workdir / "state").mkdir()
    conf = workdir / "slurm.conf"
    conf.write_text(f"""\
ClusterName=longevaltest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={workdir}/state
SlurmdSpoolDir={spool}
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd.log
{SLURM_CONF_COMMON}NodeName=localhost CPUs={os.cpu_count() or 1} RealMemory={_real_memory_mb()} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[LocalSlurm]:
    workdir = tmp_path_factory.mktemp("slurm")
    tag = new_tag()  # slurmstepd and the jobs' processes inherit it: the teardown finds them by it
    with short_tmpdir("le-slurmd-") as spool:
        conf = _write_conf(workdir, spool)
        env = dict(os.environ, SLURM_CONF=str(conf), LONGEVAL_RAY_TAG=tag, PATH=SBIN_PATH)
        cluster = LocalSlurm(workdir, env)
        try:
            # -D: foreground, our child; -i: no old state; -N localhost: the node's name is not the hostname
            for argv in (["slurmctld", "-D", "-i", "-f", str(conf)],
                         ["slurmd", "-D", "-N", "localhost", "-f", str(conf)]):
                with open(workdir / f"{argv[0]}.out", "wb") as out:
                    cluster.daemons.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                            start_new_session=True))
            deadline = time.monotonic() + START_TIMEOUT_S
            state = ""
            while time.monotonic() < deadline:
                if any(d.poll() is not None for d in cluster.daemons):
                    break
                state = cluster.command("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
                if state == "idle":
                    break
                time.sleep(0.5)
            if state != "idle":
                raise RuntimeError(f"Slurm did not come up (node state {state!r}):\n{cluster.logs()}")
            yield cluster
        finally:
            for daemon in reversed(cluster.daemons):
                _stop(daemon)
            stop_leftovers(tag)  # slurmstepd of a job that outlived a failed test, and what it ran


def _sbatch(slurm: LocalSlurm, tmp_path: Path, overrides: list[str]) -> tuple[int, str, str]:
    """`sbatch --wait` the real script with 1 node and no GPU; returns its exit code, the job log and the tag."""
    tag = new_tag()
    with short_tmpdir("le-ray-") as ray_tmp:
        env = {**job_env(tag, ray_tmp / "ray"), "SLURM_CONF": slurm.env["SLURM_CONF"], "PATH": slurm.env["PATH"]}
        argv = [shutil.which("sbatch", path=SBIN_PATH) or "sbatch", "--wait", "--nodes=1", "--time=15",
                f"--output={tmp_path}/slurm-%j.out", str(SBATCH_SCRIPT), *overrides]
        job_id = ""
        try:
            result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
            job_id = "".join(re.findall(r"Submitted batch job (\d+)", result.stdout))
        except subprocess.TimeoutExpired as exc:
            job_id = "".join(re.findall(r"Submitted batch job (\d+)", (exc.stdout or b"").decode()))
            if job_id:
                slurm.command("scancel", job_id, timeout=30)
            raise
        finally:
            left = wait_until_no_processes(tag)
            stop_leftovers(tag)
        logs = list(tmp_path.glob(f"slurm-{job_id or '*'}.out"))
        log = logs[0].read_text(errors="replace") if logs else f"no job log; sbatch: {result.stdout}{result.stderr}"
        assert not left, f"processes of the job's Ray cluster outlived it: {left}\n{log[-3000:]}"
    return result.returncode, log, job_id


@pytest.mark.ray


@pytest.mark.slurm
def test_sbatch_runs_the_quick_suite_on_a_ray_cluster(slurm, tiny_model_path, tmp_path):
    store = tmp_path / "runs"
    started = time.monotonic()
    code, log, job_id = _sbatch(slurm, tmp_path, [*TINY_OVERRIDES, f"store.root={store}", "run_name=slurm"])
    assert code == 0, f"{log[-6000:]}\n{slurm.logs()}"
    assert f"job {job_id}: 1 node(s) (localhost)" in log
    assert_cluster_came_up_and_job_succeeded(log, cpus=os.cpu_count() or 1)
    assert_tiny_run(store / "slurm")
    state = slurm.command("scontrol", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    print(f"sbatch --wait, 1 node: {time.monotonic() - started:.0f} s\n{log[-2500:]}")


@pytest.mark.slurm
def test_the_batch_jobs_exit_code_is_the_evaluations(slurm, tmp_path):
    code, log, job_id = _sbatch(slurm, tmp_path, [*BAD_OVERRIDES, f"store.root={tmp_path / 'runs'}"])
    assert code == 2, log[-6000:]
    assert "unknown task 'niah_single_9'" in log
    state = slurm.command("scontrol", "show", "job", job_id).stdout
    assert "JobState=FAILED" in state and "ExitCode=2:0" in state, state
