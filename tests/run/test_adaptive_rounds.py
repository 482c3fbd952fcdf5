"""Adaptive runs through the pipeline: round shards, then one end-to-end run on the tiny model (engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from longeval.config import Config, load_config
from longeval.planning.plan import make_plan
from longeval.records import PREDICTION_SCHEMA
from longeval.run.adaptive_rounds import round_shards, settings_for
from longeval.stages.summarise import summarise_root
from longeval.stats.adaptive import BELOW, assess
from longeval.store.run_root import RunRoot

if TYPE_CHECKING:
    from longeval.stages.summarise import RunResult

TINY = ["model=tiny_random", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]", "suite.samples=12",
        "suite.shard_size=1", "model.max_num_seqs=4", "suite.adaptive=true", "+suite.params.ruler.max_new_tokens=16",
        "cluster.keep_engines=true"]
"""The tiny model's junk fills its budget and scores 0 at any length: 16 new tokens (not RULER's 30 to 128) keep
its decoding short and decide the same. The module's runs in this process share one engine (`cluster.keep_engines`:
an adaptive run sizes its pool from the suite's plan, the same for each of them)."""


def _cfg(root: Path, *extra: str):
    return load_config([*TINY, f"store.root={root}", *extra])


def _copy(cfg: Config, store: Path, *extra: str) -> Config:
    """`cfg`'s finished run root copied under `store`, and the config that points at the copy: for a test that
    writes to a run a module fixture made once."""
    shutil.copytree(cfg.run_root, store / Path(cfg.run_root).name)
    copied = _cfg(store, *extra)
    assert copied.run_root == str(store / Path(cfg.run_root).name), copied.run_root
    return copied


def test_round_shards_are_the_full_sweeps_next_shards(tmp_path):
    cfg = _cfg(tmp_path, "suite.adaptive_round=2", "suite.samples=8", "suite.shard_size=2")
    full = {s.name: s for s in make_plan(cfg, check_data=False).shards}
    states = assess({("ruler/niah_single_1", 1024): np.zeros(6), ("ruler/niah_single_1", 2048): np.ones(2),
                     ("ruler/vt", 1024): np.zeros(0), ("ruler/vt", 2048): np.r_[np.ones(6), np.zeros(1)][:6]},
                    settings_for(cfg))
    shards = round_shards(cfg, states)
    # decided cell: none; the others: the next two shards (4 instances), never past the cap of 8
    assert {s.name for s in shards} == {
        "ruler.niah_single_1.L2048.s42.00001", "ruler.niah_single_1.L2048.s42.00002",
        "ruler.vt.L1024.s42.00000", "ruler.vt.L1024.s42.00001", "ruler.vt.L2048.s42.00003"}
    assert all(full[s.name] == s for s in shards)


def test_a_suite_target_samples_every_task_in_equal_rounds_at_the_lengths_that_decide(tmp_path):
    """`suite.adaptive_target=suite`: 2048 looks above on the tasks' mean (vt's 0.9 and niah's 1.0), so 1024
    waits; each task gets the same next shards at 2048, including niah's, whose own cell alone would be open
    too. A vt cell that looks below on its own is sampled no further than the suite's round."""
    from longeval.run.adaptive_rounds import Cell, target_groups

    cfg = _cfg(tmp_path, "suite.samples=40", "suite.shard_size=5", "suite.adaptive_target=suite")
    scores = {("ruler/niah_single_1", 1024): np.ones(5), ("ruler/vt", 1024): np.zeros(5),
              ("ruler/niah_single_1", 2048): np.ones(10), ("ruler/vt", 2048): np.r_[np.ones(9), 0.0]}
    cells = {k: Cell(v, np.ones(len(v)), np.ones(len(v))) for k, v in scores.items()}
    shards = round_shards(cfg, assess(scores, settings_for(cfg)), make_plan(cfg, check_data=False), cells)
    assert {s.name for s in shards} == {"ruler.niah_single_1.L2048.s42.00002", "ruler.vt.L2048.s42.00002"}
    assert target_groups(cfg, {"ruler/vt", "ruler/niah_single_1"}) == {"all": ["ruler/niah_single_1", "ruler/vt"]}
    groups = target_groups(_cfg(tmp_path, "suite.adaptive_target=groups"), {"ruler/vt", "ruler/niah_single_1"})
    assert groups == {"retrieval": ["ruler/niah_single_1"], "multi-hop tracking": ["ruler/vt"],
                      "all": ["ruler/niah_single_1", "ruler/vt"]}
    assert target_groups(_cfg(tmp_path), {"ruler/vt"}) == {}


def test_an_unknown_adaptive_target_is_refused(tmp_path):
    from longeval.errors import ConfigError

    with pytest.raises(ConfigError, match="choices: tasks, groups, suite"):
        _cfg(tmp_path, "suite.adaptive_target=cells")


def test_the_round_schedule_and_alpha_split_reach_the_settings_and_bad_values_are_refused(tmp_path):
    from longeval.errors import ConfigError

    cfg = _cfg(tmp_path, "suite.shard_size=2", "suite.adaptive_growth=1.25", "suite.adaptive_round_max=5",
               "suite.adaptive_alpha_split=length", "suite.adaptive_near_stop=true")
    settings = settings_for(cfg)
    assert (settings.round_size, settings.round_growth, settings.round_max, settings.alpha_split,
            settings.near_stop) == (2, 1.25, 10, "length", True)
    assert settings_for(_cfg(tmp_path)).round_growth == 1.0  # constant rounds unless asked
    with pytest.raises(ConfigError, match="adaptive_growth=0.5 must be at least 1"):
        _cfg(tmp_path, "suite.adaptive_growth=0.5")
    with pytest.raises(ConfigError, match="choices: equal, length"):
        _cfg(tmp_path, "suite.adaptive_alpha_split=cost")


def test_group_targets_default_to_the_measured_schedule_and_a_root_keeps_the_one_it_was_sampled_with(tmp_path):
    """`suite` and `groups` default to shards of 2 and rounds from one instance per task growing by a quarter up
    to 10 instances a round, alpha split by length; `tasks` keeps constant rounds of 10 (whole shards) and the
    equal split; a value given is kept. A root sampled under older defaults (its config.yaml without the schedule
    keys) is refused with the overrides to pass, and resumed when they are passed (docs/adaptive.md, "Defaults")."""
    from omegaconf import OmegaConf

    from longeval.config import to_yaml
    from longeval.errors import ConfigError
    from longeval.run.provenance import check_same_config, older_default_root

    base = ["suite=ruler", *(a for a in TINY if not a.startswith("suite.shard_size")), f"store.root={tmp_path}",
            "run_name=r"]  # RULER sets no shard size of its own (quick, the default suite, does)
    suite = load_config([*base, "suite.adaptive_target=suite"])
    s = settings_for(suite)
    assert (suite.suite.shard_size, s.round_size, s.round_growth, s.round_max, s.alpha_split, s.column_power) == (
        2, 1, 1.25, 10, "length", 8.0)
    s = settings_for(load_config([*base, "suite.adaptive_target=groups", "suite.shard_size=5"]))
    assert (s.round_size, s.round_growth, s.round_max, s.alpha_split) == (1, 1.25, 10, "length")
    assert settings_for(load_config([*base, "suite.adaptive_target=groups", "suite.adaptive_step=4"])).round_size == 4
    tasks = load_config(base)
    s = settings_for(tasks)
    assert (tasks.suite.shard_size, s.round_size, s.round_growth, s.round_max, s.alpha_split, s.column_power) == (
        10, 10, 1.0, 0, "equal", 1.0)
    assert settings_for(load_config([*base, "suite.adaptive_round=3"])).round_size == 30  # whole shards, as before
    given = settings_for(load_config([*base, "suite.adaptive_target=suite", "suite.adaptive_alpha_split=equal"]))
    assert given.alpha_split == "equal" and given.round_growth == 1.25

    old = OmegaConf.create(to_yaml(load_config([*base, "suite.adaptive_target=suite", "suite.shard_size=10"])))
    for key in ("adaptive_growth", "adaptive_round_max", "adaptive_alpha_split", "adaptive_column_power",
                "adaptive_step"):
        del old.suite[key]
    root = RunRoot(suite.run_root)
    root.write_text("config.yaml", OmegaConf.to_yaml(old))
    with pytest.raises(ConfigError, match="sampled with suite.shard_size=10 suite.adaptive_growth=1.0 "
                                          "suite.adaptive_round_max=0 suite.adaptive_alpha_split=equal "
                                          "suite.adaptive_column_power=1.0 suite.adaptive_step=10; this run would go "
                                          "on with "
                                          "suite.shard_size=2 suite.adaptive_growth=1.25"):
        check_same_config(suite, root)
    check_same_config(load_config([*base, "suite.adaptive_target=suite", "suite.shard_size=10",
                                    "suite.adaptive_growth=1.0", "suite.adaptive_round_max=0",
                                    "suite.adaptive_alpha_split=equal", "suite.adaptive_column_power=1",
                                    "suite.adaptive_step=10"]), root)
    # a root sampled under the shards-of-2 defaults before rounds of one instance: its rounds were whole shards
    before_step = OmegaConf.create(to_yaml(suite))
    del before_step.suite["adaptive_step"]
    root.write_text("config.yaml", OmegaConf.to_yaml(before_step))
    with pytest.raises(ConfigError, match="sampled with suite.shard_size=2 .*suite.adaptive_step=2; this run would go "
                                          "on with .*suite.adaptive_step=1"):
        check_same_config(suite, root)
    check_same_config(load_config([*base, "suite.adaptive_target=suite", "suite.adaptive_step=2"]), root)
    root.write_text("config.yaml", OmegaConf.to_yaml(old))
    check_same_config(load_config([*base, "suite.adaptive=false", "suite.shard_size=10", "suite.shuffle=true"]),
                       root)  # completing it into the full sweep: no schedule to keep
    # under the default run name (it hashes the shard size) the older root is found and named, not reused silently
    unnamed = [a for a in base if not a.startswith("run_name")]
    older = load_config([*unnamed, "suite.adaptive_target=suite", "suite.shard_size=10"])
    RunRoot(older.run_root).write_text("config.yaml", OmegaConf.to_yaml(old))
    now = load_config([*unnamed, "suite.adaptive_target=suite"])
    assert now.run_root != older.run_root and older_default_root(now) == older.run_root
    assert older_default_root(load_config([*unnamed, "suite.adaptive_target=suite", "suite.shard_size=3"])) is None


def test_a_growing_schedule_takes_the_full_sweeps_next_shards_in_growing_rounds(tmp_path):
    """`suite.adaptive_growth=2`, shards of 1, at most 3 a round: an open cell at 2 instances gets 2 more shards,
    one at 4 gets 3 (the cap of a round), one at 0 a single shard; a decided cell none."""
    cfg = _cfg(tmp_path, "suite.adaptive_growth=2", "suite.adaptive_round_max=3")
    scores = {("ruler/niah_single_1", 1024): np.r_[1.0, 0.0], ("ruler/niah_single_1", 2048): np.ones(4),
              ("ruler/vt", 1024): np.zeros(0), ("ruler/vt", 2048): np.zeros(12)}
    shards = round_shards(cfg, assess(scores, settings_for(cfg)))
    assert sorted(s.name for s in shards) == [
        "ruler.niah_single_1.L1024.s42.00002", "ruler.niah_single_1.L1024.s42.00003",
        "ruler.niah_single_1.L2048.s42.00004", "ruler.niah_single_1.L2048.s42.00005",
        "ruler.niah_single_1.L2048.s42.00006", "ruler.vt.L1024.s42.00000"]


def test_stages_of_an_adaptive_run_go_together(tmp_path):
    from longeval.errors import ConfigError
    from longeval.run.pipeline import run

    with pytest.raises(ConfigError, match="generate and infer together"):
        run(_cfg(tmp_path), stages=["generate"])


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> tuple[Config, RunResult]:
    """One uninterrupted adaptive run of TINY: the run the stop/resume test checks and the reference the killed
    run must end like (an engine start and two rounds, paid once per module)."""
    from longeval.run.pipeline import run

    cfg = _cfg(tmp_path_factory.mktemp("whole"))
    return cfg, run(cfg)


@pytest.mark.engine
@pytest.mark.ray
def test_adaptive_run_stops_decided_cells_and_resumes_without_inference(tmp_path, whole_run):
    from longeval.engines.models import resolve_model_path
    from longeval.run.adaptive_rounds import run_rounds
    from longeval.run.pipeline import run

    cfg, result = whole_run
    cfg = _copy(cfg, tmp_path / "runs")  # the rerun below writes its summaries again
    root = RunRoot(cfg.run_root)
    cells = result.adaptive["adaptive"].to_pylist()
    assert len(cells) == 4
    # the tiny model scores 0: one instance leaves the upper bound above the threshold, two decide below (of 12,
    # at most one could fail with a score above 85.6); no cell reaches the cap
    for cell in cells:
        assert cell["decision"] == BELOW and cell["decided_early"] and cell["instances"] == 2, cell
        assert cell["ci_high"] < 85.6 and cell["tokens"] > 0
    names = root.shard_names("instances")
    assert len(names) == 4 * 2  # two rounds of one shard per cell, out of 12 in the full sweep
    # one engine served both rounds: started once (one record), ran twice
    records = [json.loads(p.read_text()) for p in (Path(cfg.run_root) / "engines").glob("*.json")]
    assert len(records) == 1 and records[0]["stats"]["runs"] == 2, records
    compute = result.adaptive["compute"]
    assert compute["instances"] == 8 and compute["full_instances"] == 48 and 0 < compute["token_share"] < 0.6
    # the planner's GPU-hours (longeval.planning.cost) on the default GPU, since this CPU run names none
    assert compute["gpu"] == "a100_80gb" and 0 < compute["gpu_hours"] < compute["full_gpu_hours_est"]
    assert all(0 < c["gpu_hours"] < c["full_gpu_hours_est"] for c in cells)
    lengths = {(r["scope"], r["name"]): r for r in result.adaptive["adaptive_lengths"].to_pylist()}
    assert lengths[("task", "ruler/vt")]["decided"] and lengths[("task", "ruler/vt")]["effective_length"] is None
    assert ("group", "retrieval") in lengths and ("group", "all") in lengths
    assert result.status["complete"]
    assert root.exists("summary/adaptive.csv") and root.exists("adaptive.json")
    from longeval.report.html import write_report

    page = write_report([cfg.run_root], tmp_path / "report.html", summarise=summarise_root).path.read_text()
    assert "Adaptive runs" in page and "adaptive-samples" in page
    # a rerun on the same root: no round, no new prediction, the same decisions
    before = root.read_stage("predictions", PREDICTION_SCHEMA).num_rows
    assert run_rounds(cfg, root, str(resolve_model_path(cfg.model.path))) == 0
    again = run(cfg)
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == before
    assert again.adaptive["adaptive"].equals(result.adaptive["adaptive"])


def test_terminal_view_shows_decisions_intervals_and_compute():
    import pyarrow as pa
    from rich.console import Console

    from longeval.report.adaptive import render_adaptive
    from longeval.run.adaptive_rounds import CELL_SCHEMA, LENGTH_SCHEMA

    base = {"skill_group": "retrieval", "cap": 500, "stopped_by": "interval", "score": 90.0, "ci_low": 86.0,
            "ci_high": 99.0, "tokens": 1000, "full_tokens_est": 20000}
    cells = pa.Table.from_pylist([
        {**base, "task": "ruler/niah_single_1", "target_length": 4096, "instances": 50, "decision": "above",
         "decided_early": True, "beats_shorter": False},
        {**base, "task": "ruler/niah_single_1", "target_length": 8192, "instances": 500, "decision": "undecided",
         "decided_early": False, "beats_shorter": False},
        {**base, "task": "ruler/vt", "target_length": 4096, "instances": 500, "decision": "above",
         "decided_early": False, "beats_shorter": False, "near_threshold": True}], schema=CELL_SCHEMA)
    lengths = pa.Table.from_pylist([
        {"scope": "task", "name": "ruler/niah_single_1", "effective_length": None, "effective_length_low": 4096,
         "effective_length_high": 8192, "decided": False},
        {"scope": "task", "name": "ruler/vt", "effective_length": 4096, "effective_length_low": 4096,
         "effective_length_high": 4096, "decided": True, "near_threshold": True, "noise_low": None,
         "noise_high": 4096},
        {"scope": "group", "name": "all", "effective_length": 4096, "effective_length_low": 4096,
         "effective_length_high": 4096, "decided": True, "near_threshold": False, "noise_low": 4096,
         "noise_high": 4096, "bound": "group mean"}], schema=LENGTH_SCHEMA)
    compute = {"instances": 550, "full_instances": 1000, "tokens": 2000, "full_tokens_est": 40000,
               "token_share": 0.05, "cells": 2, "decided_early": 1, "confidence": 0.95,
               "schedule": {"round_start": 2, "growth": 1.25, "round_max": 10, "alpha_split": "length",
                            "near_stop": False, "shard_size": 2}}
    from longeval.run.adaptive_rounds import GROUP_SCHEMA

    group = {"group": "all", "members": 2, "near_threshold": False, "bound": "group mean"}
    groups = pa.Table.from_pylist([
        {**group, "target_length": 4096, "columns": 50, "score": 93.0, "ci_low": 87.5, "ci_high": 98.0,
         "decision": "above"},
        {**group, "target_length": 8192, "columns": 0, "score": None, "ci_low": 0.0, "ci_high": 100.0,
         "decision": "undecided"}], schema=GROUP_SCHEMA)
    from longeval.tracking.payloads import summary_metrics

    tasks = pa.Table.from_pylist([{"model_id": "m", "family": "ruler", "task": "niah_single_1", "target_length": 4096,
                                   "score": 100.0, "n": 50}])
    metrics = summary_metrics({"tasks": tasks, "adaptive": cells, "adaptive_lengths": lengths.replace_schema_metadata(
        None)})
    assert metrics["adaptive/token_share"] == 0.05
    logged = [k for k in metrics if k.startswith("adaptive/effective_length")]
    assert logged == ["adaptive/effective_length/group/all"]  # undecided or near the threshold: not as a number
    assert metrics["adaptive/effective_length/group/all"] == 4096
    assert metrics["adaptive/effective_range/all/low"] == metrics["adaptive/effective_range/all/high"] == 4096
    assert not any(k.startswith("adaptive/effective_range/ruler") for k in metrics)  # tasks: not on a group mean
    console = Console(record=True, width=200)
    console.print(render_adaptive(cells, lengths, compute, groups))
    text = console.export_text()
    assert "group all on its mean (score [interval], points): 4K 93.0 [87.5, 98.0] above · 8K – undecided" in \
        " ".join(text.split())
    assert "above 50*" in text and "open 500" in text
    assert "undecided, between 4K and 8K" in text and "(5.0 %)" in text
    assert "above 500~" in text and "group all: 4K [group mean]" in " ".join(text.split())
    assert "ruler/vt: undecided near the threshold: a full sweep could give none to 4K (these instances give " \
        "4K)" in text
    assert "sampled: rounds of 2 growing by 25 % up to 10 instances per cell (shards of 2); α split over the " \
        "lengths in proportion to the length; near stop off" in " ".join(text.split())


@pytest.mark.engine
@pytest.mark.ray
def test_a_run_killed_mid_round_resumes_without_redoing_work_and_decides_the_same(tmp_path, whole_run):
    """kill -9 of the driver and its Ray processes while a round infers; the rerun finishes that round, runs the
    rest, and ends where an uninterrupted run ends, with no instance inferred twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from longeval.run.pipeline import run
    from tests.cli_subprocess import REPO

    reference = whole_run[1].adaptive["adaptive"]  # the same config (TINY), uninterrupted
    argv = [*TINY, f"store.root={tmp_path / 'crash'}", "run_name=crash", "cluster.commit_interval_s=0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "longeval.cli", "run", *argv], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    root = RunRoot(str(tmp_path / "crash" / "crash"))
    predictions = Path(root.uri) / "predictions"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (predictions.is_dir() and any(predictions.glob("*.parquet"))):
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # The killed driver's replicas outlive it by about a second (Ray's workers end when their raylet does): seen
    # committing 2 parts a second after the kill. The rerun starts at once and takes the lease over; from then on
    # their writers refuse to commit (`infer.PredictionWriter`'s fence), so nothing it lists as not done gets done
    # twice.
    shards = {p.name: p.stat().st_mtime_ns for p in (Path(root.uri) / "instances").glob("*.parquet")}
    before = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"]).num_rows
    assert shards and before > 0

    resumed = run(_cfg(tmp_path / "crash", "run_name=crash")).adaptive["adaptive"]
    assert resumed.drop_columns(["tokens", "full_tokens_est", "gpu_hours", "full_gpu_hours_est"]).equals(
        reference.drop_columns(["tokens", "full_tokens_est", "gpu_hours", "full_gpu_hours_est"]))
    ids = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"])["instance_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 8  # every instance inferred once: none lost, none redone
    assert {n: (Path(root.uri) / "instances" / n).stat().st_mtime_ns for n in shards} == shards  # not rewritten


SCHEDULES = {"defaults": (), "constant": ("suite.adaptive_growth=1", "suite.adaptive_round_max=0",
                                         "suite.adaptive_alpha_split=equal", "suite.adaptive_near_stop=true")}
"""The suite target's schedules: the defaults (growing rounds, the length split) and constant rounds with the equal
split and the near stop. Each samples its own rounds, so each is a whole run of its own."""
SUITE = ("suite.adaptive_target=suite", "suite.shard_size=3")


def _suite_run(store: Path, schedule: str) -> tuple[Config, RunResult]:
    from longeval.run.pipeline import run

    cfg = _cfg(store, *SUITE, *SCHEDULES[schedule])
    return cfg, run(cfg)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> tuple[Config, RunResult]:
    """The suite-target run under the default schedule, paid once: checked by its variant of the run test and,
    copied, by the cut-short resume test (what a resume of asked positions does is the same under any schedule)."""
    return _suite_run(tmp_path_factory.mktemp("suite"), "defaults")


@pytest.mark.engine
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.ray
def test_a_suite_target_run_decides_the_suites_effective_length_and_resumes(tmp_path, tiny_model_path, schedule,
                                                                           request):
    """`suite.adaptive_target=suite` on the tiny model (scores 0): every task gets the same shards per length
    (equal rounds), the suite's mean is decided below at both lengths by its own bound, and a rerun does no new
    inference; with the defaults (growing rounds, the length split) and with constant rounds, the equal split and
    the near stop (docs/adaptive.md). The outputs record the schedule used. Rounds of one instance inside shards of
    three: the engines run exactly the asked positions (`longeval.run.asked`); a round cut short is
    `test_a_suite_target_round_cut_short_finishes_only_the_asked_positions`.
    """
    from longeval.engines.models import resolve_model_path
    from longeval.records import INSTANCE_SCHEMA
    from longeval.run.adaptive_rounds import run_rounds
    from longeval.run.asked import read_asked

    if schedule == "defaults":  # the module's run, on a copy: the rerun below writes to its root
        shared, result = request.getfixturevalue("suite_run")
        cfg = _copy(shared, tmp_path, *SUITE, *SCHEDULES[schedule])
    else:
        cfg, result = _suite_run(tmp_path, schedule)
    assert cfg.suite.adaptive_step == 1
    cells = result.adaptive["adaptive"].to_pylist()
    by_length: dict[int, set[int]] = {}
    for c in cells:
        by_length.setdefault(c["target_length"], set()).add(c["instances"])
    assert all(len(counts) == 1 and 0 < min(counts) < 12 for counts in by_length.values()), cells
    lengths = {(r["scope"], r["name"]): r for r in result.adaptive["adaptive_lengths"].to_pylist()}
    suite = lengths[("group", "all")]
    assert suite["decided"] and suite["effective_length"] is None and suite["bound"] == "group mean"
    assert lengths[("task", "ruler/vt")]["bound"] == "cells" and result.adaptive["compute"]["target"] == "suite"
    # how it sampled, in the outputs: the schedule the run used (docs/adaptive.md, "Outputs")
    recorded = {**settings_for(cfg).schedule(), "shard_size": 3}
    assert result.adaptive["compute"]["schedule"] == recorded
    assert json.loads((Path(cfg.run_root) / "adaptive.json").read_text())["compute"]["schedule"] == recorded
    rows = [g for g in result.adaptive["adaptive_groups"].to_pylist() if g["group"] == "all"]
    assert [g["decision"] for g in rows] == ["below", "below"] and all(g["ci_high"] < 85.6 for g in rows)
    assert RunRoot(cfg.run_root).exists("summary/adaptive_groups.csv")
    root = RunRoot(cfg.run_root)
    asked = {(c["task"], c["target_length"]): c["instances"] for c in cells}
    assert read_asked(root) == asked
    before = root.read_stage("predictions", PREDICTION_SCHEMA).num_rows
    generated = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"]).num_rows
    assert before == sum(asked.values()) < generated  # a shard not filled by the asks holds unasked ones
    assert json.loads((Path(cfg.run_root) / "status.json").read_text())["complete"]  # unasked is not "not run"
    assert run_rounds(cfg, root, str(resolve_model_path(cfg.model.path))) == 0
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == before


@pytest.mark.engine
@pytest.mark.ray
def test_a_suite_target_round_cut_short_finishes_only_the_asked_positions(tmp_path, suite_run):
    """Rounds of one instance inside shards of three, cut short: a position asked in a shard already made is run
    alone by the resume's infer, and one asked past the shards made gets its shard generated and only that position
    run (`longeval.run.asked`). On a copy of the suite-target run (the default schedule): the schedule decides which
    positions a round asks, not how a resume finishes them."""
    from longeval.engines.models import resolve_model_path
    from longeval.planning.plan import Plan
    from longeval.records import INSTANCE_SCHEMA
    from longeval.run.adaptive_rounds import run_rounds
    from longeval.run.asked import ask, read_asked
    from longeval.stages.infer import infer

    cfg = _copy(suite_run[0], tmp_path, *SUITE)
    root = RunRoot(cfg.run_root)
    asked = read_asked(root)
    assert asked == {(c["task"], c["target_length"]): c["instances"]
                     for c in suite_run[1].adaptive["adaptive"].to_pylist()}
    before = root.read_stage("predictions", PREDICTION_SCHEMA).num_rows
    generated = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"]).num_rows
    model_path = str(resolve_model_path(cfg.model.path))
    # a round cut short after asking one more position of a cell whose shard holds it: the resume runs that one
    cell = next(k for k, n in sorted(asked.items()) if n % 3)
    ask(root, {cell: asked[cell] + 1})
    full = make_plan(cfg, check_data=False)
    assert infer(cfg, Plan(shards=(), pools=full.pools), root, model_path) == 1
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == before + 1
    # cut short before its shard was generated (the cell is at a shard's end now): the resume generates that shard
    # and runs the one asked position (every length stays decided below: no new round)
    assert asked[cell] + 1 == 3
    ask(root, {cell: 4})
    assert run_rounds(cfg, root, model_path) == 0
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == before + 2
    assert root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"]).num_rows == generated + 3
