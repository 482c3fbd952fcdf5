"""The Appendix D.3 templates, byte for byte, and how they are filled."""

from __future__ import annotations

import hashlib

import pytest

from longeval.tasks.longbench_v2 import prompts
from tests.tasks.longbench_v2.lb2_helpers import reference_fill

# sha256 of the released files prompts/0shot.txt, 0shot_cot.txt and 0shot_cot_ans.txt (THUDM/LongBench), which
# have no trailing newline: 262, 210 and 381 characters.
RELEASED = {
    "zero_shot": (262, "68a162252bc9ff71d5d7abca3d69bb31aac3c35f832d657a2866f2018b8a6950"),
    "cot": (210, "6cc33d92fd8f611662b756c1f10f302c541ca005b58c46d5f3188ac3a939bfe8"),
    "cot_answer": (381, "85ec59df4ac0e27aabbc619a7ca5cf3ae1787dd5a76cf51a18944eb52c91955f"),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_templates_are_the_released_bytes(name: str) -> None:
    text = prompts.TEMPLATES[name]
    length, digest = RELEASED[name]
    assert len(text) == length
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == digest


def test_templates_read_as_appendix_d3() -> None:
    choices = "Choices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    fmt = 'Format your response as follows: "The correct answer is (insert answer here)".'
    assert (
        "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
        "What is the correct answer to this question: $Q$\n" + choices + fmt
    ) == prompts.ZERO_SHOT
    assert (
        "Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n"
        "What is the correct answer to this question: $Q$\n" + choices + "Let\u2019s think step by step:"
    ) == prompts.COT
    assert (
        "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here."
        "\n\nWhat is the correct answer to this question: $Q$\n" + choices + "Let\u2019s think step by step: $COT$"
        "\n\nBased on the above, what is the single, most likely answer choice? " + fmt
    ) == prompts.COT_ANSWER
    assert "'" not in prompts.COT  # the released files write Let’s with U+2019, not an ASCII apostrophe


def test_fill_matches_the_reference_on_plain_values() -> None:
    values = {"$DOC$": "The document.", "$Q$": "Why?", "$C_A$": "a", "$C_B$": "b", "$C_C$": "c", "$C_D$": "d"}
    for template in (prompts.ZERO_SHOT, prompts.COT):
        assert prompts.fill(template, values) == reference_fill(template, "The document.", " Why? ", list("abcd"))
    values["$COT$"] = "Because."
    assert prompts.fill(prompts.COT_ANSWER, values) == reference_fill(
        prompts.COT_ANSWER, "", "Why?", list("abcd"), "Because.")


def test_fill_is_one_pass() -> None:
    values = {"$Q$": "What does $C_A$ mean?", "$C_A$": "$Q$", "$C_B$": "b", "$C_C$": "c", "$C_D$": "d"}
    filled = prompts.fill(prompts.ZERO_SHOT, values)
    assert "question: What does $C_A$ mean?\n" in filled and "(A) $Q$\n" in filled
    assert "$DOC$" in filled  # no value: the marker stays, so the document slot can be left open


def test_split_at_the_document_slot() -> None:
    values = {"$Q$": "Q", "$C_A$": "a", "$C_B$": "b", "$C_C$": "c", "$C_D$": "d"}
    before, after = prompts.split_at(prompts.ZERO_SHOT, prompts.DOC, values)
    assert before.endswith("<text>\n") and after.startswith("\n</text>\n\nWhat is the correct answer")
    assert before + "X" + after == prompts.fill(prompts.ZERO_SHOT, {**values, "$DOC$": "X"})
    with pytest.raises(ValueError):
        prompts.split_at(prompts.ZERO_SHOT, prompts.COT_SLOT, values)


def test_fingerprint_is_stable_and_covers_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    first = prompts.fingerprint()
    assert first == prompts.fingerprint() and len(first) == 16
    monkeypatch.setitem(prompts.TEMPLATES, "zero_shot", prompts.ZERO_SHOT + " ")
    assert prompts.fingerprint() != first
