"""IDK (§2.3): exactly 7 in 10 questions are unanswerable; an unknown attribute is truly absent from the
context, a known one stated once; the filler is random capitals; the paper's scoring rule."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext
from longeval.tasks.michelangelo import idk, prompts
from tests.tasks.michelangelo.mich_helpers import SPECS, make, rng

N = 20


@pytest.fixture(scope="module")
def instances(drafts: Callable[[str, int, int], list[Draft]]) -> list[Draft]:
    return drafts("idk", 4096, N)


def _context(d: Draft) -> str:
    return d.prompt[d.prompt.index(d.meta["story"]) : d.prompt.rindex(".\nQuestion: ")]


def test_seven_in_every_ten_are_unknown() -> None:
    for start in (0, 10, 37, 1000):
        assert sum(idk.is_unknown(i) for i in range(start, start + 10)) == 7
    assert not idk.is_unknown(0)
    assert [sum(idk.is_unknown(i, u) for i in range(10)) for u in range(11)] == list(range(11))


def test_unknown_attributes_are_absent_and_known_ones_stated_once(instances: list[Draft]) -> None:
    assert [d.meta["unknown"] for d in instances] == [idk.is_unknown(i) for i in range(N)]
    for d in instances:
        meta, context = d.meta, _context(d)
        attribute = next(a for s in idk.SCENARIOS if s.name == meta["scenario"] for a in s.attributes
                         if a.name == meta["attribute"])
        stem = attribute.statement.split("{v}")[0].split("}")[-1]  # the words that would state it
        offered = [c for c in meta["choices"][:3]]
        if meta["unknown"]:
            assert d.complexity == "unknown" and meta["answer"] == "D" and meta["value"] is None
            assert all(idk.mentions(context, c) == 0 for c in offered)
            assert not any(idk.mentions(context, v) for v in attribute.values)  # no value of that kind at all
            assert stem.strip() == "" or stem not in meta["story"]
        else:
            assert d.complexity == "known"
            right = meta["choices"]["ABC".index(meta["answer"])]
            assert idk.mentions(context, right) == 1
            assert all(idk.mentions(context, c) == 0 for c in offered if c != right)
        assert meta["choices"][3] == prompts.IDK_UNKNOWN
        assert len(set(meta["choices"])) == 4
        assert d.references == [meta["answer"], meta["choices"]["ABCD".index(meta["answer"])]]


def test_filler_is_random_capitals_after_the_story(instances: list[Draft]) -> None:
    for d in instances:
        assert d.depth == 0.0
        filler = _context(d)[len(d.meta["story"]) :]
        assert re.fullmatch(r"( [A-Z])+", filler), filler[:80]
        assert len(set(filler.split())) > 20


def test_prompt_is_the_appendix_layout(instances: list[Draft]) -> None:
    d = instances[0]
    lines = d.prompt[d.prompt.rindex("Question: ") :].splitlines()
    assert lines[0] == f"Question: {d.meta['question']}"
    assert lines[1] == "Choices:"
    assert lines[2:6] == [f"({x}) {c}" for x, c in zip("ABCD", d.meta["choices"], strict=True)]
    assert d.prompt.rstrip().endswith(prompts.IDK_CUE)


def test_story_at_a_random_depth(ctx: GenContext) -> None:
    params = idk.IdkParams(story_at_start=False)
    depths = [make(ctx, SPECS["idk"], 4096, i, params=params).depth for i in range(8)]
    assert len(set(depths)) == 8 and max(depths) > 30


def test_params_are_checked() -> None:
    with pytest.raises(ConfigError):
        idk.IdkParams(unknown_per_10=11)


def test_choices_never_appear_by_chance_in_many_stories() -> None:
    r = rng(11)
    for i in range(300):
        story = idk.make_story(r, unknown=i % 2 == 0)
        offered = story.choices[:3]
        found = [idk.mentions(story.text, c) for c in offered]
        assert found == ([0, 0, 0] if story.unknown else [int(c.lower() == story.value.lower()) for c in offered])


# -- scoring -----------------------------------------------------------------------------------------

CHOICES = ["Fresno", "Berkeley", "Sacramento", "I don't know"]
UNKNOWN = {"answer": "D", "choices": CHOICES, "unknown": True}
KNOWN = {"answer": "B", "choices": CHOICES, "unknown": False}


@pytest.mark.parametrize(("output", "meta", "score", "error"), [
    (" (D) I don't know", UNKNOWN, 1.0, ""),
    ("D", UNKNOWN, 1.0, ""),
    ("I don\u2019t know.", UNKNOWN, 1.0, ""),
    ("The story does not mention the city.", UNKNOWN, 1.0, ""),  # the paper's extra rule
    ("The city is not specified in the text.", UNKNOWN, 1.0, ""),
    ("The story does not mention the city.", KNOWN, 0.0, "false_idk"),
    ("(A) Fresno", UNKNOWN, 0.0, "hallucinated"),
    ("Berkeley", KNOWN, 1.0, ""),
    ("Answer: (B)", KNOWN, 1.0, ""),
    ("The correct answer is B.", KNOWN, 1.0, ""),
    ("B) Berkeley", KNOWN, 1.0, ""),
    ("(C) Sacramento", KNOWN, 0.0, "wrong_choice"),
    ("(D) I don't know", KNOWN, 0.0, "false_idk"),
    ("The choices are (A) Fresno (B) Berkeley (C) Sacramento (D) I don't know. Therefore: (B) Berkeley", KNOWN,
     1.0, ""),
    ("The answer is (D). (A), (B) and (C) are not mentioned.", UNKNOWN, 1.0, ""),
    ("The answer is a combination of clues.", KNOWN, 0.0, "no_choice"),
    ("A park is a nice place.", KNOWN, 0.0, "no_choice"),
    ("", UNKNOWN, 0.0, "no_choice"),
])
def test_scorer_rules(output: str, meta: dict, score: float, error: str) -> None:
    judged = idk.score_idk(output, [meta["answer"]], meta)
    assert (judged.score, judged.error_type) == (score, error)


def test_scorer_gives_full_marks_to_every_reference(instances: list[Draft]) -> None:
    for d in instances:
        letter, text = d.references
        for output in (letter, f"({letter}) {text}", text):
            assert idk.score_idk(output, d.references, d.meta).score == 1.0, output


# The patterns before they were made possessive (they backtrack polynomially on runs of spaces); the new ones
# must find exactly the same matches on outputs short enough for the old ones to be fast.
_OLD_CUE = re.compile(
    r"(?i:answer|choice|option)\s*(?i:is|would be)?\s*:?\s*\**\s*(?:\(([A-Da-d])\)|([A-D])(?![\w']))"
)
_OLD_START = re.compile(r"\s*\**\s*(?:\(([A-Da-d])\)|([A-D])[).:](?:\s|$)|([A-D])\s*$)")
_PIECES = ("Answer", "answer", "CHOICE", "option", "is", "IS", "would be", ":", "*", "**", " ", "  ", "\n", "\t",
           "(", ")", "A", "B", "D", "a", "c", "E", "'", "s", ".", "x", "I don't know")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join))
def test_cue_patterns_match_as_before(text: str) -> None:
    assert [m.span() + m.groups() for m in idk.ANSWER_CUE.finditer(text)] == \
        [m.span() + m.groups() for m in _OLD_CUE.finditer(text)]
    new, old = idk.ANSWER_AT_START.match(text), _OLD_START.match(text)
    assert (new and new.span() + new.groups()) == (old and old.span() + old.groups())


@pytest.mark.parametrize("output, letter", [
    ("The answer is (B).", "B"), ("Answer:  **C**", "C"), ("  ** (d) because", "D"), ("A", "A"),
    ("B. Denver", "B"), ("I think the option would be: A", "A"), ("Answer" + " " * 5000 + "?", None),
])
def test_parse_choice_on_realistic_and_adversarial_outputs(output: str, letter: str | None) -> None:
    assert idk.parse_choice(output, ["Fresno", "Denver", "Boston", "I don't know"]) == letter
