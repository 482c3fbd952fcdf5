"""Scoring: deterministic option mapping on tricky outputs; the grid, heatmap and Table 2's summary columns."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.scoring.judgement import Judgement
from longeval.tasks.tail import (
    accuracy_grid,
    choice,
    heatmap,
    length_accuracy,
    length_summary,
    parse_choice,
    score_tail,
    summarise_lengths,
)

OPTIONS = ["42 days", "10 days", "A total of 12", "Never", "Leeds", "Cardiff"]
META = {"answer": "C", "options": OPTIONS, "answer_prefix": ""}


@pytest.mark.parametrize("output, letter", [
    ("Let me think. The document says twelve in total.\nAnswer: C", "C"),
    ("The answer is (B).", "B"),
    ("**Answer:** D", "D"),
    ("Answer: **E**", "E"),
    ("Option B looks right at first, but the text says otherwise, so the correct answer is C because of line 3.", "C"),
    ("I first thought A.\nAnswer: F", "F"),
    ("The answer is not A. Answer: D", "D"),
    ("Answer: A because it is stated", "A"),
    ("answer: c.", "C"),
    ("The correct option is Option E.", "E"),
    ("The final answer is: [F]", "F"),
    ("So \\boxed{E}", "E"),
    ("C", "C"),
    ("(d)", "D"),
    ("C) A total of 12", "C"),
    ("Answer:\nC", "C"),
    ("<think>the answer is A</think>\nAnswer: B", "B"),
    # the option's own text
    ("Answer: A total of 12", "C"),  # "A" here is an article, the line is option C's text
    ("Answer: 42 days", "A"),
    ("Leeds", "E"),
    # not mapped
    ("Answer: B or C", ""),
    ("Answer: A/B", ""),
    ("The answer is a bit unclear.", ""),
    ("Answer: Cats", ""),
    ("<think>the answer is A", ""),
    ("Answer: NONE", ""),
    ("I answered B earlier.", ""),
    ("", ""),
])
def test_parse_choice(output: str, letter: str) -> None:
    assert parse_choice(output, OPTIONS) == letter


def test_score_right_wrong_unmapped() -> None:
    assert score_tail("Reasoning...\nAnswer: C", ["C"], META) == Judgement(1.0, "C", "")
    assert score_tail("Answer: D", ["C"], META) == Judgement(0.0, "D", "wrong")
    assert score_tail("I do not know.", ["C"], META) == Judgement(0.0, "", "unmapped")
    assert score_tail("Answer: A total of 12", ["C"], META).score == 1.0


def test_score_uses_the_prefilled_prefix_and_meta_as_json() -> None:
    meta = {**META, "answer_prefix": "Answer:"}
    assert score_tail(" C", ["C"], meta).score == 1.0
    assert score_tail(" (C) because", ["C"], json.dumps(meta)).score == 1.0
    assert score_tail(" C", [], meta).score == 1.0  # no references: the meta's answer


def test_score_never_raises_on_odd_inputs() -> None:
    assert score_tail(None, None, None).error_type == "unmapped"  # type: ignore[arg-type]
    assert score_tail("Answer: C", "C", {"options": "not a list"}).score == 1.0
    assert score_tail("Answer: C", ["C"], "{broken").score == 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.lists(st.text(max_size=10), max_size=8))
def test_fuzz_scorer(output: str, options: list[str]) -> None:
    result = score_tail(output, ["C"], {"options": options})
    assert result.score in (0.0, 1.0) and result.parsed_answer in ("", "A", "B", "C", "D", "E", "F")
    assert result.error_type in ("", "wrong", "unmapped")


# ---------------------------------------------------------------------------------------------------- metrics

def rows() -> list[dict]:
    """A hand-worked grid: 2 lengths x 2 depths, 2 questions per cell."""
    grid = {(8192, 25.0): [1, 1], (8192, 75.0): [1, 0], (16384, 25.0): [1, 0], (16384, 75.0): [0, 0]}
    out = []
    for (length, depth), scores in grid.items():
        for s in scores:
            out.append({"target_length": length, "depth": depth + 0.37, "score": float(s),
                        "meta": json.dumps({"depth": depth})})  # the target depth in meta wins over the realised one
    return out


def test_grid_and_heatmap() -> None:
    cells = accuracy_grid(rows())
    assert [(c.target_length, c.depth, c.n, c.accuracy) for c in cells] == [
        (8192, 25.0, 2, 100.0), (8192, 75.0, 2, 50.0), (16384, 25.0, 2, 50.0), (16384, 75.0, 2, 0.0)]
    hm = heatmap(rows())
    assert hm.depths == (25.0, 75.0) and hm.lengths == (8192, 16384)
    assert hm.values == ((100.0, 50.0), (50.0, 0.0)) and hm.counts == ((2, 2), (2, 2))
    wider = heatmap(rows(), depths=[25, 50, 75], lengths=[8192, 16384, 32768])
    assert wider.values[1] == (None, None, None) and wider.values[0][2] is None and wider.counts[1] == (0, 0, 0)


def test_length_summary_by_hand() -> None:
    assert length_accuracy(rows()) == {8192: 75.0, 16384: 25.0}
    summary = length_summary(rows())
    assert summary.lengths == (8192, 16384) and summary.accuracy == (75.0, 25.0)
    assert summary.avg == 50.0
    assert summary.length_wavg_inc == round((8192 * 75 + 16384 * 25) / 24576, 2) == 41.67
    assert summary.length_wavg_dec == round((16384 * 75 + 8192 * 25) / 24576, 2) == 58.33
    assert summary.ratio == 33.33


@pytest.mark.parametrize("per_length, expected", [
    # Table 2 of the paper: 8k 16k 32k 64k 96k 128k -> Avg, wAvg(inc), wAvg(dec), 128k/8k (%)
    ((95.14, 93.48, 93.04, 89.46, 84.05, 77.87), (88.84, 84.29, 92.84, 81.85)),  # GPT-4o
    ((80.91, 57.70, 58.54, 58.52, 55.44, 54.07), (60.86, 56.49, 66.38, 66.83)),  # GLM-4-9B-Chat
    ((94.73, 93.00, 93.00, 91.44, 88.55, 66.32), (87.84, 81.58, 92.67, 70.01)),  # Qwen2.5-72B (Avg 87.87 printed)
])
def test_table_2_columns(per_length: tuple[float, ...], expected: tuple[float, ...]) -> None:
    lengths = [8192, 16384, 32768, 65536, 98304, 131072]
    summary = summarise_lengths(dict(zip(lengths, per_length, strict=True)))
    got = (summary.avg, summary.length_wavg_inc, summary.length_wavg_dec, summary.ratio)
    assert got == pytest.approx(expected, abs=0.011)


def test_empty_and_zero() -> None:
    empty = summarise_lengths({})
    assert empty.avg is None and empty.lengths == ()
    assert summarise_lengths({8192: 0.0, 16384: 10.0}).ratio is None
    assert accuracy_grid([{"score": 1.0}]) == []  # no length or depth: skipped


_OLD_EDGE = re.compile(r"^[\s\"'`.,:;!?()\[\]]+|[\s\"'`.,:;!?()\[\]]+$")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([" ", "\n", "\u00a0", "\u2003", ".", ",", "(", ")", "[", "]", "'", '"', "`", "?",
                                 "Leeds", "a", "B", "-", "*"]), max_size=14).map("".join))
def test_normal_strips_edges_as_the_old_pattern(text: str) -> None:
    assert choice.normal_form(text) == _OLD_EDGE.sub("", " ".join(text.split())).casefold()


def test_option_text_behind_a_long_run_of_punctuation() -> None:
    assert parse_choice("." * 100_000 + " Leeds", OPTIONS) == "E"


_OLD_CLAUSE = re.compile(r"((?:option|choice|letter)\s+)?([(\[])?([A-Fa-f])([)\]])?(.*)", re.IGNORECASE | re.DOTALL)


def _old_letter(clause: str) -> str:
    """`choice._letter` before it worked on positions (it sliced every marker's line: quadratic)."""
    match = _OLD_CLAUSE.match(clause.strip())
    if not match:
        return ""
    prefix, opened, letter, closed, rest = match.groups()
    if rest[:1].isalnum():
        return ""
    if choice.ALTERNATIVE.match(rest):
        return choice.AMBIGUOUS
    if prefix or opened or closed or choice.CLOSES.match(rest):
        return letter.upper()
    if not letter.isupper():
        return ""
    if letter != "A":
        return letter
    return "A" if rest.split(maxsplit=1)[0].lower() in choice.A_FOLLOWERS else ""


def _old_last_statement(text: str) -> tuple[str, str]:
    found, clause = "", ""
    for marker in choice.MARKER.finditer(text):
        end = text.find("\n", marker.end())
        tail = text[marker.end() : end if end >= 0 else len(text)]
        clause = tail
        letter = _old_letter(tail)
        if letter:
            found = letter
    return found, clause


_STATEMENT_PIECES = ["Answer", "answer is", "The correct answer is", "final answer", "best option", ":", "=", "-",
                     " ", "  ", "\n", "\t", "\u00a0", "A", "C", "a", "f", "G", "(", ")", "[", "]", ".", ",", " or ",
                     " and ", "/", "option ", "because", "total", "is", "Leeds", "x", "\u2014"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_STATEMENT_PIECES), max_size=16).map("".join))
def test_last_statement_reads_as_before(text: str) -> None:
    assert choice.last_statement(text) == _old_last_statement(text)


def test_many_markers_on_one_line_take_linear_time() -> None:
    import time

    start = time.perf_counter()
    assert parse_choice("Answer " * 60_000 + "\nAnswer: (C)", OPTIONS) == "C"
    assert time.perf_counter() - start < 2.0  # 0.1 s; slicing each marker's line took 11 s at 400K characters
