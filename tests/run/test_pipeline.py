"""End to end on real parts: local Ray, the vLLM engine on CPU, the tiny random model and SmolLM2.

Each engine start costs about a minute on two cores, so the module runs a handful of small runs and
checks everything about each: the tiny model's whole run is also the reference the interrupted run must end like,
and SmolLM2 runs once, for what needs a model that finds needles, with a pool of over-long prompts beside it for
the pools test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longeval.config import load_config, to_yaml
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot

pytestmark = pytest.mark.engine

# One sequence at a time: greedy outputs do not depend on what shares a batch, so an interrupted run resumed on
# this config must give the whole run's outputs exactly. The tiny model's junk always fills its budget: 16 tokens
# (not RULER's 30 to 128) keep the sequential decoding short. The runs in this process keep their engine for the
# next (`cluster.keep_engines`): the whole run's serves the resumed one, whose outputs must still be the same.
TINY = ["model=tiny_random", "suite.tasks=[niah_single_1,niah_multikey_2,vt,fwe]", "suite.lengths=[1024,2048]",
        "suite.samples=3", "suite.shard_size=2", "model.max_num_seqs=1", "+suite.params.ruler.max_new_tokens=16",
        "cluster.keep_engines=true"]


def _cfg(root: Path, *extra: str):
    return load_config([*TINY, f"store.root={root}", *extra])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model_path):
    """The whole run of TINY, uninterrupted: read by the tests below, copied where one writes to it."""
    root = tmp_path_factory.mktemp("runs")
    cfg = _cfg(root, "run_name=full")
    result = run(cfg)
    return cfg, result


@pytest.mark.ray
def test_every_stage_is_written_and_consistent(tiny_run):
    cfg, result = tiny_run
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    scores = root.read_stage("scores", SCORE_SCHEMA)
    expected = 4 * 2 * 3
    assert instances.num_rows == expected
    assert len(set(instances["instance_id"].to_pylist())) == expected
    assert sorted(preds["instance_id"].to_pylist()) == sorted(instances["instance_id"].to_pylist())
    assert sorted(scores["instance_id"].to_pylist()) == sorted(instances["instance_id"].to_pylist())
    # 3 samples in shards of 2: two shards per task and length
    assert len(root.shard_names("instances")) == 4 * 2 * 2
    # greedy decoding within each instance's budget
    for row in preds.to_pylist():
        assert row["error"] == ""
        assert 0 < row["output_tokens"] <= 16
    # summaries: one row per task x length, n = samples
    summary = result.summary.to_pylist()
    assert len(summary) == 8 and all(r["n"] == 3 for r in summary)
    assert {r["target_length"] for r in result.lengths.to_pylist()} == {1024, 2048}
    for name in ("summary/tasks.csv", "summary/lengths.csv", "summary/headline.csv", "summary/cumulative.csv",
                 "summary.json",
                 "config.yaml", "versions.json"):
        assert root.exists(name), name
    versions = root.read_json("versions.json")
    assert versions["vllm"] != "not installed" and versions["tokenizer_fingerprint"]
    assert versions["essay_corpus"]["name"] == "pydoc_data.topics (not RULER's)"


@pytest.mark.ray
def test_rerun_skips_everything_done(tmp_path, tiny_run):
    cfg_full, first = tiny_run
    shutil.copytree(cfg_full.run_root, tmp_path / "full")  # the rerun writes its summaries: on a copy
    cfg = _cfg(tmp_path, "run_name=full")
    root = RunRoot(cfg.run_root)
    before = {p.name: p.stat().st_mtime_ns for p in Path(cfg.run_root, "predictions").iterdir()}
    engines = sorted(p.name for p in Path(cfg.run_root, "engines").iterdir())
    again = run(cfg)
    # no engine start (an engine writes its record as it starts): nothing left to infer
    assert sorted(p.name for p in Path(cfg.run_root, "engines").iterdir()) == engines
    after = {p.name: p.stat().st_mtime_ns for p in Path(cfg.run_root, "predictions").iterdir()}
    assert before == after
    assert again.summary.equals(first.summary)
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == 4 * 2 * 3


@pytest.mark.ray
def test_interrupted_run_resumes_to_the_same_summary(tmp_path, tiny_run):
    """Kill a real `longeval run` once some predictions are written; the rerun completes it exactly. On the tiny
    model: this is about resuming, not about what the model finds; its whole run is the reference."""
    cfg_full, full = tiny_run
    total = 4 * 2 * 3
    args = [*TINY, f"store.root={tmp_path}", "run_name=interrupted", "cluster.commit_interval_s=0"]
    cmd = [sys.executable, "-m", "longeval.cli", "run", *args]
    proc = subprocess.Popen(cmd, env=dict(os.environ), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    preds_dir = tmp_path / "interrupted" / "predictions"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if preds_dir.is_dir() and len(list(preds_dir.glob("*.parquet"))) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list(preds_dir.glob("*.parquet")))
    assert 2 <= written < total
    cfg = load_config(args)
    resumed = run(cfg)
    preds = RunRoot(cfg.run_root).read_stage("predictions", PREDICTION_SCHEMA)
    ids = preds["instance_id"].to_pylist()
    assert len(ids) == len(set(ids)) == total  # no duplicate, none missing
    assert resumed.summary.equals(full.summary)
    # and the outputs themselves are identical to the uninterrupted run (greedy decoding)
    full_preds = RunRoot(cfg_full.run_root).read_stage("predictions", PREDICTION_SCHEMA)
    by_id = dict(zip(full_preds["instance_id"].to_pylist(), full_preds["output"].to_pylist(), strict=True))
    assert all(by_id[i] == o for i, o in zip(ids, preds["output"].to_pylist(), strict=True))


@pytest.mark.ray
def test_same_config_gives_byte_identical_instances(tmp_path, tiny_run):
    cfg_full, _ = tiny_run
    cfg = _cfg(tmp_path, "run_name=again", "cluster.generate_parallelism=1", "suite.shard_size=3")
    run(cfg, stages=("generate",))
    ours = RunRoot(cfg.run_root).read_stage("instances", INSTANCE_SCHEMA).sort_by("instance_id")
    theirs = RunRoot(cfg_full.run_root).read_stage("instances", INSTANCE_SCHEMA).sort_by("instance_id")
    cols = [c for c in INSTANCE_SCHEMA.names if c != "shard_index"]  # sharding differs on purpose
    assert ours.select(cols).equals(theirs.select(cols))


@pytest.mark.ray
def test_stage_commands_run_alone(tmp_path, tiny_run):
    cfg_full, full = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(cfg_full.run_root, copy)
    shutil.rmtree(copy / "summary")
    cfg = load_config([*TINY, f"store.root={tmp_path}", "run_name=copy"])
    result = run(cfg, stages=("report",))
    assert result.summary.equals(full.summary)


STAND_IN = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
            "suite.samples=2", "run_name=refused"]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_run_refused_for_its_config_writes_nothing(tmp_path, tiny_model_path):
    """A length above max_model_len is refused before the lease is taken (issue #46): no `_lease/`, no folder."""
    from longeval.cli import main

    store = tmp_path / "runs"
    assert main(["run", *STAND_IN, "suite.lengths=[2000000]", f"store.root={store}"]) == 2
    assert not store.exists()


def test_a_run_refused_by_a_dead_ray_address_removes_what_it_wrote(tmp_path, tiny_model_path):
    """Refused when it starts Ray, before any shard was committed, a run removes the lease, config.yaml and
    versions.json it created and the folders it made (issue #46), but never a file that was there before."""
    from tests.cli_subprocess import flat, longeval

    dead = {"RAY_ADDRESS": "127.0.0.1:1"}  # nothing listens on port 1: the real init_ray refuses
    store = tmp_path / "runs"
    proc = longeval("run", *STAND_IN, f"store.root={store}", env=dead, timeout=120)
    assert proc.returncode == 2, flat(proc)
    assert "error: cannot join the Ray cluster at 127.0.0.1:1 (RAY_ADDRESS)" in flat(proc)
    assert not store.exists(), _files(store)
    # a root that holds the same run's config.yaml already: that file stays as it was, the rest goes
    before = to_yaml(load_config([*STAND_IN, f"store.root={store}"]))
    (store / "refused").mkdir(parents=True)
    (store / "refused" / "config.yaml").write_text(before)
    proc = longeval("run", *STAND_IN, f"store.root={store}", env=dead, timeout=120)
    assert proc.returncode == 2 and "cannot join the Ray cluster" in flat(proc), flat(proc)
    assert _files(store) == ["refused", "refused/config.yaml"]
    assert (store / "refused" / "config.yaml").read_text() == before


SMOL = ["suite.tasks=[niah_single_1]", "suite.lengths=[1024,2048]", "suite.samples=6", "suite.shard_size=2",
        "model.max_model_len=1024", "cluster.bucket_edges=[1024]", "suite.allow_too_long=true"]
"""SmolLM2's one run, in two pools: 1024 tokens (what the model reads) and 2048, above its max_model_len here."""


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory, smollm2_path):
    """SmolLM2's run, paid once: its 1024-token pool is the needle test's, and the pool of over-long prompts
    beside it is the pools test's (one engine start serves both)."""
    cfg = load_config([*SMOL, f"store.root={tmp_path_factory.mktemp('smol')}", "run_name=full"])
    return cfg, run(cfg)


@pytest.mark.ray
def test_smollm2_finds_a_single_needle(smollm2_run):
    """One small real run: SmolLM2-135M-Instruct retrieves some needles from 1K tokens of noise."""
    cfg, result = smollm2_run
    row = {r["target_length"]: r for r in result.summary.to_pylist()}[1024]
    assert row["n"] == 6
    assert row["score"] > 0
    scores = RunRoot(cfg.run_root).read_stage("scores", SCORE_SCHEMA).to_pylist()
    assert all(s["error_type"] in ("", "null") for s in scores if s["target_length"] == 1024)
    assert {s["error_type"] for s in scores if s["target_length"] == 2048} == {"prompt_too_long"}


@pytest.mark.ray
def test_pools_per_length_bucket_and_over_long_prompts(smollm2_run):
    """Two pools; the second's prompts exceed the model's max_model_len: recorded, scored 0, never sent. On
    SmolLM2's run (`SMOL`), whose 1024-token pool is the needle test's."""
    cfg, result = smollm2_run
    root = RunRoot(cfg.run_root)
    preds = {p["instance_id"]: p for p in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    assert len(preds) == len(instances) == 12
    for inst in instances:
        error = preds[inst["instance_id"]]["error"]
        assert error.startswith("prompt_too_long") == (inst["target_length"] == 2048)
    rows = {r["target_length"]: r for r in result.summary.to_pylist()}
    assert rows[2048]["too_long"] == 6 and rows[2048]["score"] == 0
    assert rows[1024]["too_long"] == 0
    engines = list(Path(cfg.run_root, "engines").glob("*.json"))
    assert len(engines) == 1  # the all-too-long pool never started an engine
