"""What the cluster tests share: the tiny run they submit, the environment that reaches the job, and the check
that no process of the cluster is left.

The clusters themselves are started and stopped by cluster/ray_cluster.sh (directly, or under Slurm through
cluster/slurm/longeval.sbatch): the tests drive the scripts users run, not a copy of their logic. Every process
of a test's cluster carries LONGEVAL_RAY_TAG=<the test's tag> in its environment, which is how the tests find
leftovers without touching other Ray clusters on the machine (never a bare `ray stop`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq

from longeval.cluster.launch import command_line, sweep, tagged_pids

REPO = Path(__file__).resolve().parents[2]
RAY_CLUSTER_SH = REPO / "cluster" / "ray_cluster.sh"
SBATCH_SCRIPT = REPO / "cluster" / "slurm" / "longeval.sbatch"

# One task, one length, one instance: the engine start (about 50 s on two cores) is most of the run.
TINY_OVERRIDES = ["model=tiny_random", "suite=quick", "suite.samples=1", "suite.lengths=[1024]",
                  "suite.tasks=[niah_single_1]", "suite.shard_size=1", "model.max_num_seqs=1"]
# A bad task name fails in the driver before any Ray work: exit code 2, as `longeval run`.
BAD_OVERRIDES = ["model=tiny_random", "suite.tasks=[niah_single_9]"]
JOB_TIMEOUT_S = 900


SLURM_CONF_COMMON = """ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=5
InactiveLimit=0
"""
"""The slurm.conf lines every test Slurm shares (docs: ../shared/notes/environment.md): no accounting, no cgroup
plugins, proctrack/pgid so a job's processes end with it, and no scheduling delay."""


def new_tag() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@contextmanager
def short_tmpdir(prefix: str) -> Iterator[Path]:
    """A folder under /tmp for what holds AF_UNIX sockets (Ray's temp dir, slurmd's spool): pytest's tmp_path
    is too deep for their 107-byte limit."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def job_env(tag: str, ray_tmp: Path) -> dict[str, str]:
    """The environment for cluster/ray_cluster.sh and sbatch: this venv, offline models from LONGEVAL_CACHE,
    Ray on loopback with its own temp dir and tag, a small object store (other tests share the machine)."""
    env = dict(os.environ)
    env.update(
        LONGEVAL_REPO=str(REPO),
        LONGEVAL_VENV=sys.prefix,  # the venv running the tests: `ray` and `python` for the cluster and the job
        LONGEVAL_RAY_TAG=tag,
        LONGEVAL_RAY_TMPDIR=str(ray_tmp),
        LONGEVAL_RAY_START_ARGS="--object-store-memory=500000000",
        LONGEVAL_RAY_WAIT_TIMEOUT="180",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_AUTH_MODE="disabled",
    )
    env.pop("RAY_ADDRESS", None)  # would point `ray` commands at someone else's cluster
    return env


def wait_until_no_processes(tag: str, timeout_s: float = 30.0) -> dict[int, str]:
    """The processes still carrying the tag after `timeout_s` (Ray's job-driver watchdog sleeps in 1 s steps)."""
    deadline = time.monotonic() + timeout_s
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {pid: command_line(pid) for pid in left}


def stop_leftovers(tag: str) -> None:
    """Teardown: whatever of the cluster survived a failed test, by PID (found through the tag)."""
    sweep(tag, grace_s=10.0)


def assert_cluster_came_up_and_job_succeeded(log: str, *, cpus: int) -> None:
    assert re.search(rf"Ray cluster is up: 1 node\(s\), {cpus} CPUs, 0 GPUs", log), log[-3000:]
    assert re.search(r"Job 'longeval-[\w.-]+' succeeded", log), log[-3000:]
    assert re.search(r"job longeval-[\w.-]+ finished with exit code 0", log), log[-3000:]
    assert "stopping Ray: SIGTERM" in log


def assert_tiny_run(run_root: Path) -> None:
    """The run of TINY_OVERRIDES is complete: one summary row, niah_single_1 at 1024 tokens, one instance."""
    tasks = pq.read_table(run_root / "summary" / "tasks.parquet").to_pylist()
    assert [(row["task"], row["target_length"], row["n"]) for row in tasks] == [("niah_single_1", 1024, 1)], tasks
    assert tasks[0]["errors"] == 0 and tasks[0]["too_long"] == 0
    assert (run_root / "summary.json").is_file()
    assert (run_root / "config.yaml").is_file()


def dies_first(batch: dict, *, folder: str, deaths: int) -> dict:
    """A stage task whose worker dies (as one killed for its memory does) on its first `deaths` attempts."""
    attempts = len(os.listdir(folder))
    Path(folder, str(attempts)).touch()
    if attempts < deaths:
        os._exit(1)
    return batch
