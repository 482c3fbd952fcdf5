"""Turn one (instance, prediction) pair into a Score.

Failures are data: a prompt that did not fit, an engine error or an empty answer each score 0 and are
labelled in `error_type`, so summaries count them instead of silently shrinking the denominator.
"""

from __future__ import annotations

import json

from longeval.errors import ConfigError, LongevalError
from longeval.records import ErrorKind, Instance, Prediction, Score
from longeval.scoring.judgement import Judge, Judgement, wants_raw_output
from longeval.scoring.string_match import (
    judge_all,
    judge_part,
    postprocess_prediction,
    string_match_all,
    string_match_part,
    strip_reasoning,
)

__all__ = [
    "Judge",
    "Judgement",
    "MAX_PARSED_ANSWER_CHARS",
    "score_prediction",
    "judge_all",
    "judge_part",
    "postprocess_prediction",
    "string_match_all",
    "string_match_part",
    "strip_reasoning",
]

MAX_PARSED_ANSWER_CHARS = 2000
"""Parsed answers are kept for inspection only; a runaway generation should not bloat the score files."""


def score_prediction(instance: Instance, prediction: Prediction, judge: Judge) -> Score:
    """Score one prediction against its instance with its task's judge; never raises on anything the model
    produced.

    Raises:
        ConfigError: the instance's `meta` is not a JSON object (a fault of the generated data, not the model).
        LongevalError: the prediction belongs to a different instance (a broken join upstream).
    """
    if prediction.instance_id != instance.instance_id:
        raise LongevalError(
            f"prediction for {prediction.instance_id} was paired with instance {instance.instance_id}; "
            "join predictions to instances on instance_id"
        )

    meta = _meta(instance)
    output = prediction.output
    if meta.get("reasoning") is True:
        # What an API's reasoning parser would return as the content: the text after </think>, trimmed
        # at the front (a raw-output grader must not lose every answer to the newline after the tag).
        output = strip_reasoning(output).lstrip()
    raw = wants_raw_output(judge)
    answer = output if raw else postprocess_prediction(output)

    if ErrorKind.of(prediction.error) is ErrorKind.PROMPT_TOO_LONG:
        value, error_type = 0.0, ErrorKind.PROMPT_TOO_LONG.value
    elif prediction.error:  # an engine error, or a kind this version does not know
        value, error_type = 0.0, ErrorKind.ENGINE_ERROR.value
    elif not answer.strip():
        value, error_type = 0.0, "null"
    else:
        judgement = judge(answer, instance.references, meta)
        value, error_type = min(1.0, max(0.0, float(judgement.score))), judgement.error_type
        answer = judgement.parsed_answer

    return Score(
        instance_id=instance.instance_id,
        model_id=prediction.model_id,
        family=instance.family,
        task=instance.task,
        target_length=instance.target_length,
        depth=instance.depth,
        metric=instance.metric,
        score=value,
        parsed_answer=answer[:MAX_PARSED_ANSWER_CHARS],
        error_type=error_type,
        complexity=instance.complexity,
    )


def _meta(instance: Instance) -> dict:
    """The instance's task-specific JSON (the generator wrote it; a broken one is a data fault)."""
    if not instance.meta:
        return {}
    try:
        meta = json.loads(instance.meta)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"instance {instance.instance_id} has malformed meta JSON ({exc}); regenerate the instances"
        ) from exc
    if not isinstance(meta, dict):
        raise ConfigError(
            f"instance {instance.instance_id} has meta {instance.meta[:80]!r}, expected a JSON object; "
            "regenerate the instances"
        )
    return meta
