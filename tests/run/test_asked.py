"""An adaptive run's record of asked positions (`longeval.run.asked`): what the engines run, what counts as planned."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from longeval.config import load_config
from longeval.planning.plan import make_plan
from longeval.run.asked import ASKED_FILE, ask, asked_shards, only_asked, read_asked, seed_asked
from longeval.store.run_root import RunRoot

BASE = ["model=tiny_random", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]", "suite.samples=8",
        "suite.adaptive=true", "suite.adaptive_target=suite"]
NIAH = ("ruler/niah_single_1", 1024)


def _cfg(root: Path, *extra: str):
    return load_config([*BASE, f"store.root={root}", "run_name=r", *extra])


def _instances(cfg) -> tuple[pa.Table, dict[tuple[str, int, int], int]]:
    """Every planned instance's place columns, and each one's position in its cell's order."""
    rows, position = [], {}
    for s in make_plan(cfg, check_data=False).shards:
        family, task = s.task.split("/")
        for p, i in zip(range(s.start, s.stop), s.indices(), strict=True):
            rows.append({"family": family, "task": task, "target_length": s.target_length, "index": i})
            position[(s.task, s.target_length, i)] = p
    return pa.Table.from_pylist(rows), position


def test_a_group_target_asks_one_column_at_a_time_inside_shards_of_two(tmp_path):
    cfg = _cfg(tmp_path)
    assert (cfg.suite.shard_size, cfg.suite.adaptive_step) == (2, 1)
    plan = make_plan(cfg, check_data=False)
    shards = asked_shards(plan, {NIAH: (0, 1), ("ruler/vt", 2048): (2, 5)})
    # one position is one shard of two; positions 2..4 straddle two shards, both generated
    assert [(s.task, s.target_length, s.start, s.stop) for s in shards] == [
        (*NIAH, 0, 2), ("ruler/vt", 2048, 2, 4), ("ruler/vt", 2048, 4, 6)]


def test_only_the_asked_positions_run_and_count_as_planned(tmp_path):
    cfg = _cfg(tmp_path)
    root = RunRoot(cfg.run_root)
    instances, position = _instances(cfg)
    assert only_asked(cfg, root, instances).num_rows == instances.num_rows  # no record: every generated one

    ask(root, {NIAH: 3})
    kept = only_asked(cfg, root, instances).to_pylist()
    assert sorted(position[(f"{r['family']}/{r['task']}", r["target_length"], r["index"])] for r in kept) == [0, 1, 2]
    assert {(r["task"], r["target_length"]) for r in kept} == {("niah_single_1", 1024)}

    assert ask(root, {NIAH: 1, ("ruler/vt", 1024): 2}) == {NIAH: 3, ("ruler/vt", 1024): 2}  # never lowered
    assert read_asked(root) == {NIAH: 3, ("ruler/vt", 1024): 2}
    assert only_asked(cfg, root, instances).num_rows == 5
    full_sweep = _cfg(tmp_path, "suite.adaptive=false", "suite.shard_size=2")
    assert only_asked(full_sweep, root, instances).num_rows == instances.num_rows  # completing the root runs all


def test_a_root_from_before_the_record_asked_for_every_position_it_generated(tmp_path):
    cfg = _cfg(tmp_path)
    root = RunRoot(cfg.run_root)
    plan = make_plan(cfg, check_data=False)
    niah = [s for s in plan.shards if (s.task, s.target_length) == NIAH]
    for s in niah[:2]:  # two whole rounds of one shard each, as such a root holds them
        root.write_table("instances", s.name, pa.table({"x": [1]}))
    seed_asked(root, plan)
    assert read_asked(root) == {NIAH: 4}
    ask(root, {NIAH: 5})
    seed_asked(root, plan)  # a root that keeps a record keeps it
    assert read_asked(root) == {NIAH: 5} and root.exists(ASKED_FILE)
