"""RULER's string-match metrics, per sample, on a 0..1 scale.

These reproduce RULER's `postprocess_pred`, `string_match_all` and `string_match_part` exactly (RULER reports
the mean over samples ×100); other ports differ, so keep every detail, including that an empty reference
string counts as found. Nothing here may raise on a model's output: any string is a valid prediction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from longeval.scoring.judgement import Judgement

__all__ = ["judge_all", "judge_part", "postprocess_prediction", "string_match_all", "string_match_part",
           "strip_reasoning"]

_CONTROL_CHARS = re.compile(r"[\x00-\x1f]")
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def postprocess_prediction(text: str) -> str:
    """Strip, turn every control character into a newline, strip again (RULER's `postprocess_pred`)."""
    return _CONTROL_CHARS.sub("\n", text.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of references found in the prediction, case-insensitively (niah, vt, cwe, fwe).

    Returns 0.0 when there are no references, where RULER would divide by zero.
    """
    if not references:
        return 0.0
    found = postprocess_prediction(prediction).lower()
    return sum(1.0 for ref in references if ref.lower() in found) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any reference (e.g. any alias of a QA answer) is found case-insensitively, else 0.0."""
    found = postprocess_prediction(prediction).lower()
    return 1.0 if any(ref.lower() in found for ref in references) else 0.0


def strip_reasoning(text: str) -> str:
    """Keep only the answer of a reasoning model: the text after the last `</think>`.

    An opened `<think>` that is never closed means the model spent its whole budget thinking and never
    answered, so the answer is "" (scored as a null), not the reasoning text, which may mention the needle.
    """
    if _THINK_CLOSE in text:
        return text.rsplit(_THINK_CLOSE, 1)[1]
    if _THINK_OPEN in text:
        return ""
    return text


def judge_all(answer: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """`string_match_all` as a task's judge (RULER's NIAH, VT, CWE, FWE)."""
    return Judgement(score=string_match_all(answer, references), parsed_answer=answer)


def judge_part(answer: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """`string_match_part` as a task's judge (RULER's QA)."""
    return Judgement(score=string_match_part(answer, references), parsed_answer=answer)
