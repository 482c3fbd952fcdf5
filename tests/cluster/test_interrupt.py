"""Ctrl-C ends a run with one line saying how to resume it, and exit status 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from longeval.cluster import interrupt
from longeval.store import lease
from longeval.store.run_root import RunRoot
from tests.cli_subprocess import REPO


def test_a_swallowed_sigint_is_still_seen():
    """What Ray's deferring handler does: replace the SIGINT handler and drop the signal."""
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN when started in the background
    with interrupt.watch():
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not interrupt.interrupted() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    assert signal.getsignal(signal.SIGINT) is before
    interrupt.check()  # outside the block the flag is gone: later work in this process is not interrupted


def test_sigterm_ends_the_block_as_terminated_even_after_a_library_replaced_its_handler():
    """`ray.init` installs a SIGTERM handler of its own that calls sys.exit at once; `restore_sigterm` puts ours
    back, and a SIGTERM then raises `Terminated` (a KeyboardInterrupt: every `finally` runs, the lease is given
    back)."""
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.watch():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # what ray.init does, minus the exit
        interrupt.restore_sigterm()
        with pytest.raises(interrupt.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises between bytecodes, well before this ends
        with pytest.raises(interrupt.Terminated):
            interrupt.check()
    assert signal.getsignal(signal.SIGTERM) is before
    interrupt.check()


@pytest.mark.ray
def test_sigterm_gives_the_lease_back_says_how_to_resume_and_exits_143(tmp_path):
    """What `scancel` and `ray job stop` send: the run ends as for Ctrl-C, and the next run needs no takeover."""
    argv = ["run", "model=tiny_random", "suite.tasks=[niah_single_2]", "suite.lengths=[4096]", "suite.samples=400",
            "suite.shard_size=1", "store.cache_instances=false", f"store.root={tmp_path}", "run_name=term"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "longeval.cli", *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    written = tmp_path / "term" / "instances"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (written.is_dir() and any(written.glob("*.parquet"))):
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be terminated"
    proc.send_signal(signal.SIGTERM)  # to the driver alone, as `kill PID` does
    out, err = proc.communicate(timeout=120)
    text = " ".join((out + err).split())
    assert proc.returncode == 143, text
    assert "terminated (SIGTERM): finished shards and predictions are kept; resume with the same command" in text
    assert "Traceback" not in text
    holder = lease.current(RunRoot(str(tmp_path / "term")))
    assert holder is not None and holder.released


@pytest.mark.parametrize("stage", ["instances", pytest.param("predictions", marks=pytest.mark.engine)])
@pytest.mark.ray
def test_ctrl_c_says_how_to_resume_and_exits_130(tmp_path, stage):
    # One-instance shards: generation (200) and inference (12 prompts of 4K tokens, all generated before the first
    # runs, one at a time: each a prefill of its own, so 11 are left when the first lands) both outlast the wait;
    # predictions committed row by row, so the first lands as soon as a prompt finishes, not after the 30 s commit
    # interval
    sizes = ["suite.samples=200"] if stage == "instances" else ["suite.samples=12", "model.max_num_seqs=1"]
    argv = ["run", "model=tiny_random", "suite.tasks=[niah_single_2]", "suite.lengths=[4096]", *sizes,
            "suite.shard_size=1", "store.cache_instances=false", "cluster.commit_interval_s=0",
            f"store.root={tmp_path}", "run_name=ctrlc"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "longeval.cli", *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    # Interrupted while generating, or during inference once predictions land: there the engines in the same
    # process group die of the same signal, and a swallowed SIGINT once let the run restart them and finish.
    written = tmp_path / "ctrlc" / stage
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (written.is_dir() and any(written.glob("*.parquet"))):
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C: the whole foreground group
    out, err = proc.communicate(timeout=120)
    text = " ".join((out + err).split())
    assert proc.returncode == 130, text
    assert "interrupted: finished shards and predictions are kept; resume with the same command: longeval run" in text
    assert "run_name=ctrlc" in text
    assert "Traceback" not in text
