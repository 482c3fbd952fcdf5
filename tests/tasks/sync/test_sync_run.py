"""SYNC end to end on real parts: local Ray, vLLM on CPU with the tiny random model (its answers are junk,
so this checks the plumbing: shared contexts, prefix-cache hits, records, the error table)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot
from longeval.tasks.sync import ERROR_TYPES

pytestmark = [pytest.mark.ray, pytest.mark.engine]


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, tiny_model_path):
    cfg = load_config(["model=tiny_random", "suite=sync_quick", "suite.samples=2", "suite.shard_size=2",
                       "suite.params.sync.max_new_tokens=16", f"store.root={tmp_path_factory.mktemp('sync')}"])
    return cfg, run(cfg)


def test_every_record_is_written_for_all_six_tasks(sync_run):
    cfg, result = sync_run
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    scores = root.read_stage("scores", SCORE_SCHEMA)
    assert instances.num_rows == preds.num_rows == scores.num_rows == 6 * 2
    assert {r["task"] for r in result.summary.to_pylist()} == {
        "connected_nodes", "shortest_path", "longest_path", "single_hop_translation", "multi_hop_translation",
        "letter_coverage"}
    assert all(e == "" for e in preds["error"].to_pylist())
    assert set(scores["error_type"].to_pylist()) <= {"", "null", *ERROR_TYPES}
    assert root.exists("summary/errors.csv")
    errors = result.errors.to_pylist()
    assert sum(r["count"] for r in errors) == sum(s != "" for s in scores["error_type"].to_pylist())


def test_tasks_of_a_domain_share_a_context_and_the_prefix_cache(sync_run):
    cfg, _ = sync_run
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    cached = {p["instance_id"]: p["cached_prompt_tokens"]
              for p in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}
    groups: dict[str, list[dict]] = defaultdict(list)
    for inst in instances:
        groups[inst["context_id"]].append(inst)
    assert len(groups) == 2 * 2  # two domains x two contexts, three tasks each
    for members in groups.values():
        assert len(members) == 3 and len({m["index"] for m in members}) == 1
        hits = sorted(cached[m["instance_id"]] for m in members)
        # the first prompt of a group computes the context; the other two find most of it cached
        assert hits[1] > 0.6 * min(m["input_tokens"] for m in members), hits
