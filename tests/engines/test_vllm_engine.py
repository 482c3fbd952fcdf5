"""The vLLM engine's settings, as far as they are pure (the environment it asks for), and what it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.config import ModelConfig, load_config
from longeval.config.redaction import PUBLIC_ENV
from longeval.engines.vllm_engine import Partial, Request, VllmEngine, engine_env
from tests.engine_requests import requests_that_report_their_predecessors


def test_batch_invariant_asks_vllm_for_its_batch_invariant_kernels_and_stays_readable_in_records():
    assert "VLLM_BATCH_INVARIANT" not in engine_env(load_config(["model=tiny_random"]).model)
    model = load_config(["model=tiny_random", "model.batch_invariant=true"]).model
    assert engine_env(model)["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" in PUBLIC_ENV  # an engine setting, written in clear in config.yaml and records


def test_a_users_own_setting_of_the_variable_wins():
    model = load_config(["model=tiny_random", "model.batch_invariant=true", "+model.env.VLLM_BATCH_INVARIANT=0"]).model
    assert engine_env(model)["VLLM_BATCH_INVARIANT"] == "0"


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path):
    """vLLM in-process on the tiny model (about 10 s to start), shared by this module's tests."""
    model = ModelConfig(name="tiny", path=str(tiny_model_path), dtype="float32", enforce_eager=True,
                        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"})
    engine = VllmEngine(model, str(tiny_model_path), 512)
    yield engine
    engine.shutdown()


@pytest.mark.engine
def test_a_finished_request_is_let_go_before_the_next_prompt_is_read(engine: VllmEngine) -> None:
    """As the stand-in (tests/engines/test_stand_in.py): the engine holds its window of prompts, and neither a
    finished request nor its step's outputs outlive the step."""
    alive: list[int] = []
    rows = [row for step in engine.stream(requests_that_report_their_predecessors(4, alive), inflight=1)
            for row in step]
    assert len(rows) == 4 and not any(row["error"] for row in rows) and alive == [0, 0, 0, 0]


@pytest.mark.engine
def test_a_prompt_asked_back_in_flight_is_dropped_unfinished_and_the_others_run(engine: VllmEngine) -> None:
    """Dynamic dispatch moves a slow replica's latest prompt to a free one: the engine aborts it between steps and
    reports it given back, so it is run once, elsewhere, and never also finished here."""
    def requests():
        yield from (Request(f"r{i}", [1, 2, 3, 4 + i], 24) for i in range(3))
        engine.give_back.ask(["r1", "never-sent"])  # asked while r0..r2 are in the engine
        yield None

    rows = [row for step in engine.stream(requests(), inflight=4) for row in step]
    assert sorted(row["instance_id"] for row in rows) == ["r0", "r2"]
    given = engine.give_back.given()
    assert list(given) == ["r1"] and engine.give_back.given() == {}
    # the engine is left clean: the next stream runs r1 from scratch
    again = [row for step in engine.stream(iter([Request("r1", [1, 2, 3, 5], 24)])) for row in step]
    assert [row["instance_id"] for row in again] == ["r1"] and not again[0]["error"]


@pytest.mark.engine
def test_a_prompt_given_back_part_way_is_continued_from_its_answer_so_far(engine: VllmEngine) -> None:
    """A prompt moved off a slow replica goes with what it had generated: the next engine prefills prompt and
    answer so far and generates the rest, and the row holds the whole answer, as if it had never moved."""
    prompt = [1, 2, 3, 11]
    whole = engine.generate([Request("w", prompt, 24)])[0]

    seen: list[dict[str, int]] = []

    def requests():
        yield Request("w", prompt, 24)
        yield from [None] * 6  # six engine steps: the prefill and a few tokens
        seen.append(engine.progress())  # what the replica reports to the queue when it asks
        engine.give_back.ask(["w"])
        yield None

    assert [row for step in engine.stream(requests(), inflight=2) for row in step] == []
    tokens, text = engine.give_back.given()["w"]
    assert 0 < len(tokens) < whole["output_tokens"] and whole["output"].startswith(text)
    assert 0 < seen[0]["w"] <= len(tokens) <= seen[0]["w"] + 1  # one more step ran before the engine let it go
    generated = engine.stats.output_tokens
    again = engine.generate([Request("w", prompt, 24, resumed=Partial(tuple(tokens), text))])[0]
    assert engine.stats.output_tokens - generated == whole["output_tokens"] - len(tokens)  # only the rest ran
    assert (again["output"], again["output_tokens"]) == (whole["output"], whole["output_tokens"])
    assert again["finish_reason"] == whole["finish_reason"] and not again["error"]
