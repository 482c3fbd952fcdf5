"""Engines kept between the runs of one process (`cluster.keep_engines`): taken over by the next run whose pool is
the same, stopped when a pool needs their room or when released.

On the **stand-in engine** (`model.engine=stand_in`: canned answers, no model): what is tested is which replica
actors serve which run, not what a model computes. The real engine's reset (its prefix cache emptied) runs in
tests/run/test_adaptive_rounds.py and tests/run/test_pipeline.py, whose modules keep one engine for their runs and
compare resumed runs with uninterrupted ones.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from longeval.config import load_config
from longeval.records import PREDICTION_SCHEMA
from longeval.run.pipeline import run
from longeval.stages.infer import kept_engines, release_engines
from longeval.store.run_root import RunRoot

pytestmark = [pytest.mark.ray, pytest.mark.engine]

STAND_IN = ["model=tiny_random", "model.engine=stand_in", "model.name=stand-in", "suite.tasks=[niah_single_1]",
            "suite.lengths=[1024]", "suite.samples=2", "model.max_num_seqs=2", "cluster.keep_engines=true"]


def _run(store: Path, name: str, *extra: str) -> tuple[dict, dict[str, str]]:
    """The run's first engine record (the only one with one replica) and its outputs by instance id."""
    cfg = load_config([*STAND_IN, f"store.root={store}", f"run_name={name}", *extra])
    run(cfg)
    records = sorted((json.loads(p.read_text()) for p in Path(cfg.run_root, "engines").glob("*.json")),
                     key=lambda r: r["replica"])
    assert len(records) == (1 if cfg.cluster.replicas == 1 else 2), records  # two prompts: at most two replicas
    record = records[0]
    preds = RunRoot(cfg.run_root).read_stage("predictions", PREDICTION_SCHEMA)
    return record, dict(zip(preds["instance_id"].to_pylist(), preds["output"].to_pylist(), strict=True))


def _gone(pid: int, within_s: float = 30.0) -> bool:
    """Whether the replica's process ends (Ray ends a killed actor's worker at once; 30 s is for a loaded machine)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_the_next_run_takes_over_a_kept_engine_and_a_pool_that_needs_its_room_stops_it(tmp_path: Path) -> None:
    import ray

    release_engines()  # whatever an earlier test of this worker kept
    first, outputs = _run(tmp_path, "first")
    assert kept_engines() == 1 and "kept_from_earlier_runs" not in first
    # the same pool: the same actor serves the second run, with its own record and figures
    second, again = _run(tmp_path, "second")
    assert second["pid"] == first["pid"] and second["kept_from_earlier_runs"] == 1
    assert again == outputs and second["stats"]["rows"] == first["stats"]["rows"] == 2
    # without the setting a run takes nothing over and keeps nothing; its pool, which needs every CPU engines may
    # have (one stays free for the other stages), stops the kept engine first. This worker's Ray may be one an
    # earlier test started with more CPUs: then the pool has more replicas than the run's two contexts use.
    replicas = int(ray.cluster_resources()["CPU"]) - 1
    third, _ = _run(tmp_path, "third", f"cluster.replicas={replicas}", "cluster.keep_engines=false")
    assert third["pid"] != first["pid"] and "kept_from_earlier_runs" not in third
    assert kept_engines() == 0 and _gone(first["pid"]) and _gone(third["pid"])
    # another pool's engines kept, then released
    fourth, _ = _run(tmp_path, "fourth", "model.max_num_seqs=3")
    assert kept_engines() == 1 and "kept_from_earlier_runs" not in fourth
    assert release_engines() == 1 and kept_engines() == 0
    assert _gone(fourth["pid"])
