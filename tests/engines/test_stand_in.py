"""The stand-in engine (scale work only): prediction rows without a model, deterministic, about half right, and
never chosen unless `model.engine=stand_in` is given."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from longeval.config import Engine, conf_dir, group_choices, load_config
from longeval.engines import predictor_class, replica_engine_class
from longeval.engines.stand_in import WRONG_ANSWER, StandInEngine, StandInSettings, answers_right
from longeval.engines.vllm_engine import Request, VllmEngine
from longeval.errors import ConfigError
from longeval.planning.plan import make_plan
from longeval.records import PREDICTION_SCHEMA, SCORE_SCHEMA, Instance, Prediction, prediction_table
from longeval.run.pipeline import run
from longeval.scoring import score_prediction
from longeval.stages.generate import generate_shard, make_context
from longeval.store.run_root import RunRoot
from longeval.tasks import judge_for
from tests.engine_requests import requests_that_report_their_predecessors

STAND_IN = ["model=tiny_random", "model.engine=stand_in", "model.name=stand-in"]


def _engine(*extra: str) -> StandInEngine:
    cfg = load_config([*STAND_IN, *extra])
    return StandInEngine(cfg.model, "unused: the stand-in loads no model", 8192)


def _requests(n: int, *, references: tuple[str, ...] = ("42",)) -> list[Request]:
    return [Request(f"instance-{i}", [1, 2, 3, i], 16, references) for i in range(n)]


def _outputs(engine: StandInEngine, requests: list[Request], **kwargs) -> dict[str, dict]:
    return {row["instance_id"]: row for step in engine.stream(requests, **kwargs) for row in step}


# -- pure -------------------------------------------------------------------------------------------------


def test_rows_have_the_prediction_schema():
    rows = _outputs(_engine(), _requests(20))
    assert len(rows) == 20
    # The replica's writer adds model_id, replica and node, then builds its table with `prediction_table`, which
    # stamps each row's `attempt`.
    extra = {"model_id": "stand-in", "replica": "pool0/r0", "node": "n"}
    table = prediction_table([{**row, **extra} for row in rows.values()])
    assert set(table.column_names) == set(PREDICTION_SCHEMA.names) and table["attempt"].null_count == 0
    assert set(next(iter(rows.values()))) | set(extra) | {"attempt"} == set(PREDICTION_SCHEMA.names)
    for row in rows.values():
        Prediction.from_row({**row, **extra})
        assert row["error"] == "" and row["finish_reason"] == "stop" and row["output_tokens"] >= 1


def test_outputs_are_deterministic_and_do_not_depend_on_the_window():
    requests = _requests(50)
    first = _outputs(_engine(), requests, inflight=4)
    again = _outputs(_engine(), list(reversed(requests)), inflight=50)
    assert {k: r["output"] for k, r in first.items()} == {k: r["output"] for k, r in again.items()}


def test_about_half_are_answered_with_their_references():
    rows = _outputs(_engine(), _requests(2000))
    right = [r["output"] == "42" for r in rows.values()]
    assert 0.45 < sum(right) / len(right) < 0.55
    assert all(r["output"] in ("42", WRONG_ANSWER) for r in rows.values())
    assert [answers_right(i) for i in rows] == right
    shifted = _outputs(_engine("+model.engine_kwargs.right_fraction=0.2"), _requests(2000))
    assert 0.15 < sum(r["output"] == "42" for r in shifted.values()) / 2000 < 0.25


def test_window_and_pace_shape_the_steps():
    engine = _engine("+model.engine_kwargs.rows_per_step=3", "+model.engine_kwargs.step_s=0.001")
    steps = list(engine.stream(_requests(10), inflight=4))
    assert [len(s) for s in steps] == [3, 3, 3, 1]
    assert engine.stats.requests == 10 and engine.stats.steps == 4
    record = engine.stats.record()  # what the replica writes to its engine record (benchmarks/scale.py reads it)
    assert record["requests"] == 10 and record["peak_rss_bytes"] > 0 and record["read_bytes"] >= 0
    assert 0 < record["base_rss_bytes"] <= record["peak_rss_bytes"]
    assert engine.info["engine"] == "stand_in" and "no model ran" in engine.info["stand_in"]


def test_a_prompt_asked_back_is_dropped_as_by_vllm():
    """As `VllmEngine` (tests/engines/test_vllm_engine.py): one step a prompt, so the asked one is still waiting."""
    engine = _engine("+model.engine_kwargs.rows_per_step=1")
    requests = _requests(3)

    def source():
        yield from requests
        engine.give_back.ask([requests[2].instance_id])
        yield None

    rows = [row["instance_id"] for step in engine.stream(source(), inflight=4) for row in step]
    assert rows == [r.instance_id for r in requests[:2]]
    assert engine.give_back.given() == {requests[2].instance_id: ([], "")}  # no answer so far: no model ran


def test_budget_cuts_a_long_answer():
    long = tuple(f"word{i}" for i in range(40))
    rows = _outputs(_engine(), [Request(i, [1], 8, long) for i in (f"x{k}" for k in range(40))])
    cut = [r for r in rows.values() if r["output"] != WRONG_ANSWER]
    assert cut and all(r["output_tokens"] == 8 and r["finish_reason"] == "length" for r in cut)


def test_unknown_settings_are_refused():
    with pytest.raises(ConfigError, match="step_s"):
        StandInSettings.of(load_config([*STAND_IN, "+model.engine_kwargs.steps=1"]).model)


def test_scores_are_neither_all_right_nor_all_wrong(tiny_model_path):
    """Real instances (the tiny model's tokenizer) scored by their own judges: the right half scores 1."""
    cfg = load_config([*STAND_IN, "suite.tasks=[niah_single_1,niah_multivalue,vt,cwe]", "suite.lengths=[1024]",
                       "suite.samples=12", "suite.shard_size=12"])
    ctx = make_context(cfg, str(tiny_model_path))
    instances = [Instance.from_row(r) for s in make_plan(cfg).shards for r in generate_shard(ctx, s).to_pylist()]
    requests = [Request(i.instance_id, i.prompt_token_ids, i.max_new_tokens, tuple(i.references)) for i in instances]
    rows = _outputs(StandInEngine(cfg.model, str(tiny_model_path), 1024), requests)
    scores = {}
    for inst in instances:
        pred = Prediction.from_row({**rows[inst.instance_id], "model_id": "stand-in"})
        scores[inst.instance_id] = score_prediction(inst, pred, judge_for(inst.family, inst.task)).score
    assert {scores[i] for i in scores if answers_right(i)} == {1.0}
    assert {scores[i] for i in scores if not answers_right(i)} == {0.0}
    assert 0.25 < sum(scores.values()) / len(scores) < 0.75


# -- never unless asked -----------------------------------------------------------------------------------


def test_never_the_default():
    default = load_config([])  # what `make run` runs: the embedded default
    assert default.model.engine == Engine.vllm
    assert replica_engine_class(default.model) is VllmEngine
    assert not VllmEngine.needs_references  # a vLLM replica reads no references
    for model in group_choices("model"):
        assert load_config([f"model={model}"]).model.engine != Engine.stand_in, model
    presets = [p for group in ("model", "suite", "cluster", "store", "tracking")
               for p in (conf_dir() / group).glob("*.yaml")] + [conf_dir() / "config.yaml"]
    assert presets and not [p for p in presets if "stand_in" in p.read_text()]


def test_chosen_only_by_name():
    cfg = load_config(STAND_IN)
    assert replica_engine_class(cfg.model) is StandInEngine
    with pytest.raises(ConfigError, match="infer stage only"):
        predictor_class(cfg.model)  # builders (TAIL, MRCR pools) need a real model


# -- through the real pipeline ----------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.engine
def test_a_run_through_the_replicas_names_the_stand_in(tmp_path: Path, tiny_model_path):
    """Plan, generate, two replica actors, the writer, score and report: no vLLM, and the stand-in says so.

    Static dispatch, so each replica has its list whatever the timing: the stand-in answers at once, and with the
    queue one replica took all 24 prompts in a clean-clone run before the other's first ask arrived."""
    cfg = load_config([*STAND_IN, "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]", "suite.samples=6",
                       "suite.shard_size=3", "cluster.replicas=2", "cluster.num_cpus=4", "cluster.dispatch=static",
                       f"store.root={tmp_path}", "run_name=stand-in"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == 24 and set(preds["model_id"].to_pylist()) == {"stand-in"}
    assert set(preds["replica"].to_pylist()) == {"pool0/r0", "pool0/r1"}
    right = [answers_right(i) for i in preds["instance_id"].to_pylist()]
    assert pc.sum(pc.equal(preds["output"], WRONG_ANSWER)).as_py() == right.count(False)
    scores = root.read_stage("scores", SCORE_SCHEMA)
    assert 0.0 < pc.mean(scores["score"]).as_py() < 1.0
    records = [json.loads(p.read_text()) for p in Path(cfg.run_root, "engines").glob("*.json")]
    assert len(records) == 2 and all(r["engine"] == "stand_in" and "vllm" not in r for r in records)
    assert "engine: stand_in" in root.read_text("config.yaml")
    assert result.status["complete"]


def test_a_finished_request_is_let_go_before_the_next_prompt_is_read() -> None:
    """A 1M-token prompt is about 41 MB of Python ints: a replica holds its window, not its window and the
    request that just finished (a generator's locals outlive its yield; issue #22, the 1M pool's replica)."""
    alive: list[int] = []
    engine = _engine("model.max_num_seqs=1", "+model.engine_kwargs.rows_per_step=1")
    rows = {row["instance_id"] for step in engine.stream(requests_that_report_their_predecessors(5, alive), inflight=1)
            for row in step}
    assert len(rows) == 5 and alive == [0, 0, 0, 0, 0]
