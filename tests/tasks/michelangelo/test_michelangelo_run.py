"""Michelangelo end to end on real parts: local Ray, vLLM on CPU with the tiny random model (junk answers:
this checks the plumbing, the slices by complexity and the chance rates reported beside the scores)."""

from __future__ import annotations

import pytest

from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot

pytestmark = pytest.mark.engine


@pytest.mark.ray
def test_a_run_writes_scores_slices_curves_and_chance_rates(tmp_path, tiny_model_path):
    cfg = load_config(["model=tiny_random", "suite=michelangelo_quick", "suite.samples=3", "suite.shard_size=3",
                       "+suite.params.latent_list.max_new_tokens=16", "+suite.params.idk.max_new_tokens=16",
                       f"store.root={tmp_path}"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA)
    scores = root.read_stage("scores", SCORE_SCHEMA)
    assert instances.num_rows == root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == scores.num_rows == 9
    assert all(0.0 <= s <= 1.0 for s in scores["score"].to_pylist())
    by_task = {}
    for row in scores.to_pylist():
        by_task.setdefault(row["task"], set()).add(row["complexity"])
    assert set(by_task) == {"latent_list", "mrcr", "idk"}
    assert all(labels and "" not in labels for labels in by_task.values())
    slices = root.read_json("summary.json")["slices"]
    assert sum(r["n"] for r in slices) == 9
    assert {r["task"] for r in result.tables["chance"].to_pylist()} == {"latent_list", "mrcr", "idk"}
    # the instances of a task share its few-shot prefix (about 300 tokens for Latent List, 400 for MRCR) and
    # reach the engine together, so all but the first find it in vLLM's prefix cache
    cached = {p["instance_id"]: p["cached_prompt_tokens"]
              for p in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}
    for task in ("latent_list", "mrcr"):
        hits = sorted(cached[i["instance_id"]] for i in instances.to_pylist() if i["task"] == task)
        assert hits[1] >= 256, (task, hits)
    curve = root.read_json("summary.json")["cumulative"]
    assert {r["task"] for r in curve} == {"latent_list", "mrcr", "idk"}
