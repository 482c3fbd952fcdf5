"""RULER's string-match metrics on hand-worked cases, and fuzzed for never raising."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longeval.scoring.string_match import (
    postprocess_prediction,
    string_match_all,
    string_match_part,
    strip_reasoning,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  42  ", "42"),
        ("a\tb", "a\nb"),
        ("a\x00b\x1fc", "a\nb\nc"),
        ("\x00 answer \x01", "answer"),
        ("line1\r\nline2", "line1\n\nline2"),
        ("\x7f stays", "\x7f stays"),  # DEL is outside RULER's [\x00-\x1f]
        ("", ""),
    ],
)
def test_postprocess_prediction(text: str, expected: str) -> None:
    assert postprocess_prediction(text) == expected


def test_partial_match_worked_example() -> None:
    assert string_match_all("123 and 45", ["123", "456"]) == 0.5
    assert string_match_part("123 and 45", ["123", "456"]) == 1.0


def test_all_references_found() -> None:
    assert string_match_all("values: 1111111, 2222222, 3333333", ["2222222", "1111111", "3333333"]) == 1.0


def test_none_found() -> None:
    assert string_match_all("no idea", ["1234567"]) == 0.0
    assert string_match_part("no idea", ["Paris", "paris, france"]) == 0.0


def test_case_insensitive_both_ways() -> None:
    assert string_match_all("The answer is PARIS", ["paris"]) == 1.0
    assert string_match_all("the answer is paris", ["Paris"]) == 1.0
    assert string_match_part("LONG-CONTEXT", ["Long-Context"]) == 1.0


def test_substring_not_word_match() -> None:
    """RULER matches substrings: a 3-digit reference inside a longer number counts."""
    assert string_match_all("12345", ["234"]) == 1.0


def test_control_characters_become_newlines_before_matching() -> None:
    # "a\x00b" becomes "a\nb", so "ab" is no longer present but "a\nb" is.
    assert string_match_all("a\x00b", ["ab"]) == 0.0
    assert string_match_all("a\x00b", ["a\nb"]) == 1.0


def test_empty_references() -> None:
    assert string_match_all("anything", []) == 0.0
    assert string_match_part("anything", []) == 0.0


def test_empty_reference_string_counts_as_found() -> None:
    """RULER's `r.lower() in pred.lower()` is True for r == ""; we keep its arithmetic."""
    assert string_match_all("x", ["", "y"]) == 0.5


def test_part_is_any_alias() -> None:
    assert string_match_part("It was Barack Obama.", ["Obama", "Barack H. Obama"]) == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>hmm</think> 42", " 42"),
        ("<think>a</think>b</think>c", "c"),
        ("<think>still thinking", ""),
        ("</think>answer", "answer"),
        ("plain answer", "plain answer"),
        ("", ""),
    ],
)
def test_strip_reasoning(text: str, expected: str) -> None:
    assert strip_reasoning(text) == expected


@given(st.text(), st.lists(st.text()))
def test_metrics_never_raise_and_stay_in_range(prediction: str, references: list[str]) -> None:
    for metric in (string_match_all, string_match_part):
        assert 0.0 <= metric(prediction, references) <= 1.0
    assert string_match_part(prediction, references) >= (string_match_all(prediction, references) == 1.0)


@given(st.text())
def test_postprocess_is_idempotent(text: str) -> None:
    once = postprocess_prediction(text)
    assert postprocess_prediction(once) == once


@given(st.text())
def test_strip_reasoning_never_raises(text: str) -> None:
    assert isinstance(strip_reasoning(text), str)
