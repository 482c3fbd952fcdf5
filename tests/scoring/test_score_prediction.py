"""score_prediction: failures become labelled zeros; nothing a model outputs can make it raise."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from longeval.errors import ConfigError, LongevalError
from longeval.records import SCORE_SCHEMA, Instance, Prediction, Score
from longeval.scoring import MAX_PARSED_ANSWER_CHARS, Judge, judge_all, judge_part, score_prediction

JUDGES: dict[str, Judge] = {"string_match_all": judge_all, "string_match_part": judge_part}
"""RULER's judges by the metric name an instance records (a task binds its judge; here the test picks it)."""


def scored(instance: Instance, prediction: Prediction) -> Score:
    return score_prediction(instance, prediction, JUDGES[instance.metric])


def make_instance(
    *,
    references: list[str] | None = None,
    metric: str = "string_match_all",
    meta: str = "{}",
) -> Instance:
    return Instance(
        instance_id="inst-1",
        family="ruler",
        task="niah_multivalue",
        context_id="ctx-1",
        target_length=4096,
        input_tokens=4000,
        depth=0.5,
        complexity="",
        prompt="Some long text ...",
        prompt_token_ids=[1, 2, 3],
        answer_prefix=" The special magic numbers are",
        max_new_tokens=128,
        references=["1234567", "7654321"] if references is None else references,
        metric=metric,
        meta=meta,
        seed=42,
        shard_index=0,
        index=0,
        generator_version="test",
        tokenizer_id="tiny",
    )


def make_prediction(output: str, *, error: str = "") -> Prediction:
    return Prediction(
        instance_id="inst-1",
        model_id="model-a",
        output=output,
        output_tokens=10,
        finish_reason="stop",
        cached_prompt_tokens=0,
        latency_s=0.1,
        error=error,
    )


def test_normal_answer_copies_group_columns() -> None:
    score = scored(make_instance(), make_prediction(" 1234567 and 7654321.\n"))
    assert score == Score(
        instance_id="inst-1",
        model_id="model-a",
        family="ruler",
        task="niah_multivalue",
        target_length=4096,
        depth=0.5,
        metric="string_match_all",
        score=1.0,
        parsed_answer="1234567 and 7654321.",
        error_type="",
    )


def test_partial_answer() -> None:
    assert scored(make_instance(), make_prediction("1234567")).score == 0.5


def test_string_match_part_dispatch() -> None:
    instance = make_instance(references=["Paris", "City of Paris"], metric="string_match_part")
    assert scored(instance, make_prediction("paris")).score == 1.0


def test_prompt_too_long() -> None:
    score = scored(make_instance(), make_prediction("", error="prompt_too_long: 5000 > 4096"))
    assert (score.score, score.error_type) == (0.0, "prompt_too_long")


def test_engine_error_scores_zero_even_with_partial_output() -> None:
    score = scored(make_instance(), make_prediction("1234567 7654321", error="engine_error: OOM"))
    assert (score.score, score.error_type) == (0.0, "engine_error")


@pytest.mark.parametrize("output", ["", "   ", "\x00\n\t "])
def test_empty_output_is_null(output: str) -> None:
    score = scored(make_instance(), make_prediction(output))
    assert (score.score, score.error_type, score.parsed_answer) == (0.0, "null", "")


def test_reasoning_keeps_text_after_last_think() -> None:
    instance = make_instance(meta=json.dumps({"reasoning": True}))
    score = scored(instance, make_prediction("<think>maybe 1234567</think> 7654321"))
    assert (score.score, score.parsed_answer) == (0.5, "7654321")


def test_reasoning_without_closing_tag_is_null() -> None:
    instance = make_instance(meta=json.dumps({"reasoning": True}))
    score = scored(instance, make_prediction("<think>1234567 7654321 ..."))
    assert (score.score, score.error_type) == (0.0, "null")


def test_think_tags_untouched_for_non_reasoning_models() -> None:
    score = scored(make_instance(), make_prediction("<think>1234567 7654321"))
    assert (score.score, score.error_type) == (1.0, "")


def test_empty_meta_means_not_reasoning() -> None:
    score = scored(make_instance(meta=""), make_prediction("<think>1234567 7654321"))
    assert score.score == 1.0


def test_parsed_answer_truncated() -> None:
    score = scored(make_instance(), make_prediction("x" * 5000 + " 1234567 7654321"))
    assert len(score.parsed_answer) == MAX_PARSED_ANSWER_CHARS
    assert score.score == 1.0  # the metric sees the full answer, not the truncated copy


def test_a_task_without_a_judge_is_refused_when_registered() -> None:
    import dataclasses

    from longeval.tasks import TASKS, register
    from longeval.tasks.family import Family

    spec = dataclasses.replace(TASKS["ruler/vt"], family="nojudge", judge=None)
    with pytest.raises(ConfigError, match="nojudge/vt has no judge"):
        register(Family(name="nojudge", title="no judge", tasks=(spec,)))


@pytest.mark.parametrize("meta", ["not json", "[1, 2]"])
def test_malformed_meta_is_a_config_error(meta: str) -> None:
    with pytest.raises(ConfigError, match="meta"):
        scored(make_instance(meta=meta), make_prediction("x"))


def test_mismatched_instance_id() -> None:
    prediction = Prediction(
        instance_id="other",
        model_id="m",
        output="x",
        output_tokens=1,
        finish_reason="stop",
        cached_prompt_tokens=0,
        latency_s=0.0,
        error="",
    )
    with pytest.raises(LongevalError, match="instance_id"):
        scored(make_instance(), prediction)


def test_score_row_matches_schema() -> None:
    row = scored(make_instance(), make_prediction("1234567")).to_row()
    table = pa.Table.from_pylist([row], schema=SCORE_SCHEMA)
    assert table.num_rows == 1


@given(
    output=st.text(),
    references=st.lists(st.text()),
    metric=st.sampled_from(sorted(JUDGES)),
    reasoning=st.booleans(),
    error=st.sampled_from(["", "prompt_too_long", "engine_error: boom"]),
)
def test_never_raises_on_model_output(
    output: str, references: list[str], metric: str, reasoning: bool, error: str
) -> None:
    instance = make_instance(references=references, metric=metric, meta=json.dumps({"reasoning": reasoning}))
    score = scored(instance, make_prediction(output, error=error))
    assert 0.0 <= score.score <= 1.0
    assert score.error_type in {"", "null", "prompt_too_long", "engine_error"}
    assert len(score.parsed_answer) <= MAX_PARSED_ANSWER_CHARS
    if score.error_type:
        assert score.score == 0.0
