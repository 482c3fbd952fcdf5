"""A full disk stops a run with one line naming the file and the fix, at every stage that writes, and is never
taken for an engine failure. Most tests inject ENOSPC with a mock of the lowest-level write (`os.fsync` in
`longeval.store.local`); the last fills a real 64 KiB tmpfs where this user may mount one."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from longeval.cli import longeval_error, main
from longeval.errors import DiskFullError, StoreError
from longeval.records import PREDICTION_SCHEMA, Prediction
from longeval.store.run_root import RunRoot

FIX = ("No space left on device; free space on that filesystem (or set store.root / store.instance_cache to a disk "
       "with room) and rerun the same command: finished shards and predictions are kept")


def _full(fd: int) -> None:
    """Mock: the disk fills up when a file is flushed."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_at_the_store_edge_is_one_line_naming_the_file(tmp_path, monkeypatch) -> None:
    """Mock of `os.fsync` raising ENOSPC."""
    root = RunRoot(str(tmp_path / "run"))
    monkeypatch.setattr("longeval.store.local.os.fsync", _full)
    table = Prediction(instance_id="i", model_id="m", output="", output_tokens=0, finish_reason="stop",
                       cached_prompt_tokens=0, latency_s=0.0).to_row()
    import pyarrow as pa

    with pytest.raises(DiskFullError) as info:
        root.write_table("predictions", "s0", pa.Table.from_pylist([table], schema=PREDICTION_SCHEMA))
    assert str(info.value) == f"cannot write {tmp_path}/run/predictions/s0.parquet: {FIX}"
    assert isinstance(info.value, StoreError) and "\n" not in str(info.value)
    assert list((tmp_path / "run" / "predictions").iterdir()) == []  # no temp file left


def test_a_generation_actor_returns_a_full_disk_as_data(tmp_path, monkeypatch) -> None:
    """Mock of `os.fsync` raising ENOSPC; the actor callable runs without Ray, as
    tests/stages/test_instance_cache.py's."""
    from longeval.config import load_config
    from longeval.engines.models import resolve_model_path
    from longeval.planning.plan import make_plan
    from longeval.stages.generate import ShardGenerator

    cfg = load_config(["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=1",
                       "store.cache_instances=false", f"store.root={tmp_path}", "run_name=r"])
    generator = ShardGenerator(cfg, str(resolve_model_path(cfg.model.path)), cfg.run_root)
    row = make_plan(cfg).shards[0].to_row()
    monkeypatch.setattr("longeval.store.local.os.fsync", _full)
    out = generator({k: np.array([v]) for k, v in row.items()})
    assert out["disk_full"] == [f"cannot write {tmp_path}/r/instances/{make_plan(cfg).shards[0].name}.parquet: {FIX}"]


def test_the_cli_prints_a_workers_error_not_its_remote_traceback() -> None:
    import ray.exceptions

    inner = DiskFullError(f"cannot write /x/s0.parquet: {FIX}")
    wrapped = ray.exceptions.RayTaskError("submit", "Traceback (most recent call last):\n  ...", inner)
    remote = wrapped.as_instanceof_cause()  # what ray.get raises: an instance of DiskFullError too
    assert isinstance(remote, DiskFullError) and "\n" in str(remote)
    assert longeval_error(remote) is inner
    assert longeval_error(ValueError("not ours")) is None


def test_a_replica_that_died_of_a_full_disk_stops_the_run_instead_of_restarting(tmp_path, monkeypatch) -> None:
    """Mock of `os.fsync` raising ENOSPC under the predictions writer; the driver's check gets the Ray error."""
    import ray.exceptions

    from longeval.stages.infer import PredictionWriter, stop_on_fatal

    writer = PredictionWriter(RunRoot(str(tmp_path)), extra={"model_id": "m", "replica": "r0", "node": "n"},
                              interval_s=0.0)
    monkeypatch.setattr("longeval.store.local.os.fsync", _full)
    writer.put([Prediction(instance_id="i", model_id="m", output="", output_tokens=0, finish_reason="stop",
                           cached_prompt_tokens=0, latency_s=0.0).to_row()])
    with pytest.raises(DiskFullError) as info:  # the engine's thread sees the disk full as itself
        writer.close()
    died = ray.exceptions.RayTaskError("run", "Traceback ...", info.value).as_instanceof_cause()
    with pytest.raises(DiskFullError) as stopped:
        stop_on_fatal(died)
    assert str(stopped.value) == str(info.value) and "No space left on device" in str(stopped.value)
    stop_on_fatal(ray.exceptions.RayTaskError("run", "tb", RuntimeError("engine died")))  # others: restart


def _mount_tiny_tmpfs(path: Path) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def _cli(capsys, caplog, *argv: str) -> tuple[int, str, str]:
    """`longeval ARGV` in this process (on this worker's Ray): its exit code, its stdout, and its stdout, stderr
    and log lines together (what a terminal shows of a `longeval` process: its log lines go to stderr there)."""
    caplog.clear()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.out + out.err + caplog.text


@pytest.mark.ray
def test_generating_onto_a_full_disk_prints_one_line(capsys, caplog) -> None:
    """A real full disk: a 64 KiB tmpfs (needs the right to mount; skipped without it)."""
    tiny = Path(f"/tmp/longeval-full-{uuid.uuid4().hex[:8]}")
    if os.geteuid() != 0 or not _mount_tiny_tmpfs(tiny):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        code, stdout, text = _cli(capsys, caplog, "generate", "model=tiny_random", "suite.tasks=[niah_single_1]",
                                  "suite.lengths=[4096]", "suite.samples=40", "suite.shard_size=2",
                                  "store.cache_instances=false", f"store.root={tiny}", "run_name=full")
        errors = [line for line in stdout.splitlines() if line.startswith("error:")]
        assert code == 2, text
        assert len(errors) == 1 and errors[0].endswith(FIX), stdout
        assert f"error: cannot write {tiny}/full/instances/" in errors[0]
        assert "Traceback" not in text
        assert not list((tiny / "full" / "instances").glob(".*.tmp"))
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
        tiny.rmdir()


@pytest.mark.ray


@pytest.mark.engine
def test_inferring_onto_a_full_disk_stops_with_one_line_and_no_restart(tmp_path, capsys, caplog) -> None:
    """A real full disk while predictions are written (the stand-in engine: no model runs): a tmpfs of 256 KiB
    holding the run's instances, filled up to its last 12 KiB (needs the right to mount; skipped without it)."""
    import shutil

    tiny = Path(f"/tmp/longeval-full-{uuid.uuid4().hex[:8]}")
    args = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
            "suite.samples=40", "suite.shard_size=20", "store.cache_instances=false", "run_name=p",
            "cluster.commit_interval_s=0"]
    if os.geteuid() != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    code, _, text = _cli(capsys, caplog, "generate", *args, f"store.root={tmp_path}")
    assert code == 0, text
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(tiny)]).returncode != 0:
        tiny.rmdir()
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(tmp_path / "p", tiny / "p")
        free = shutil.disk_usage(tiny).free
        (tiny / "filler").write_bytes(b"\0" * (free - 12 * 1024))
        code, stdout, text = _cli(capsys, caplog, "infer", *args, f"store.root={tiny}")
        errors = [line for line in stdout.splitlines() if line.startswith("error:")]
        assert code == 2, text
        assert len(errors) == 1 and errors[0].endswith(FIX), text
        assert f"error: cannot write {tiny}/p/" in errors[0]
        assert "starting it again" not in text and "failed to start" not in text and "Traceback" not in text
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
        tiny.rmdir()
