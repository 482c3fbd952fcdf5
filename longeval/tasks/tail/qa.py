"""Question generation and its two checks (TAIL §3.2, §3.4, Algorithm 1), as pure functions and a state machine.

Per gold paragraph, one attempt is three LLM calls: generate a six-option question as JSON, answer it from the
gold paragraph alone (it must be right: the quality check), answer it from the five most similar *other*
segments (it must not be right: the RAG filter). A failed attempt is retried on the same paragraph up to five
times; then Algorithm 1 moves to the preceding segment. Every attempt is kept, with the stage it reached and why
it was rejected, so a built benchmark can say how each question came to be.

The builder owns the LLM and the embeddings. It drives each gold paragraph's `Slot` round by round:

    slots = [start(domain.name, d, s) for d, s in zip(depths, initial_segments(domain.word_counts, depths))]
    while unfinished := [s for s in slots if not s.done]:
        # RAG stage only: retrieved = retrieve(embed(retrieval_query(s.candidate)), segment_vecs, exclude={s.segment})
        batch = [prompt_for(s, domain.segments, retrieved=...) for s in unfinished]   # one batch of calls
        outputs = llm(batch)
        slots = [next_step(s, out, retrieved=..., taken=others(s)) ...]

Nothing here raises on model output: a bad output is a rejected attempt with its reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np

from longeval.tasks.tail import prompts
from longeval.tasks.tail.choice import parse_choice
from longeval.tasks.tail.depths import previous_segment
from longeval.tasks.tail.prompts import LETTERS

MAX_ATTEMPTS = 5
"""§3.2: a gold paragraph gets five attempts before the preceding segment replaces it."""
TOP_K = 5
"""§3.4: the RAG filter answers from the top five other segments."""

# Why an attempt was rejected (the `reason` of an Attempt).
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
NO_QUESTION = "no_question"
REFERS_TO_CONTEXT = "refers_to_context"
NO_OPTIONS = "no_options"
WRONG_OPTION_COUNT = "wrong_option_count"
BAD_OPTION_LABELS = "bad_option_labels"
EMPTY_OPTION = "empty_option"
DUPLICATE_OPTIONS = "duplicate_options"
BAD_ANSWER = "bad_answer"
NO_OUTPUT = "no_output"
QUALITY_WRONG = "quality_wrong"
QUALITY_UNMAPPED = "quality_unmapped"
RAG_ANSWERABLE = "rag_answerable"
REASONS = (NOT_JSON, NOT_OBJECT, NO_QUESTION, REFERS_TO_CONTEXT, NO_OPTIONS, WRONG_OPTION_COUNT, BAD_OPTION_LABELS,
           EMPTY_OPTION, DUPLICATE_OPTIONS, BAD_ANSWER, NO_OUTPUT, QUALITY_WRONG, QUALITY_UNMAPPED, RAG_ANSWERABLE)

_CONTEXT_REF = re.compile(
    r"\b(?:the|this|that|given|above|provided|following|aforementioned)\s+(?:context|passage|excerpt|paragraph|text)"
    r"\b(?!\s+(?:of\b|\d))",
    re.IGNORECASE,
)
"""A question that points at "the passage" or "this context" is unclear once the paragraph sits in a long
document (the paper's human check, A.2; the reference rejects questions mentioning "context")."""
_FENCE = re.compile(r"```(?:json)?", re.IGNORECASE)
_OPTION_KEY = re.compile(r"(?:option\s*)?[(\[]?([A-Fa-f])[)\]]?[.:)]?", re.IGNORECASE)
_OPTION_LABEL = re.compile(r"[(\[]?([A-F])[)\].:]\s+")
_ANSWER = re.compile(r"(?:option\s*)?[(\[]?([A-Fa-f])[)\]]?(?:\s*[.:)\-]\s*.*)?", re.IGNORECASE | re.DOTALL)
_SCAN_LIMIT = 64


@dataclass(frozen=True)
class Question:
    """A multiple-choice question with six options and the letter of the right one."""

    question: str
    options: tuple[str, ...]
    answer: str

    @property
    def answer_text(self) -> str:
        return self.options[LETTERS.index(self.answer)]


# ---------------------------------------------------------------------------------------------------- parsing


def parse_question(output: Any) -> Question | str:
    """The generator's JSON as a Question, or the reason it is not one (one of `REASONS`); never raises.

    Accepts the object alone, in a code fence or after other text; options as an object keyed A–F or a list of
    six strings; the answer as a letter ("C", "(C)", "C. ...") or as the exact text of an option.
    """
    if not isinstance(output, str) or not output.strip():
        return NOT_JSON
    obj = _json_object(output)
    if obj is None:
        return NOT_JSON
    if not isinstance(obj, dict):
        return NOT_OBJECT
    fields = {str(k).strip().lower(): v for k, v in obj.items()}
    question = fields.get("question")
    if not isinstance(question, str) or not question.strip():
        return NO_QUESTION
    question = " ".join(question.split())
    if _CONTEXT_REF.search(question):
        return REFERS_TO_CONTEXT
    options = _options(fields.get("options", fields.get("choices")))
    if isinstance(options, str):
        return options
    answer = _answer(fields.get("answer", fields.get("correct_answer")), options)
    if not answer:
        return BAD_ANSWER
    return Question(question=question, options=options, answer=answer)


def _json_object(text: str) -> Any:
    """The JSON value of the whole text, else the first object in it with a "question" key, else the first
    object, else None."""
    cleaned = _FENCE.sub("", text).strip()
    try:
        value = json.loads(cleaned)
    except (ValueError, RecursionError):
        value = None
    else:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
            return value[0]
        return value
    decoder = json.JSONDecoder()
    first = None
    start = cleaned.find("{")
    for _ in range(_SCAN_LIMIT):
        if start < 0:
            break
        try:
            value, end = decoder.raw_decode(cleaned, start)
        except (ValueError, RecursionError):
            value, end = None, start + 1
        if isinstance(value, dict):
            if any(str(k).strip().lower() == "question" for k in value):
                return value
            first = value if first is None else first
        start = cleaned.find("{", max(end, start + 1))
    return first


def _option_text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = " ".join(str(value).split())
    return text or None


def _options(value: Any) -> tuple[str, ...] | str:
    if isinstance(value, dict):
        if len(value) != len(LETTERS):
            return WRONG_OPTION_COUNT
        keyed: dict[str, Any] = {}
        for key, text in value.items():
            match = _OPTION_KEY.fullmatch(str(key).strip())
            if not match:
                return BAD_OPTION_LABELS
            keyed[match.group(1).upper()] = text
        if set(keyed) != set(LETTERS):
            return BAD_OPTION_LABELS
        raw = [keyed[letter] for letter in LETTERS]
    elif isinstance(value, list):
        if len(value) != len(LETTERS):
            return WRONG_OPTION_COUNT
        raw = list(value)
        texts = [t for t in (_option_text(v) for v in raw) if t]
        labels = [_OPTION_LABEL.match(t) for t in texts]
        if len(texts) == len(LETTERS) and all(m and m.group(1) == x for m, x in zip(labels, LETTERS, strict=True)):
            raw = [t[m.end() :] for t, m in zip(texts, labels, strict=True) if m]  # "A. text" -> "text"
    else:
        return NO_OPTIONS
    options = tuple(_option_text(v) for v in raw)
    if any(o is None for o in options):
        return EMPTY_OPTION
    if len({o.casefold() for o in options if o}) != len(options):
        return DUPLICATE_OPTIONS
    return tuple(o for o in options if o)


def _answer(value: Any, options: tuple[str, ...]) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        return ""
    match = _ANSWER.fullmatch(value.strip())
    if match:
        return match.group(1).upper()
    wanted = " ".join(value.split()).casefold()
    hits = [i for i, option in enumerate(options) if option.casefold() == wanted]
    return LETTERS[hits[0]] if len(hits) == 1 else ""


def shuffle_options(question: Question, rng: np.random.Generator) -> Question:
    """The same question with its options in a random order: generators favour some answer letters, and a
    benchmark whose answers are spread evenly over A–F cannot reward a model's own letter bias."""
    order = [int(i) for i in rng.permutation(len(LETTERS))]
    right = LETTERS.index(question.answer)
    return Question(question.question, tuple(question.options[i] for i in order), LETTERS[order.index(right)])


# ---------------------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check: passed or not, why not, and the letters the answers were mapped to ("" unmapped)."""

    passed: bool
    reason: str
    answers: tuple[str, ...]


def _outputs(outputs: str | Sequence[str] | None) -> tuple[str, ...]:
    if outputs is None:
        return ()
    if isinstance(outputs, str):
        return (outputs,)
    return tuple(o if isinstance(o, str) else "" for o in outputs)


def check_quality(outputs: str | Sequence[str], question: Question) -> Verdict:
    """Algorithm 1 line 4: every answer given from the gold paragraph alone must be the right letter.

    Pass one output (greedy decoding) or several samples: the reference asks five and wants all five right.
    """
    outs = _outputs(outputs)
    if not outs:
        return Verdict(False, NO_OUTPUT, ())
    answers = tuple(parse_choice(o, question.options) for o in outs)
    if all(a == question.answer for a in answers):
        return Verdict(True, "", answers)
    wrong = any(a and a != question.answer for a in answers)
    return Verdict(False, QUALITY_WRONG if wrong else QUALITY_UNMAPPED, answers)


def check_rag(outputs: str | Sequence[str], question: Question) -> Verdict:
    """Algorithm 1 line 8: the question is rejected if any answer from the other segments is right.

    "Answer: NONE", a wrong letter or an unmapped answer all pass; no outputs (no other segments) pass.
    """
    answers = tuple(parse_choice(o, question.options) for o in _outputs(outputs))
    if question.answer in answers:
        return Verdict(False, RAG_ANSWERABLE, answers)
    return Verdict(True, "", answers)


def retrieval_query(question: Question) -> str:
    """The text to embed for retrieval: the question and its options (an answer is found by its words too)."""
    return f"{question.question}\n{prompts.format_options(question.options)}"


def retrieve(
    question_vec: Sequence[float] | np.ndarray, segment_vecs: Sequence[Sequence[float]] | np.ndarray,
    exclude: Collection[int] = (), k: int = TOP_K,
) -> tuple[int, ...]:
    """Indices of the `k` segments most cosine-similar to the question, best first, skipping `exclude`.

    Ties go to the earlier segment; a zero or non-finite vector counts as similarity 0. Raises ValueError only
    for mismatched shapes (a caller's bug, not a model output).
    """
    query = np.nan_to_num(np.asarray(question_vec, dtype=np.float64).reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    matrix = np.nan_to_num(np.asarray(segment_vecs, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if matrix.size == 0 or k <= 0:
        return ()
    if matrix.ndim != 2 or matrix.shape[1] != query.shape[0]:
        raise ValueError(f"segment vectors of shape {matrix.shape} do not match a question vector of {query.shape[0]}")
    norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(query)
    sims = np.divide(matrix @ query, norms, out=np.zeros(len(matrix)), where=norms > 0)
    skip = {int(i) for i in exclude}
    order = np.argsort(-sims, kind="stable")
    return tuple(int(i) for i in order if int(i) not in skip)[:k]


# ---------------------------------------------------------------------------------------------------- Algorithm 1


class Stage(StrEnum):
    """Which call a slot needs next, or how it ended."""

    GENERATE = "generate"
    QUALITY = "quality"
    RAG = "rag"
    ACCEPTED = "accepted"
    EXHAUSTED = "exhausted"


@dataclass(frozen=True)
class Attempt:
    """One finished attempt at a gold paragraph: where it ended and why, with every raw output."""

    segment: int
    number: int
    """1 … MAX_ATTEMPTS, counted per segment."""
    stage: str
    """The stage it ended at: generate | quality | rag (rejected there), or accepted."""
    reason: str
    """"" when accepted, else one of `REASONS`."""
    generation: str
    """The generator's raw output."""
    quality: tuple[str, ...] = ()
    rag: tuple[str, ...] = ()
    retrieved: tuple[int, ...] = ()
    """The segments shown to the RAG filter."""
    question: Question | None = None
    """The parsed question, when the output parsed."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["question"] = asdict(self.question) if self.question else None
        return out


@dataclass(frozen=True)
class Slot:
    """One depth's search for a question (Algorithm 1's loop body), frozen: `next_step` returns the next state."""

    domain: str
    depth: float
    segment: int
    """The current gold segment."""
    stage: Stage = Stage.GENERATE
    attempt: int = 1
    candidate: Question | None = None
    """The question under check (QUALITY, RAG) or accepted (ACCEPTED)."""
    generation: str = ""
    quality: tuple[str, ...] = ()
    history: tuple[Attempt, ...] = ()
    tried: tuple[int, ...] = ()
    """Segments given up on, in order."""

    @property
    def done(self) -> bool:
        return self.stage in (Stage.ACCEPTED, Stage.EXHAUSTED)

    @property
    def question(self) -> Question | None:
        """The accepted question, or None."""
        return self.candidate if self.stage is Stage.ACCEPTED else None


def start(domain: str, depth: float, segment: int) -> Slot:
    """A slot about to ask for its first question on `segment`."""
    return Slot(domain=domain, depth=float(depth), segment=int(segment))


def prompt_for(slot: Slot, segments: Sequence[str], *, retrieved: Sequence[int] = ()) -> str:
    """The user message of the slot's next call; at the RAG stage, `retrieved` are the segments to show."""
    if slot.stage is Stage.GENERATE:
        return prompts.generation_prompt(segments[slot.segment])
    if slot.candidate is None or slot.done:
        raise ValueError(f"slot at depth {slot.depth} ({slot.stage}) needs no call")
    if slot.stage is Stage.QUALITY:
        return prompts.quality_prompt(segments[slot.segment], slot.candidate.question, slot.candidate.options)
    return prompts.rag_prompt(slot.candidate.question, slot.candidate.options, [segments[i] for i in retrieved])


def next_step(
    slot: Slot, outputs: str | Sequence[str], *, retrieved: Sequence[int] = (), taken: Collection[int] = (),
    max_attempts: int = MAX_ATTEMPTS, max_segments: int | None = None,
) -> Slot:
    """The slot after its call came back with `outputs` (one string, or samples at the check stages).

    `retrieved` records what the RAG filter was shown; `taken` are segments the fall-back must avoid (the other
    slots' gold segments). After `max_attempts` failures the slot moves to the preceding free segment, and ends
    EXHAUSTED when there is none or `max_segments` segments were tried. Raises ValueError only on a finished slot.
    """
    if slot.done:
        raise ValueError(f"slot at depth {slot.depth} has finished ({slot.stage}); drive only unfinished slots")
    outs = _outputs(outputs)
    if slot.stage is Stage.GENERATE:
        raw = outs[0] if outs else ""
        parsed = parse_question(raw)
        if isinstance(parsed, str):
            attempt = Attempt(slot.segment, slot.attempt, Stage.GENERATE.value, parsed, raw)
            return _after_failure(slot, attempt, taken, max_attempts, max_segments)
        return replace(slot, stage=Stage.QUALITY, candidate=parsed, generation=raw)
    assert slot.candidate is not None  # QUALITY and RAG always carry their candidate
    if slot.stage is Stage.QUALITY:
        verdict = check_quality(outs, slot.candidate)
        if not verdict.passed:
            attempt = Attempt(slot.segment, slot.attempt, Stage.QUALITY.value, verdict.reason, slot.generation,
                              quality=outs, question=slot.candidate)
            return _after_failure(slot, attempt, taken, max_attempts, max_segments)
        return replace(slot, stage=Stage.RAG, quality=outs)
    verdict = check_rag(outs, slot.candidate)
    attempt = Attempt(slot.segment, slot.attempt, Stage.RAG.value if not verdict.passed else Stage.ACCEPTED.value,
                      verdict.reason, slot.generation, quality=slot.quality, rag=outs,
                      retrieved=tuple(int(i) for i in retrieved), question=slot.candidate)
    if not verdict.passed:
        return _after_failure(slot, attempt, taken, max_attempts, max_segments)
    return replace(slot, stage=Stage.ACCEPTED, history=(*slot.history, attempt))


def _after_failure(slot: Slot, attempt: Attempt, taken: Collection[int], max_attempts: int,
                   max_segments: int | None) -> Slot:
    """Retry the same segment, or move to the preceding free one, or give up."""
    history = (*slot.history, attempt)
    fresh = Slot(domain=slot.domain, depth=slot.depth, segment=slot.segment, attempt=slot.attempt + 1,
                 history=history, tried=slot.tried)
    if slot.attempt < max_attempts:
        return fresh
    tried = (*slot.tried, slot.segment)
    before = previous_segment(slot.segment, taken={*taken, *tried})
    if before is None or (max_segments is not None and len(tried) >= max_segments):
        return replace(fresh, stage=Stage.EXHAUSTED, attempt=slot.attempt, tried=tried)
    return replace(fresh, segment=before, attempt=1, tried=tried)


def provenance(slot: Slot) -> str:
    """How a slot's question came to be, as JSON: every attempt with its stage, reason and raw outputs."""
    return json.dumps({
        "domain": slot.domain,
        "depth": slot.depth,
        "segment": slot.segment,
        "stage": slot.stage.value,
        "tried_segments": list(slot.tried),
        "attempts": [a.to_dict() for a in slot.history],
        "prompts_version": prompts.PROMPTS_VERSION,
        "prompt_fingerprint": prompts.fingerprint(),
    }, ensure_ascii=False, sort_keys=True)
