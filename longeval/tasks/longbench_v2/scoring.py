"""LongBench v2 scoring (Bai et al., 2025, §4 and Appendix E): one letter per output, and the paper's breakdown.

Extraction is the reference's, rule for rule, so our accuracies are comparable with Table 2:

1. every `*` is removed first (so Markdown bold such as `**The correct answer is (B)**` still counts);
2. the first match of `The correct answer is (X)` with X in A–D, anywhere in the output, wins;
3. only if there is none, the first match of `The correct answer is X` (no parentheses) is taken.

Hence with several answers the first parenthesised one wins even if a bare one comes earlier, and a model that
changes its mind is held to its first parenthesised answer. The match is case-sensitive, as in the reference:
"the correct answer is (b)" or "The correct answer is: (B)" parse to nothing. The bare form also reads the first
letter of a word ("The correct answer is Alice" gives A); we keep that quirk because the paper's numbers have it.

An output with no parseable letter is "invalid": it scores 0 for accuracy and 0.25 (a random guess among four)
for the compensated accuracy of Table 5. Failed requests are invalid too, never dropped (the reference drops
them after five tries, which shrinks the denominator).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from longeval.scoring.judgement import Judgement
from longeval.tasks.longbench_v2.data import DIFFICULTIES, DOMAINS, LENGTHS

WRONG = "wrong"
INVALID = "invalid"
ERROR_TYPES = (WRONG, INVALID)

GUESS_SCORE = 0.25
"""What compensated accuracy credits an invalid output with: the chance of guessing one of four letters."""

_PARENTHESISED = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")


def extract_answer(output: str) -> str:
    """The chosen letter, or "" when the output names none in the expected form."""
    if not isinstance(output, str):
        return ""
    text = output.replace("*", "")
    match = _PARENTHESISED.search(text) or _BARE.search(text)
    return match.group(1) if match else ""


def score_longbench_v2(output: str, references: Sequence[str], meta: Mapping[str, Any]) -> Judgement:
    """1 when the extracted letter is the reference letter; error_type "wrong" or "invalid" otherwise.

    Never raises: any output string (or a missing one) gives a Judgement.
    """
    letter = extract_answer(output)
    if not letter:
        return Judgement(0.0, "", INVALID)
    right = letter == _gold(references, meta)
    return Judgement(float(right), letter, "" if right else WRONG)


def _gold(references: Sequence[str] | None, meta: Mapping[str, Any] | None) -> str:
    """The right letter: the first reference (a list, or an array read back from Arrow), else meta's answer."""
    try:
        refs = [] if references is None or isinstance(references, str) else list(references)
    except TypeError:
        refs = []
    if refs:
        return str(refs[0]).strip()
    if isinstance(references, str) and references.strip():
        return references.strip()
    return str(meta.get("answer", "")).strip() if isinstance(meta, Mapping) else ""


def _field(row: Mapping[str, Any], name: str) -> str:
    """A meta field of a score row, at the top level or inside its `meta` (a dict or JSON text)."""
    if row.get(name) is not None:
        return str(row[name])
    meta = row.get("meta")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
    if isinstance(meta, Mapping) and meta.get(name) is not None:
        return str(meta[name])
    return ""


def _score(row: Mapping[str, Any]) -> float:
    try:
        value = float(row.get("score") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


def is_invalid(row: Mapping[str, Any]) -> bool:
    """No letter to credit: the scorer's "invalid", or any other error label (e.g. a failed request)."""
    return str(row.get("error_type") or "") not in ("", WRONG)


def _summary(split: str, group: str, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    if not n:
        return {"split": split, "group": group, "n": 0, "accuracy": None, "compensated_accuracy": None,
                "invalid_rate": None}
    invalid = [is_invalid(r) for r in rows]
    scores = [_score(r) for r in rows]
    compensated = [GUESS_SCORE if bad else s for s, bad in zip(scores, invalid, strict=True)]
    return {
        "split": split,
        "group": group,
        "n": n,
        "accuracy": round(100.0 * sum(scores) / n, 2),
        "compensated_accuracy": round(100.0 * sum(compensated) / n, 2),
        "invalid_rate": round(100.0 * sum(invalid) / n, 2),
    }


def breakdown(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table 2's columns (with Table 5's compensation) over one model's score rows, in percent, 2 decimals.

    Rows are score dicts with `score` and `error_type` and the item's `difficulty`, `length` and `domain`
    (top level, or in a `meta` dict/JSON). The result lists overall, easy, hard, short, medium, long (always,
    with n=0 and None when empty) and then each domain present, in the paper's order. Each entry has `split`
    (overall|difficulty|length|domain), `group`, `n`, `accuracy`, `compensated_accuracy` and `invalid_rate`.
    Group one model and one setting (zero-shot or CoT) per call.
    """
    rows = list(rows)
    out = [_summary("overall", "overall", rows)]
    for split, field, groups in (("difficulty", "difficulty", DIFFICULTIES), ("length", "length", LENGTHS)):
        out += [_summary(split, g, [r for r in rows if _field(r, field) == g]) for g in groups]
    present = {_field(r, "domain") for r in rows} - {""}
    ordered = [d for d in DOMAINS if d in present] + sorted(present - set(DOMAINS))
    out += [_summary("domain", d, [r for r in rows if _field(r, "domain") == d]) for d in ordered]
    return out
