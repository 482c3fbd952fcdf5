"""Dynamic and static dispatch through the real infer stage on real Ray, one of two replicas slowed.

The engine is the stand-in (named as such: no model runs, each step takes `step_s`), so the test measures
where work goes, not a model. One replica is slowed the way the issue measured it: its process is stopped and
continued (SIGSTOP/SIGCONT) on a duty cycle while the stage runs (`benchmarks/dispatch.py`'s own).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.dispatch import duty_cycle
from longeval.config import load_config
from longeval.records import PREDICTION_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot

pytestmark = [pytest.mark.ray, pytest.mark.engine]

STAND_IN = ["model=tiny_random", "model.engine=stand_in", "model.name=stand-in", "model.max_num_seqs=4",
            "+model.engine_kwargs.step_s=0.05", "+model.engine_kwargs.rows_per_step=1",
            "suite=ruler", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024]", "suite.samples=40",
            "suite.shard_size=20", "cluster.replicas=2", "cluster.num_cpus=4", "cluster.commit_interval_s=0"]


def _run_with_a_slow_replica(tmp_path: Path, *extra: str) -> tuple[RunRoot, Counter]:
    cfg = load_config([*STAND_IN, f"store.root={tmp_path}", *extra])
    run(cfg, stages=("generate",))
    done = threading.Event()
    slower = threading.Thread(target=duty_cycle, args=(Path(cfg.run_root) / "engines", "pool0/r1", 0.3, 0.1, done))
    slower.start()
    try:
        run(cfg, stages=("infer",))
    finally:
        done.set()
        slower.join()
    root = RunRoot(cfg.run_root)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == 80 and len(set(preds["instance_id"].to_pylist())) == 80  # none lost, none twice
    assert set(preds["error"].to_pylist()) == {""}
    assert None not in preds["engine_step"].to_pylist()  # which batch step ran each prompt is recorded
    return root, Counter(preds["replica"].to_pylist())


@pytest.mark.engine
def test_dynamic_dispatch_moves_work_to_the_free_replica(tmp_path: Path) -> None:
    _, per_replica = _run_with_a_slow_replica(tmp_path)
    print(f"dynamic: prompts per replica {dict(per_replica)}")
    assert per_replica["pool0/r0"] >= 2 * per_replica["pool0/r1"]  # r1 runs a quarter of the time


@pytest.mark.engine
def test_static_dispatch_keeps_its_fixed_lists(tmp_path: Path) -> None:
    _, per_replica = _run_with_a_slow_replica(tmp_path, "cluster.dispatch=static")
    print(f"static: prompts per replica {dict(per_replica)}")
    assert per_replica == Counter({"pool0/r0": 40, "pool0/r1": 40})  # equal costs: equal lists, whatever the speed
