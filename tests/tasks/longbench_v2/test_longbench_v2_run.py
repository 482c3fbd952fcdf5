"""LongBench v2 end to end on real parts: a data file in the official format, local Ray, vLLM on CPU with the
tiny random model (junk answers: mostly invalid, which is what the compensated accuracy is for)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot
from tests.tasks.longbench_v2.lb2_helpers import make_item, write_json

pytestmark = [pytest.mark.ray, pytest.mark.engine]

BASE = ["model=tiny_random", "suite=longbench_v2", "suite.lengths=[1024]", "model.max_num_seqs=4",
        "cluster.keep_engines=true"]
"""Both runs' pools alike (1024 tokens, four sequences): the second run in a worker takes over the first's engine."""


def test_zero_shot_run_truncates_scores_and_breaks_down(tmp_path, tiny_model_path):
    long_doc = " ".join(f"word{k}" for k in range(3000))  # far more than 1K tokens: must be middle-truncated
    items = [make_item(i, context=long_doc if i == 0 else make_item(i)["context"]) for i in range(6)]
    data = write_json(tmp_path / "data.json", items)
    cfg = load_config([*BASE, "suite.samples=6", "suite.shard_size=3", f"suite.data.longbench_v2_path={data}",
                       f"store.root={tmp_path}"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    assert len(instances) == root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == 6
    assert all(i["input_tokens"] + i["max_new_tokens"] <= 1024 for i in instances)
    truncated = [i for i in instances if '"truncated_tokens": 0' not in i["meta"]]
    assert len(truncated) == 1 and "Which statement about document 0 is right?" in truncated[0]["prompt"]
    scores = root.read_stage("scores", SCORE_SCHEMA).to_pylist()
    assert len(scores) == 6 and all(s["error_type"] in ("", "wrong", "invalid", "null") for s in scores)
    rows = {(r["split"], r["group"]): r for r in result.tables["longbench_v2"].to_pylist()}
    assert rows[("overall", "overall")]["n"] == 6
    assert rows[("difficulty", "easy")]["n"] == rows[("difficulty", "hard")]["n"] == 3
    invalid = sum(s["error_type"] in ("invalid", "null") for s in scores)
    right = sum(s["score"] for s in scores)
    assert rows[("overall", "overall")]["compensated_accuracy"] == pytest.approx(
        round(100 * (right + 0.25 * invalid) / 6, 2))


def test_cot_asks_twice_and_scores_only_the_answer_call(tmp_path, tiny_model_path):
    data = write_json(tmp_path / "data.json", [make_item(i) for i in range(4)])
    cfg = load_config([*BASE, "suite.samples=4", "suite.shard_size=2", "suite.params.longbench_v2.cot=true",
                       "+suite.params.longbench_v2.max_new_tokens=24", f"suite.data.longbench_v2_path={data}",
                       f"store.root={tmp_path}"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    instances = {i["instance_id"]: i for i in root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()}
    outputs = {p["instance_id"]: p["output"] for p in root.read_stage("predictions", PREDICTION_SCHEMA).to_pylist()}
    assert len(instances) == len(outputs) == 8  # four first calls, four answer calls
    answers = [i for i in instances.values() if '"parent_id"' in i["meta"]]
    assert len(answers) == 4
    for answer in answers:
        parent = instances[json.loads(answer["meta"])["parent_id"]]
        assert '"call": "cot"' in parent["meta"] and parent["max_new_tokens"] == 24
        assert answer["max_new_tokens"] == 128 and "The text is too long and omitted here." in answer["prompt"]
        assert outputs[parent["instance_id"]].strip() in answer["prompt"]  # the chain of thought is quoted
    scores = root.read_stage("scores", SCORE_SCHEMA)
    assert sorted(scores["instance_id"].to_pylist()) == sorted(a["instance_id"] for a in answers)
    assert result.tables["longbench_v2"].to_pylist()[0]["n"] == 4
    # one engine ran both calls: a pool is sized from its first calls, so the answer calls' round keeps it
    [record] = [json.loads(p.read_text()) for p in (Path(cfg.run_root) / "engines").glob("*.json")]
    assert record["stats"]["runs"] == 2 and record["stats"]["requests"] == 8, record["stats"]
    # a rerun finds every chain complete: nothing new is generated or sent
    assert run(cfg).summary.equals(result.summary)
    assert len(root.read_stage("instances", INSTANCE_SCHEMA)) == 8
