"""QA generation: JSON validation (never raising), the quality check, the RAG filter, retrieval, Algorithm 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.tasks.tail import (
    LETTERS,
    MAX_ATTEMPTS,
    REASONS,
    Question,
    Stage,
    check_quality,
    check_rag,
    next_step,
    parse_question,
    prompt_for,
    provenance,
    qa,
    retrieval_query,
    retrieve,
    shuffle_options,
    start,
)

OPTIONS = {"A": "12 days", "B": "30 days", "C": "45 days", "D": "60 days", "E": "90 days", "F": "120 days"}
GOOD = {"question": "How long does the Leeds office have to file the appeal?", "options": OPTIONS, "answer": "C"}
SEGMENTS = [f"Segment {i} text about the Leeds office and its appeal deadlines." for i in range(10)]


def dumps(obj: object) -> str:
    return json.dumps(obj)


# ---------------------------------------------------------------------------------------------------- parsing


def test_a_good_question_parses() -> None:
    q = parse_question(dumps(GOOD))
    assert isinstance(q, Question)
    assert q.question == GOOD["question"] and q.options == tuple(OPTIONS.values()) and q.answer == "C"
    assert q.answer_text == "45 days"


@pytest.mark.parametrize("wrap", [
    lambda s: f"```json\n{s}\n```",
    lambda s: f"Here is the question:\n{s}\nHope this helps.",
    lambda s: f"[{s}]",
    lambda s: "{draft} " + s,  # a brace that is not JSON before the object
    lambda s: '{"thought": "first I read it"}\n' + s,  # another object first
])
def test_json_is_found_around_other_text(wrap) -> None:
    q = parse_question(wrap(dumps(GOOD)))
    assert isinstance(q, Question) and q.answer == "C"


@pytest.mark.parametrize("answer, letter", [("C", "C"), ("c", "C"), ("(C)", "C"), ("C. 45 days", "C"),
                                            ("Option C", "C"), ("45 days", "C"), (["C"], "C"), (" F ", "F")])
def test_answer_forms(answer, letter: str) -> None:
    q = parse_question(dumps({**GOOD, "answer": answer}))
    assert isinstance(q, Question) and q.answer == letter


def test_options_as_a_labelled_list_and_keys_in_other_forms() -> None:
    listed = [f"{x}. {t}" for x, t in OPTIONS.items()]
    q = parse_question(dumps({**GOOD, "options": listed}))
    assert isinstance(q, Question) and q.options == tuple(OPTIONS.values())
    keyed = {f"({x.lower()})": t for x, t in OPTIONS.items()}
    assert isinstance(parse_question(dumps({**GOOD, "options": keyed})), Question)
    numbers = {x: 1990 + i for i, x in enumerate(LETTERS)}
    assert parse_question(dumps({**GOOD, "options": numbers, "answer": "A"})).options[0] == "1990"
    upper = {"Question": GOOD["question"], "Options": OPTIONS, "Answer": "B"}
    assert parse_question(dumps(upper)).answer == "B"


@pytest.mark.parametrize("output, reason", [
    ("", qa.NOT_JSON),
    ("The question is about deadlines.", qa.NOT_JSON),
    ('{"question": "unterminated', qa.NOT_JSON),
    ("[1, 2, 3]", qa.NOT_OBJECT),
    ('"just a string"', qa.NOT_OBJECT),
    (dumps({**GOOD, "question": ""}), qa.NO_QUESTION),
    (dumps({"options": OPTIONS, "answer": "A"}), qa.NO_QUESTION),
    (dumps({**GOOD, "question": 7}), qa.NO_QUESTION),
    (dumps({**GOOD, "question": "According to the passage, how long is the deadline?"}), qa.REFERS_TO_CONTEXT),
    (dumps({**GOOD, "question": "In this context, what is the deadline?"}), qa.REFERS_TO_CONTEXT),
    (dumps({k: v for k, v in GOOD.items() if k != "options"}), qa.NO_OPTIONS),
    (dumps({**GOOD, "options": "A, B, C"}), qa.NO_OPTIONS),
    (dumps({**GOOD, "options": {k: OPTIONS[k] for k in "ABCDE"}}), qa.WRONG_OPTION_COUNT),
    (dumps({**GOOD, "options": [*OPTIONS.values(), "150 days"]}), qa.WRONG_OPTION_COUNT),
    (dumps({**GOOD, "options": {**{k: OPTIONS[k] for k in "ABCDE"}, "G": "x"}}), qa.BAD_OPTION_LABELS),
    (dumps({**GOOD, "options": {**OPTIONS, "D": "  "}}), qa.EMPTY_OPTION),
    (dumps({**GOOD, "options": {**OPTIONS, "D": None}}), qa.EMPTY_OPTION),
    (dumps({**GOOD, "options": {**OPTIONS, "D": "12 DAYS"}}), qa.DUPLICATE_OPTIONS),
    (dumps({**GOOD, "answer": "G"}), qa.BAD_ANSWER),
    (dumps({**GOOD, "answer": "B or C"}), qa.BAD_ANSWER),
    (dumps({**GOOD, "answer": 3}), qa.BAD_ANSWER),
    (dumps({k: v for k, v in GOOD.items() if k != "answer"}), qa.BAD_ANSWER),
])
def test_bad_outputs_give_a_reason(output: str, reason: str) -> None:
    assert parse_question(output) == reason


def test_the_text_of_a_statute_is_not_a_reference_to_the_context() -> None:
    for question in ("What does the text of the 2024 Act require?", "What does the paragraph 3 exemption cover?"):
        assert isinstance(parse_question(dumps({**GOOD, "question": question})), Question)


def test_non_text_output_is_a_reason() -> None:
    assert parse_question(None) == qa.NOT_JSON
    assert parse_question(b"{}") == qa.NOT_JSON


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=10), inner, max_size=7),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_any_text_parses_or_gives_a_reason(text: str) -> None:
    result = parse_question(text)
    assert isinstance(result, Question) or result in REASONS


@settings(max_examples=300, deadline=None)
@given(question=json_values, options=json_values, answer=json_values, junk=st.text(max_size=30))
def test_fuzz_json_shaped_outputs(question, options, answer, junk: str) -> None:
    obj = {"question": question, "options": options, "answer": answer}
    for text in (json.dumps(obj), junk + json.dumps(obj) + junk, json.dumps(obj)[:-1], "[" * 5000):
        result = parse_question(text)
        assert isinstance(result, Question) or result in REASONS
        if isinstance(result, Question):
            assert len(result.options) == 6 and result.answer in LETTERS and result.question


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["question", "options", "answer"]), value=json_values)
def test_fuzz_one_field_of_a_good_question(key: str, value) -> None:
    result = parse_question(json.dumps({**GOOD, key: value}))
    assert isinstance(result, Question) or result in REASONS


def test_shuffle_keeps_the_right_answer() -> None:
    q = parse_question(dumps(GOOD))
    letters = set()
    for seed in range(30):
        shuffled = shuffle_options(q, np.random.default_rng(seed))
        assert shuffled.answer_text == "45 days" and sorted(shuffled.options) == sorted(q.options)
        letters.add(shuffled.answer)
    assert letters == set(LETTERS)


# ---------------------------------------------------------------------------------------------------- checks

Q = Question(GOOD["question"], tuple(OPTIONS.values()), "C")


def test_quality_check() -> None:
    assert check_quality("Reasoning.\nAnswer: C", Q) == qa.Verdict(True, "", ("C",))
    assert check_quality(["Answer: C", "The answer is (C)."], Q).passed
    assert check_quality(["Answer: C", "Answer: D"], Q) == qa.Verdict(False, qa.QUALITY_WRONG, ("C", "D"))
    assert check_quality(["Answer: C", "I cannot tell"], Q) == qa.Verdict(False, qa.QUALITY_UNMAPPED, ("C", ""))
    assert check_quality("Answer: 45 days", Q).passed  # the option's text maps too
    assert check_quality([], Q).reason == qa.NO_OUTPUT


def test_rag_filter() -> None:
    assert check_rag("The excerpts say nothing about it.\nAnswer: NONE", Q).passed
    assert check_rag("Answer: B", Q).passed
    assert check_rag("hmm", Q).passed
    assert check_rag([], Q).passed
    assert check_rag(["Answer: NONE", "Answer: C"], Q) == qa.Verdict(False, qa.RAG_ANSWERABLE, ("", "C"))


def test_retrieval_query_has_question_and_options() -> None:
    text = retrieval_query(Q)
    assert text.startswith(Q.question) and "C. 45 days" in text and "F. 120 days" in text


def test_retrieve_by_cosine_excluding_the_gold() -> None:
    segments = np.array([
        [1.0, 0.0, 0.0],  # 0: the gold, most similar, excluded
        [0.9, 0.1, 0.0],  # 1
        [0.0, 1.0, 0.0],  # 2: orthogonal
        [10.0, 5.0, 0.0],  # 3: long vector, cosine only
        [-1.0, 0.0, 0.0],  # 4: opposite
        [0.0, 0.0, 0.0],  # 5: zero vector: similarity 0
        [0.7, 0.7, 0.0],  # 6
    ])
    query = [1.0, 0.0, 0.0]
    assert retrieve(query, segments, exclude={0}) == (1, 3, 6, 2, 5)
    assert retrieve(query, segments, exclude={0}, k=2) == (1, 3)
    assert retrieve(query, segments) == (0, 1, 3, 6, 2)
    assert retrieve(query, segments, exclude=range(7)) == ()
    assert retrieve(query, segments, k=0) == ()
    assert retrieve([0.0, 1.0, 0.0], [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 1.0, 0.0]], k=3) == (1, 2, 0)  # ties
    assert retrieve(query, np.zeros((0, 3))) == ()
    with pytest.raises(ValueError, match="do not match"):
        retrieve([1.0, 0.0], segments)


# ---------------------------------------------------------------------------------------------------- Algorithm 1

GOOD_OUT = dumps(GOOD)


def test_accepted_in_three_rounds() -> None:
    slot = start("law", 0.5, 4)
    assert slot.stage is Stage.GENERATE and not slot.done
    assert "Segment 4 text" in prompt_for(slot, SEGMENTS)
    slot = next_step(slot, GOOD_OUT)
    assert slot.stage is Stage.QUALITY and slot.candidate == Q
    quality = prompt_for(slot, SEGMENTS)
    assert "Segment 4 text" in quality and "C. 45 days" in quality and Q.question in quality
    slot = next_step(slot, "Answer: C")
    assert slot.stage is Stage.RAG
    rag = prompt_for(slot, SEGMENTS, retrieved=[1, 7])
    assert "[1] Segment 1 text" in rag and "[2] Segment 7 text" in rag and "Segment 4" not in rag
    slot = next_step(slot, "Answer: NONE", retrieved=[1, 7])
    assert slot.done and slot.stage is Stage.ACCEPTED and slot.question == Q and slot.segment == 4
    (attempt,) = slot.history
    assert (attempt.segment, attempt.number, attempt.stage, attempt.reason) == (4, 1, "accepted", "")
    assert attempt.generation == GOOD_OUT and attempt.quality == ("Answer: C",) and attempt.retrieved == (1, 7)
    with pytest.raises(ValueError, match="finished"):
        next_step(slot, "anything")
    with pytest.raises(ValueError):
        prompt_for(slot, SEGMENTS)


def test_each_rejection_is_recorded_and_retried_on_the_same_segment() -> None:
    slot = start("law", 0.5, 4)
    slot = next_step(slot, "not json at all")  # attempt 1: generation rejected
    slot = next_step(next_step(slot, GOOD_OUT), "Answer: B")  # attempt 2: wrong in the quality check
    slot = next_step(next_step(next_step(slot, GOOD_OUT), "Answer: C"), "Answer: C")  # attempt 3: RAG answers it
    assert slot.stage is Stage.GENERATE and slot.attempt == 4 and slot.segment == 4
    assert [(a.number, a.stage, a.reason) for a in slot.history] == [
        (1, "generate", qa.NOT_JSON), (2, "quality", qa.QUALITY_WRONG), (3, "rag", qa.RAG_ANSWERABLE)]
    assert slot.history[1].question == Q and slot.history[1].quality == ("Answer: B",)
    assert slot.history[2].rag == ("Answer: C",)
    slot = next_step(next_step(next_step(slot, GOOD_OUT), ["Answer: C", "Answer: C"]), "Answer: A")
    assert slot.question == Q and len(slot.history) == 4


def test_five_failures_move_to_the_preceding_segment() -> None:
    slot = start("law", 0.5, 4)
    for _ in range(MAX_ATTEMPTS):
        assert slot.segment == 4
        slot = next_step(slot, "{}", taken={3})  # segment 3 belongs to another depth
    assert slot.segment == 2 and slot.attempt == 1 and slot.stage is Stage.GENERATE and slot.tried == (4,)
    assert [a.number for a in slot.history] == [1, 2, 3, 4, 5]
    assert {a.reason for a in slot.history} == {qa.NO_QUESTION}
    assert "Segment 2 text" in prompt_for(slot, SEGMENTS)
    slot = next_step(next_step(next_step(slot, GOOD_OUT), "Answer: C"), "Answer: NONE")
    assert slot.question == Q and slot.segment == 2
    record = json.loads(provenance(slot))
    assert record["tried_segments"] == [4] and record["segment"] == 2 and len(record["attempts"]) == 6
    assert record["attempts"][0]["reason"] == qa.NO_QUESTION and record["attempts"][-1]["stage"] == "accepted"
    assert record["attempts"][-1]["question"]["answer"] == "C" and record["prompts_version"]


def test_no_preceding_segment_left_exhausts_the_slot() -> None:
    slot = start("law", 0.05, 1)
    for _ in range(2 * 2):
        slot = next_step(slot, "nope", max_attempts=2)
    assert slot.stage is Stage.EXHAUSTED and slot.done and slot.question is None
    assert slot.tried == (1, 0) and len(slot.history) == 4
    taken = start("law", 0.05, 1)
    for _ in range(2):
        taken = next_step(taken, "nope", max_attempts=2, taken={0})
    assert taken.stage is Stage.EXHAUSTED


def test_max_segments_caps_the_fall_back() -> None:
    slot = start("law", 0.9, 8)
    for _ in range(MAX_ATTEMPTS):
        slot = next_step(slot, "nope", max_segments=1)
    assert slot.stage is Stage.EXHAUSTED and slot.tried == (8,)


def test_a_driver_loop_over_scripted_outcomes() -> None:
    """Drive three slots round by round like the builder: every round is one batch, each slot one call."""
    script = {  # segment -> outputs per call, in order
        2: [GOOD_OUT, "Answer: C", "Answer: NONE"],  # accepted at once
        5: ["bad"] * MAX_ATTEMPTS + [GOOD_OUT, "Answer: C", "Answer: NONE"],  # five failures, then segment 4 works
        8: [GOOD_OUT, "Answer: C", "Answer: C"] * MAX_ATTEMPTS,  # RAG rejects five times, then moves back
    }
    calls = {k: iter(v) for k, v in script.items()}
    slots = [start("law", d, s) for d, s in ((0.25, 2), (0.55, 5), (0.85, 8))]
    rounds = 0
    while unfinished := [i for i, s in enumerate(slots) if not s.done]:
        rounds += 1
        for i in unfinished:
            s = slots[i]
            others = {o.segment for j, o in enumerate(slots) if j != i}
            origin = s.tried[0] if s.tried else s.segment
            out = next(calls[origin], "Answer: NONE" if s.stage is Stage.RAG else GOOD_OUT if s.stage is Stage.GENERATE
                       else "Answer: C")
            slots[i] = next_step(s, out, taken=others, retrieved=[0, 1] if s.stage is Stage.RAG else ())
    assert [s.stage for s in slots] == [Stage.ACCEPTED] * 3
    assert [s.segment for s in slots] == [2, 4, 7]
    assert [len(s.history) for s in slots] == [1, MAX_ATTEMPTS + 1, MAX_ATTEMPTS + 1]
    assert rounds == 3 * MAX_ATTEMPTS + 3
