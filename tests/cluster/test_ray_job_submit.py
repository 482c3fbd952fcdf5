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


def _run_on_loopback_cluster(overrides: list[str]) -> tuple[subprocess.CompletedProcess[str], str, float]:
    """cluster/ray_cluster.sh run OVERRIDES with a fresh tag and temp dir; returns the result, the tag and seconds."""
    tag = new_tag()
    with short_tmpdir("le-ray-") as ray_tmp:
        env = job_env(tag, ray_tmp / "ray")
        env["LONGEVAL_RAY_NUM_CPUS"] = "2"
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
    result, _, _ = _run_on_loopback_cluster([*BAD_OVERRIDES, f"store.root={tmp_path}"])
    log = result.stdout
    assert result.returncode == 2, log[-5000:]
    assert "unknown task 'niah_single_9'" in log
    assert "finished with exit code 2" in log
    assert not any(tmp_path.iterdir())  # failed before writing anything


@pytest.mark.ray
def test_an_adaptive_run_with_a_pool_per_length_bucket_runs_as_a_job(tiny_model_path, tmp_path):
    """Issue #15: adaptive rounds are the pipeline's own stages, so they run under `ray job submit` and feed one
    engine pool per length bucket like a full sweep. The cluster's life around the job is checked here too (a
    plain suite as a job: tests/cluster/test_slurm.py, through the same `rc_submit`)."""
    import json

    import pyarrow.parquet as pq

    store = tmp_path / "runs"
    overrides = ["model=tiny_random", "suite=quick", "suite.tasks=[niah_single_1]", "suite.lengths=[1024,2048]",
                 "suite.samples=12", "suite.shard_size=1", "model.max_num_seqs=2", "suite.adaptive=true",
                 "cluster.bucket_edges=[1024]", f"store.root={store}", "run_name=adaptive"]
    result, _, seconds = _run_on_loopback_cluster(overrides)
    log = result.stdout
    assert result.returncode == 0, log[-5000:]
    assert_cluster_came_up_and_job_succeeded(log, cpus=2)
    # the checkout went up as the job's working dir (what it leaves behind: test_cluster_configs.py)
    assert re.search(r"Uploading package gcs://_ray_pkg_\w+\.zip", log), log[:5000]
    print(f"ray job submit on loopback: {seconds:.0f} s\n{log[-2500:]}")
    root = store / "adaptive"
    assert (root / "summary.json").is_file() and (root / "config.yaml").is_file()
    cells = json.loads((root / "adaptive.json").read_text())["cells"]
    # the tiny model scores 0: each cell is decided below after its second round of 1, before the cap of 12 (two
    # failures leave the other ten short of 85.6 % of 12)
    assert [(c["target_length"], c["decision"], c["instances"]) for c in cells] == [(1024, "below", 2),
                                                                                  (2048, "below", 2)], cells
    replicas = pq.read_table(root / "predictions", columns=["replica"])["replica"].to_pylist()
    assert {r.split("/")[0] for r in replicas} == {"pool0", "pool1"}  # one pool per bucket, in every round
    # two CPUs hold one engine and the CPU the other stages need: each pool stops the other's engine to start its
    # own, once per round (with room, they are kept: tests/stages/infer/test_infer.py)
    engines = sorted(json.loads(p.read_text())["replica"] for p in (root / "engines").glob("*.json"))
    assert engines == ["pool0/r0", "pool0/r0", "pool1/r0", "pool1/r0"], engines
