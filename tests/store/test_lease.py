"""The run root's lease (`longeval.store.lease`): on a local folder and on a real S3 server (SeaweedFS), racing
acquirers, takeover of stale, dead and released leases, release on errors; and one end-to-end test, a second
`longeval run` refused while the first runs."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from longeval.config import load_config
from longeval.errors import ConfigError, LeaseHeldError
from longeval.store import lease
from longeval.store.lease import Holder, acquire, claim_name, current
from longeval.store.location import Location
from longeval.store.run_root import RunRoot

ACQUIRERS = 6


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> RunRoot:
    """A fresh run root, on the local disk or on SeaweedFS."""
    if request.param == "local":
        return RunRoot(str(tmp_path / "run"))
    server = request.getfixturevalue("s3_env")
    return RunRoot(f"s3://{server.bucket}/lease/{tmp_path.name}")


def _plant(root: RunRoot, generation: int = 1, **fields) -> Holder:
    """Write a claim as another process would have left it (by default on another host, heartbeat just now)."""
    now = time.time()
    holder = Holder(generation, run_id="theirs", host="elsewhere", pid=4242, pid_started=now - 60, started=now - 60,
                    heartbeat=now, stale_s=300.0, command="longeval generate infer score report")
    holder = replace(holder, **fields)
    root.write_bytes(claim_name(generation), holder.to_json())
    return holder


def _take(root: RunRoot, **kwargs) -> lease.Lease:
    return acquire(root, heartbeat_s=kwargs.pop("heartbeat_s", 30.0), stale_s=300.0, **kwargs)


# -- the store's atomic create -------------------------------------------------------------------------------


@pytest.mark.s3
def test_create_publishes_only_the_first_writer(root: RunRoot) -> None:
    assert root.create_bytes("_lease/x.json", b"first")
    assert not root.create_bytes("_lease/x.json", b"second")
    assert root.read_bytes("_lease/x.json") == b"first"
    assert root.files("_lease") == ["x.json"]  # no temp file left behind


@pytest.mark.s3
def test_racing_creates_have_one_winner(root: RunRoot) -> None:
    barrier = threading.Barrier(ACQUIRERS)
    results: list[bool] = []

    def create(i: int) -> None:
        barrier.wait()
        results.append(Location(root.uri).create("race.json", str(i).encode()))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(ACQUIRERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * (ACQUIRERS - 1) + [True]


# -- taking and refusing -------------------------------------------------------------------------------------


@pytest.mark.s3
def test_a_held_root_refuses_with_one_line_naming_the_holder(root: RunRoot) -> None:
    with _take(root, command="longeval run") as held:
        assert current(root) == held.holder
        with pytest.raises(LeaseHeldError) as refused:
            _take(root)
    message = str(refused.value)
    assert "\n" not in message
    for part in (root.uri, f"host {socket.gethostname()} pid {os.getpid()}", "longeval run",
                 f"run {held.holder.run_id}", "started ", "last heartbeat ", "store.take_over_lease=true"):
        assert part in message


@pytest.mark.s3
def test_racing_acquirers_have_exactly_one_winner(root: RunRoot) -> None:
    barrier = threading.Barrier(ACQUIRERS)
    won: list[lease.Lease] = []
    refused: list[str] = []

    def contend() -> None:
        barrier.wait()
        try:
            won.append(_take(RunRoot(root.uri)))
        except LeaseHeldError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=contend) for _ in range(ACQUIRERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == ACQUIRERS - 1
    assert current(root).run_id == won[0].holder.run_id
    assert all(won[0].holder.run_id in message for message in refused)
    won[0].release()


@pytest.mark.parametrize("forced", [False, True], ids=["stale", "take_over"])
@pytest.mark.s3
def test_racing_takeovers_have_exactly_one_winner(root: RunRoot, forced: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Of processes taking over the same stale lease, or forcing the same live one, one wins; the others see
    the winner and are refused (take_over is not a licence to take the winner's lease too)."""
    _plant(root, heartbeat=time.time() - (0 if forced else 600))
    barrier, looked = threading.Barrier(ACQUIRERS), threading.Barrier(ACQUIRERS)
    won: list[lease.Lease] = []
    first_look = threading.local()
    read_lease, listed = lease.current, lease.lease_and_claims

    def listed_after_all_looked(at: RunRoot) -> tuple[lease.Holder | None, list[int]]:
        # Every contender reads the planted holder before any claims: a thread that a loaded machine starts
        # late would otherwise first see the winner, and taking over from the holder first seen is its right.
        holder = listed(at)
        if getattr(first_look, "contender", False) and not getattr(first_look, "done", False):
            first_look.done = True
            looked.wait()
        return holder

    monkeypatch.setattr(lease, "lease_and_claims", listed_after_all_looked)

    def contend() -> None:
        first_look.contender = True  # (heartbeat threads and the test's own looks do not wait)
        barrier.wait()
        with contextlib.suppress(LeaseHeldError):
            won.append(_take(RunRoot(root.uri), take_over=forced))

    threads = [threading.Thread(target=contend) for _ in range(ACQUIRERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert read_lease(root).generation == 2 and read_lease(root).run_id == won[0].holder.run_id
    won[0].release()


@pytest.mark.s3
def test_a_live_holder_on_another_host_is_refused_until_stale(root: RunRoot, caplog) -> None:
    _plant(root)
    with pytest.raises(LeaseHeldError, match="host elsewhere pid 4242"):
        _take(root)
    _plant(root, heartbeat=time.time() - 301)
    with caplog.at_level(logging.WARNING, logger="longeval.store.lease"):
        taken = _take(root)
    assert taken.holder.generation == 2
    assert "taking over the lease" in caplog.text and "host elsewhere pid 4242" in caplog.text
    assert "stale limit of 5 min" in caplog.text
    assert root.files("_lease") == [claim_name(2).split("/")[1]]  # the old claim is tidied away
    taken.release()


@pytest.mark.s3
def test_a_dead_pid_on_this_host_is_taken_over_at_once(root: RunRoot, caplog) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _plant(root, host=socket.gethostname(), pid=gone.pid)
    with caplog.at_level(logging.WARNING, logger="longeval.store.lease"):
        taken = _take(root)
    assert f"pid {gone.pid} no longer runs on this host" in caplog.text
    taken.release()


@pytest.mark.s3
def test_a_reused_pid_is_not_the_holder(root: RunRoot) -> None:
    _plant(root, host=socket.gethostname(), pid=os.getpid(), pid_started=1.0)  # our pid, another start time
    _take(root).release()


@pytest.mark.s3
def test_take_over_takes_a_live_holders_lease(root: RunRoot) -> None:
    _plant(root)
    taken = _take(root, take_over=True)
    assert current(root).run_id == taken.holder.run_id
    taken.release()


# -- heartbeat and release -----------------------------------------------------------------------------------


@pytest.mark.s3
def test_release_frees_the_root_for_the_next_run_without_a_takeover(root: RunRoot, caplog) -> None:
    first = _take(root)
    first.release()
    assert current(root).released
    with caplog.at_level(logging.WARNING, logger="longeval.store.lease"):
        second = _take(root)
    assert second.holder.generation == 2 and "taking over" not in caplog.text
    second.release()


def _wait(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.s3
def test_the_heartbeat_is_renewed_and_a_lost_lease_noticed(root: RunRoot, caplog) -> None:
    held = _take(root, heartbeat_s=0.2)
    first = held.holder.heartbeat
    assert _wait(lambda: current(root).heartbeat > first)
    with caplog.at_level(logging.ERROR, logger="longeval.store.lease"):
        thief = _take(RunRoot(root.uri), take_over=True)
        assert _wait(lambda: held.lost)
    assert "lost the lease" in caplog.text and thief.holder.run_id in caplog.text
    held.release()  # a lost lease is not marked released: it is the thief's now
    assert current(root).run_id == thief.holder.run_id and not current(root).released
    thief.release()


@pytest.mark.s3
def test_hold_releases_on_errors_and_ctrl_c(root: RunRoot) -> None:
    store = load_config().store
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), lease.hold(root, store, command="longeval run"):
            raise exc
        assert current(root).released


@pytest.mark.s3
def test_a_withdrawn_first_lease_leaves_no_claim_but_a_taken_over_one_stays_released(root: RunRoot) -> None:
    """A run refused before it wrote anything withdraws its claim when no run held the root before (issue #46):
    no `_lease/` of a run that never happened. After an earlier holder, its claim is released instead, so claim
    numbers keep growing."""
    first = _take(root)
    assert first.first
    first.withdraw()
    first.release()  # what `hold` does on the way out: nothing left to release
    assert current(root) is None and root.files(lease.LEASE_DIR) == []
    if root.local_path() is not None:
        assert not (root.local_path() / lease.LEASE_DIR).exists()
    _take(root).release()
    later = _take(root)
    assert not later.first and later.holder.generation == 2
    later.withdraw()
    later.release()
    assert current(root).generation == 2 and current(root).released


@pytest.mark.s3
def test_a_reader_warns_and_goes_on_while_a_writer_refuses(root: RunRoot, caplog) -> None:
    store = load_config().store
    assert lease.writer_warning(root) is None
    _plant(root)
    with pytest.raises(LeaseHeldError), lease.hold(root, store, command="longeval infer", writer=True):
        pass
    with caplog.at_level(logging.WARNING, logger="longeval.store.lease"), \
            lease.hold(root, store, command="longeval score", writer=False) as held:
        assert held is None
    warning = lease.writer_warning(root)
    assert warning is not None and "\n" not in warning and "numbers may change" in warning
    # the logged line is the same but for how long ago the heartbeat was, which ticks between the two: on a loaded
    # machine the recomputed one said "2 s ago" where the logged one said "1 s ago"
    stem, ago = warning.split(", last heartbeat ")
    assert stem in caplog.text and re.search(r", last heartbeat \d+ s ago\)", caplog.text), caplog.text
    assert re.fullmatch(r"\d+ s ago\): its numbers may change until that run ends", ago), ago
    assert current(root).run_id == "theirs"  # the reader neither took nor released it


@pytest.mark.s3
def test_an_unreadable_claim_counts_as_stale(root: RunRoot) -> None:
    root.write_bytes(claim_name(3), b"not json")
    taken = _take(root)
    assert taken.holder.generation == 4
    taken.release()


@pytest.mark.parametrize("overrides", [["store.lease_heartbeat_s=0"], ["store.lease_heartbeat_s=200"]])
def test_lease_settings_are_checked(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match="store.lease_heartbeat_s"):
        load_config(overrides)


# -- end to end ----------------------------------------------------------------------------------------------


HELD = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
        "suite.samples=2", "suite.shard_size=2", "cluster.commit_interval_s=0"]
"""The first run's config: the lease is the driver's, whatever the engine, so the stand-in engine serves."""


@pytest.mark.ray
@pytest.mark.engine
@pytest.mark.s3
def test_a_second_run_on_a_held_root_refuses_at_once(tmp_path: Path, tiny_model_path: Path) -> None:
    """Two `longeval run` processes. The first is stopped (SIGSTOP) once it holds the lease, so it is still
    running, whatever the machine's load, when the second is refused; it then goes on and finishes. The lease is
    the driver's, not the engine's: the stand-in engine answers (no model runs). "At once" is exact: the second
    gets RAY_ADDRESS=127.0.0.1:1, so any start of Ray would end it with another error (`init_ray` refuses an
    address nothing answers on), and taking a lease never waits (`lease.acquire`)."""
    from tests.run.test_pipeline_faults import check_complete, finish, wait_for

    args = [*HELD, f"store.root={tmp_path / 'runs'}", "run_name=leased"]
    root = RunRoot(load_config(args).run_root)
    first_log = tmp_path / "first.log"
    with open(first_log, "wb") as out:
        first = subprocess.Popen([sys.executable, "-m", "longeval.cli", "run", *args], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: root.files("_lease") != [] and current(root) is not None, first, first_log, "a lease")
    os.kill(first.pid, signal.SIGSTOP)  # its driver holds the lease and does nothing more until SIGCONT
    try:
        holder = current(root)
        assert holder.pid == first.pid and not holder.released
        second = subprocess.run([sys.executable, "-m", "longeval.cli", "run", *args], capture_output=True,
                                text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"})
        assert first.poll() is None, "the first run ended before the second was refused: the test proves nothing"
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stdout + second.stderr
    errors = [line for line in second.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and second.stdout.strip().endswith(errors[0]), second.stdout
    assert f"host {socket.gethostname()} pid {first.pid}" in errors[0]
    assert f"run {holder.run_id}" in errors[0] and "store.take_over_lease=true" in errors[0]
    assert "cannot join the Ray cluster" not in second.stdout + second.stderr  # refused before any Ray
    assert finish(first, first_log) == 0, first_log.read_text()[-3000:]
    check_complete(root, samples=2)  # every instance predicted once: nothing done twice
    assert current(root).released and current(root).run_id == holder.run_id


@pytest.mark.s3
def test_compare_and_report_warn_about_a_root_being_written(tmp_path: Path, capsys) -> None:
    from longeval import cli
    root = RunRoot(str(tmp_path / "run"))
    cli.warn_if_written([root.uri])
    assert capsys.readouterr().out == ""
    _plant(root)
    cli.warn_if_written([root.uri])
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("warning: run root ") and "host elsewhere pid 4242" in out


# -- the fence: a taken-over run's replicas write nothing more ------------------------------------------------


@pytest.mark.s3
def test_a_taken_over_runs_replica_writer_commits_nothing_more(root: RunRoot) -> None:
    """A killed driver's replicas outlive it by about a second and committed parts a rerun had listed as not done
    (it ran them again); a driver past its stale limit has replicas that would write on. A replica's writer gets
    the driver's lease generation and, before each part, refuses once a later claim exists. The driver stops on
    that error instead of restarting the replica (`stop_on_fatal`)."""
    import ray.exceptions

    from longeval.config import StoreConfig
    from longeval.errors import LeaseLostError
    from longeval.records import PREDICTION_SCHEMA, Prediction
    from longeval.stages.infer import PredictionWriter, stop_on_fatal

    def rows(start: int, n: int) -> list[dict]:
        return [Prediction(instance_id=f"i{k}", model_id="m", output="x", output_tokens=1, finish_reason="stop",
                           cached_prompt_tokens=0, latency_s=0.0).to_row() for k in range(start, start + n)]

    assert lease.held_generation(root) is None
    with lease.hold(root, StoreConfig(), command="longeval infer") as held:
        generation = lease.held_generation(root)
        assert generation == held.holder.generation
        writer = PredictionWriter(root, extra={"model_id": "m", "replica": "r0", "node": "n"}, interval_s=0.0,
                                  fence=generation)
        writer.put(rows(0, 2))
        deadline = time.monotonic() + 30
        while writer.count < 2 and writer.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer.count == 2 and not lease.superseded(root, generation)
        later = _take(root, take_over=True)  # the rerun
        assert lease.superseded(root, generation)
        writer.put(rows(2, 3))
        with pytest.raises(LeaseLostError, match=f"claim {generation + 1}") as lost:
            writer.close()
        later.release()
    assert lease.held_generation(root) is None
    assert root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"]).num_rows == 2
    died = ray.exceptions.RayTaskError("run", "Traceback ...", lost.value).as_instanceof_cause()
    with pytest.raises(LeaseLostError):
        stop_on_fatal(died)
