"""`ray job submit` against a real `ray start --head` cluster on loopback: what the Slurm script builds on.

cluster/ray_cluster.sh `run` starts the head (its own ports, temp dir and tag), waits until `ray status` shows
the node and its CPUs, submits `python jobs/run.py run ...` with `--working-dir` the checkout (the venv, caches
and runs excluded by cluster/runtime_env.yaml), streams the job's logs, and stops the head by PID.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.cluster.cluster_helpers import (
    BAD_OVERRIDES,
    JOB_TIMEOUT_S,
    RAY_CLUSTER_SH,
    REPO,
    assert_cluster_came_up_and_job_succeeded,
    job_env,
    new_tag,
    short_tmpdir,
    stop_leftovers,
    wait_until_no_processes,
)

pytestmark = pytest.mark.engine


def _run_on_loopback_cluster(overrides: list[str], *, cpus: int = 2, **extra_env: str
                             ) -> tuple[subprocess.CompletedProcess[str], str, float]:
    """cluster/ray_cluster.sh run OVERRIDES on a head of `cpus` CPUs with a fresh tag and temp dir (and `extra_env`);
    returns the result, the tag and seconds."""
    tag = new_tag()
    with short_tmpdir("le-ray-") as ray_tmp:
        env = {**job_env(tag, ray_tmp / "ray"), "LONGEVAL_RAY_NUM_CPUS": str(cpus), **extra_env}
        started = time.monotonic()
        try:
            # The script's own session: a timeout here must not leave its process group behind.
            result = subprocess.run(["bash", str(RAY_CLUSTER_SH), "run", *overrides], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=JOB_TIMEOUT_S,
                                    start_new_session=True)
        finally:
            seconds = time.monotonic() - started
            left = wait_until_no_processes(tag)
            stop_leftovers(tag)
        assert not left, f"processes of the cluster outlived the script: {left}"
    return result, tag, seconds


@pytest.mark.ray
def test_the_scripts_exit_code_is_the_jobs(tmp_path):
    """The job fails in its driver before any Ray work: a head of one CPU will do (Ray starts a Python worker per CPU
    as the head comes up)."""
    result, _, _ = _run_on_loopback_cluster([*BAD_OVERRIDES, f"store.root={tmp_path}"], cpus=1)
    log = result.stdout
    assert result.returncode == 2, log[-5000:]
    assert "unknown task 'niah_single_9'" in log
    assert "finished with exit code 2" in log
    assert not any(tmp_path.iterdir())  # failed before writing anything


@pytest.mark.ray
def test_an_adaptive_run_with_a_pool_per_length_bucket_runs_as_a_job(tiny_model_path, tmp_path):
    """Issue #15: adaptive rounds are the pipeline's own stages, so they run under `ray job submit` and feed one
    engine pool per length bucket like a full sweep. The cluster's life around the job is checked here too (a
    plain suite as a job: tests/cluster/test_slurm.py, through the same `rc_submit`).

    One round, decided at once (a bar of 92 %), so two engine starts: the second pool must stop the first's engine
    to start its own on two CPUs, and that eviction is checked here only (with real engines). Rounds after the
    first, their engines kept: tests/stages/infer/test_infer.py's two-node adaptive run and
    tests/run/test_adaptive_rounds.py."""
    import json

    import pyarrow.parquet as pq

    store = tmp_path / "runs"
    overrides = ["model=tiny_random", "suite=quick", "suite.tasks=[niah_single_1]", "suite.lengths=[1024,2048]",
                 "suite.samples=12", "suite.shard_size=1", "model.max_num_seqs=2", "suite.adaptive=true",
                 "suite.effective_threshold=92", "cluster.bucket_edges=[1024]", f"store.root={store}",
                 "run_name=adaptive"]
    # LONGEVAL_LOG reaches the job (RC_DEFAULT_JOB_ENV): INFO shows the infer stage stopping a pool's engines
    result, _, seconds = _run_on_loopback_cluster(overrides, LONGEVAL_LOG="INFO")
    log = result.stdout
    assert result.returncode == 0, log[-5000:]
    assert_cluster_came_up_and_job_succeeded(log, cpus=2)
    # the checkout went up as the job's working dir (what it leaves behind: test_cluster_configs.py)
    assert re.search(r"Uploading package gcs://_ray_pkg_\w+\.zip", log), log[:5000]
    print(f"ray job submit on loopback: {seconds:.0f} s\n{log[-2500:]}")
    root = store / "adaptive"
    assert (root / "summary.json").is_file() and (root / "config.yaml").is_file()
    cells = json.loads((root / "adaptive.json").read_text())["cells"]
    # the tiny model scores 0: each cell is decided below after its first round of 1, before the cap of 12 (one
    # failure leaves the other eleven, 91.7 %, short of 92 % of 12)
    assert [(c["target_length"], c["decision"], c["instances"]) for c in cells] == [(1024, "below", 1),
                                                                                  (2048, "below", 1)], cells
    replicas = pq.read_table(root / "predictions", columns=["replica"])["replica"].to_pylist()
    assert sorted(r.split("/")[0] for r in replicas) == ["pool0", "pool1"]  # one pool per bucket
    # two CPUs hold one engine and the CPU the other stages need: the second pool stops the first's engine to start
    # its own (with room, they are kept: tests/stages/infer/test_infer.py)
    engines = sorted(json.loads(p.read_text())["replica"] for p in (root / "engines").glob("*.json"))
    assert engines == ["pool0/r0", "pool1/r0"], engines
    assert "stopping pool0's engines to make room for pool1" in log, log[-5000:]
