"""Runs that lose nothing: real faults against real parts.

- an S3 run root on a real SeaweedFS whose server is killed mid-inference and restarted: the run waits and
  completes;
- the driver killed with SIGKILL mid-inference on S3, then rerun: no lost or duplicated rows, and summaries and
  outputs identical to the uninterrupted run;
- an engine replica killed with SIGKILL mid-inference, or its engine core process: the infer stage starts the
  replica again on its unfinished prompts and the same run completes.

Every run is a `longeval run` subprocess (its own Ray, the S3 settings in its environment), but the one whose
replica's actor is killed: what dies there is not the run's process, so it runs in this one, on the worker's Ray.
`model.max_num_seqs=1` makes the engine run one sequence at a time, so greedy outputs do not depend on how a
resumed run batches them;
the tiny model's junk always fills its budget, so 16 new tokens (not RULER's 30 to 128) keep that decoding short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot
from tests.s3server import S3Server

pytestmark = pytest.mark.engine

TINY = ["model=tiny_random", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]", "suite.samples=2",
        "suite.shard_size=2", "model.max_num_seqs=1", "+suite.params.ruler.max_new_tokens=16",
        "cluster.commit_interval_s=0"]  # every prediction committed at once: the tests kill runs between commits
SAMPLES = 2 * 2 * 2  # 8 prompts, one at a time: the faults strike after the first two
TIMEOUT_S = 600


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "longeval.cli", "run", *TINY, *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def finish(proc: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the run did not finish in {TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def check_complete(root: RunRoot, samples: int = SAMPLES) -> dict[str, str]:
    """Every instance (`samples` of them) has exactly one prediction, without errors; the outputs by instance id."""
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"])["instance_id"].to_pylist()
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    ids = preds["instance_id"].to_pylist()
    assert len(instances) == samples
    assert len(ids) == len(set(ids)) == samples, "lost or duplicated predictions"
    assert sorted(ids) == sorted(instances)
    assert set(preds["error"].to_pylist()) == {""}
    assert root.verify("predictions") == [] and root.verify("instances") == []
    assert root.read_json("status.json")["complete"]
    return dict(zip(ids, preds["output"].to_pylist(), strict=True))


@pytest.fixture(scope="module")
def s3_run_env(seaweedfs: S3Server) -> dict[str, str]:
    """The server's settings, five minutes of patience, and half a second at most between tries: a restarted
    server is seen at once, not after the 10 s the backoff grows to (`LONGEVAL_S3_RETRY_WAIT_S`)."""
    return {**os.environ, **seaweedfs.env(), "LONGEVAL_S3_PATIENCE_S": "180", "LONGEVAL_S3_RETRY_WAIT_S": "0.5"}


@pytest.fixture(scope="module")
def outage_run(seaweedfs: S3Server, s3_run_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """A run whose S3 server is killed once predictions land and restarted after two prompts' time at the pace
    the run kept before (the time between its first two commits, at least 2 s): the replica's next commits meet a
    dead server, however busy the machine."""
    store = f"s3://{seaweedfs.bucket}/faults"
    log = tmp_path_factory.mktemp("outage") / "run.log"
    proc = _start([f"store.root={store}", "run_name=outage"], s3_run_env, log)

    def landed(n: int) -> Callable[[], bool]:
        return lambda: len(seaweedfs.keys("faults/outage/_manifest/predictions/")) >= n

    wait_for(landed(1), proc, log, "predictions on S3")
    first = time.monotonic()
    wait_for(landed(2), proc, log, "a second prediction on S3")
    seaweedfs.crash()
    down_at = time.monotonic()
    time.sleep(max(2.0, 2 * (down_at - first)))  # the outage itself
    seaweedfs.restart()
    code = finish(proc, log)
    return code, time.monotonic() - down_at, log, f"{store}/outage"


@pytest.mark.ray


@pytest.mark.s3
def test_an_s3_outage_mid_inference_is_waited_out(outage_run, s3_env: S3Server) -> None:
    code, _, log, uri = outage_run
    assert code == 0, log.read_text()[-3000:]
    check_complete(RunRoot(uri))
    summary = RunRoot(uri).read_json("summary.json")["tasks"]
    assert [row["n"] for row in summary] == [2, 2, 2, 2]


@pytest.mark.ray


@pytest.mark.s3
def test_a_killed_driver_on_s3_resumes_without_losing_or_duplicating_rows(
    outage_run, s3_env: S3Server, s3_run_env: dict[str, str], tmp_path: Path
) -> None:
    store = f"s3://{s3_env.bucket}/faults"
    log = tmp_path / "killed.log"
    args = [f"store.root={store}", "run_name=killed"]
    proc = _start(args, s3_run_env, log)
    wait_for(lambda: len(s3_env.keys("faults/killed/_manifest/predictions/")) >= 2, proc, log, "two prediction parts")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(s3_env.keys("faults/killed/_manifest/predictions/"))
    assert 2 <= written < SAMPLES, "the run finished before it could be killed"
    rerun = _start(args, s3_run_env, tmp_path / "rerun.log")
    assert finish(rerun, tmp_path / "rerun.log") == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    outputs = check_complete(RunRoot(f"{store}/killed"))
    reference = check_complete(RunRoot(outage_run[3]))
    assert outputs == reference  # greedy, one prompt per engine call: the same text for every instance
    ours, theirs = (RunRoot(u).read_json("summary.json")["tasks"] for u in (f"{store}/killed", outage_run[3]))
    assert ours == theirs


def _engine_records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


class _Killer(threading.Thread):
    """Beside a run in this process: SIGKILLs the replica's actor process (the pid its engine record names) once
    `ready()`, and keeps the pid, or what went wrong, for the test to check after the run."""

    def __init__(self, ready: Callable[[], bool], engines: Path) -> None:
        super().__init__(daemon=True)
        self.ready, self.engines, self.stop = ready, engines, threading.Event()
        self.pid: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                if self.ready():
                    [record] = _engine_records(self.engines)
                    os.kill(record["pid"], signal.SIGKILL)
                    self.pid = record["pid"]
                    return
        except BaseException as exc:  # handed to the test, which fails with it
            self.error = exc


@pytest.mark.parametrize("victim", ["actor", "engine_core"])
@pytest.mark.ray
def test_a_dead_engine_is_started_again_and_the_run_completes(victim: str, tmp_path: Path,
                                                               tiny_model_path: Path) -> None:
    """The actor process killed (a lost node looks the same), or, with vLLM's engine core in a process of its
    own, that process killed (the actor then sees vLLM's EngineDeadError). Two samples a cell: 8 prompts, one at a
    time, leave the actor 7 to die in the middle of; the engine starts are most of the test. The actor's run is in
    this process, on the worker's Ray (what dies is the replica's process, never the run's); the engine core's is a
    subprocess, whose fresh Ray gives its actor the environment the run sets."""
    args = [f"store.root={tmp_path}", "run_name=dead"]
    root = RunRoot(load_config([*TINY, *args]).run_root)
    engines = tmp_path / "dead" / "engines"
    if victim == "actor":
        manifest = tmp_path / "dead" / "_manifest" / "predictions"
        killer = _Killer(lambda: manifest.is_dir() and any(manifest.iterdir()), engines)
        killer.start()
        try:
            run(load_config([*TINY, *args]))
        finally:
            killer.stop.set()
            killer.join()
        assert killer.error is None, repr(killer.error)
        assert killer.pid is not None, "the run finished before its replica could be killed"
    else:
        args.append("model.env.VLLM_ENABLE_V1_MULTIPROCESSING=1")
        log = tmp_path / "run.log"
        # An engine built in this test process earlier (same xdist worker) leaves VLLM_ENABLE_V1_MULTIPROCESSING=0
        # in its environment, which would win over the override above in the run's engine (model.env is a default).
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        proc = _start(args, env, log)
        # The engine core, by the pid the engine record names, killed as soon as the record is written (before the
        # replica's first prompt): found through the process tree, CI once saw the run end first.
        wait_for(lambda: engines.is_dir() and any(engines.glob("*.json")), proc, log, "an engine record")
        [record] = _engine_records(engines)
        [pid] = record["engine_core_pids"]
        os.kill(pid, signal.SIGKILL)
        assert finish(proc, log) == 0, log.read_text()[-3000:]
    check_complete(root)
    replicas = {r["replica"] for r in _engine_records(engines)}
    assert replicas == {"pool0/r0", "pool0/r0#1"}, replicas  # the replica, then its second life
