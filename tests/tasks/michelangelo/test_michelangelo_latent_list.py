"""Latent List (§2.1) against the paper: the generated code, run line by line with our own interpreter
over the operation grammar, gives the reference; filler never changes the list; the metric is the
paper's code."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext
from longeval.tasks.michelangelo import latent_list as ll
from longeval.tasks.michelangelo import prompts
from tests.tasks.michelangelo.mich_helpers import between, rng

N = 15  # 3 complexities x 5 views


def _lines(d: Draft) -> list[str]:
    """The task's operation lines (after the examples), ending before the view line."""
    body = between(d.prompt, prompts.LATENT_LIST_INIT, f">> {d.meta['query']}\n")
    return body.splitlines(keepends=True)


@pytest.fixture(scope="module")
def instances(drafts: Callable[[str, int, int], list[Draft]]) -> list[Draft]:
    return drafts("latent_list", 4096, N)


def test_every_complexity_and_view_once_in_15_indices(instances: list[Draft]) -> None:
    seen = Counter((d.meta["complexity"], d.meta["view"]) for d in instances)
    assert set(seen) == {(c, v) for c in (1, 5, 20) for v in ll.VIEWS}
    assert set(seen.values()) == {1}
    assert [d.complexity for d in instances[:3]] == ["ops=1", "ops=5", "ops=20"]


def test_the_code_runs_to_the_reference_and_filler_never_changes_the_list(instances: list[Draft]) -> None:
    for d in instances:
        lines = _lines(d)
        relevant = d.meta["relevant_lines"]
        assert len(relevant) == d.meta["complexity"] == len(d.meta["relevant_ops"])
        assert [lines[i][3:-1] for i in relevant] == d.meta["relevant_ops"]
        values = list(ll.INITIAL)
        segment_start = list(values)
        for i, line in enumerate(lines):
            op = ll.parse_line(line)  # every line is in the grammar
            before = list(values)
            ll.apply(values, op)
            if i in relevant:
                assert before == segment_start, "the filler since the last relevant operation changed the list"
                assert values != before, "a relevant operation must change the list"
                segment_start = list(values)
        assert values == segment_start  # the filler after the last relevant operation changed nothing
        assert values == d.meta["final_list"]
        start, stop = d.meta["slice"] or (0, len(values))
        assert ll.view_answer(values, d.meta["view"], start, stop) == d.references[0] == d.meta["target"]


def test_values_are_in_the_papers_range_and_the_question_is_well_formed(instances: list[Draft]) -> None:
    for d in instances:
        for op in d.meta["relevant_ops"]:
            name, args = ll.parse_line(f">> {op}")
            if name in ("append", "insert"):
                assert -4000 <= args[-1] <= 4000
        view, query = d.meta["view"], d.meta["query"]
        assert query == ("len(a)" if view == "len" else f"{view}(a[{d.meta['slice'][0]}:{d.meta['slice'][1]}])")
        assert d.prompt.rstrip().endswith(prompts.LATENT_LIST_CUE)
        assert d.prompt.count("Example 3:\n>> a = [1, 2, 3, 4, 5, 6]\n") == 1


def test_few_shot_answers_are_computed_for_the_asked_view(instances: list[Draft]) -> None:
    expected = {"print": ("[4, 5]", "[1]"), "sum": ("9", "1"), "min": ("4", "1"), "max": ("5", "1"),
                "len": ("5", "6")}
    for d in instances:
        outputs = [line[len("Output: ") :] for line in d.prompt.splitlines() if line.startswith("Output: ")]
        assert tuple(outputs) == expected[d.meta["view"]]


def test_every_filler_block_leaves_any_list_unchanged() -> None:
    texts, groups = ll.filler_blocks()
    assert set(groups) == {0, 1, 2}
    r = rng(7)
    for text in texts:
        ops = [ll.parse_line(line) for line in text.splitlines(keepends=True)]
        for size in (1, 2, 6, 13):
            start = [int(x) for x in r.integers(-4000, 4001, size=size)]
            assert ll.run(ops, start) == start, text


def test_filler_strategies_are_drawn_uniformly(ctx: GenContext) -> None:
    filler = ll.filler_pool(ctx)
    picks = filler.draw(rng(1))(30_000)
    strategy = np.searchsorted(filler.offsets, picks, side="right") - 1
    shares = np.bincount(strategy, minlength=3) / len(picks)
    assert np.allclose(shares, 1 / 3, atol=0.02)


def test_relevant_operations_spread_over_the_context(drafts: Callable[[str, int, int], list[Draft]]) -> None:
    depths = [line / len(_lines(d)) for d in drafts("latent_list", 8192, 9) for line in d.meta["relevant_lines"]]
    assert 0.35 < float(np.mean(depths)) < 0.65
    assert min(depths) < 0.2 and max(depths) > 0.8


def test_interpreter_round_trip_and_rejects_other_code() -> None:
    for op in [("append", (-12,)), ("insert", (3, 4000)), ("pop", (0,)), ("pop", ()), ("remove", (5,)),
               ("sort", ()), ("reverse", ()), ("print", ())]:
        assert ll.parse_line(f">> {ll.render(op)}\n") == op
    for bad in (">> import os\n", ">> a.clear()\n", ">> a.insert(1)\n", ">> __import__('os')\n", "a.sort()"):
        with pytest.raises(ValueError):
            ll.parse_line(bad)


def test_relevant_ops_change_the_list_and_keep_it_non_empty() -> None:
    r = rng(3)
    for _ in range(200):
        ops, values = ll.relevant_ops(r, 20)
        state = list(ll.INITIAL)
        for op in ops:
            before = list(state)
            ll.apply(state, op)
            assert state != before and state
        assert state == values


def test_params_are_checked() -> None:
    with pytest.raises(ConfigError):
        ll.LatentListParams(views=("median",))
    with pytest.raises(ConfigError):
        ll.LatentListParams(complexities=(0,))


# -- the metric, as the paper's code computes it ---------------------------------------------------


@pytest.mark.parametrize(("answer", "target", "view", "expected"), [
    ("[4, 5]", "[4, 5]", "print", 1.0),
    ("[4,5]", "[4, 5]", "print", 0.0),  # the raw metric is an exact string match
    (9, "9", "sum", 1.0),
    (8, "10", "sum", 0.8),
    (12, "10", "max", 0.8),
    (30, "10", "sum", 0.0),  # error capped at 1
    (-10, "10", "min", 0.0),
    (0, "0", "sum", 1.0),  # target 0: 0 / (1e-10 + 0) = 0
    (1, "0", "sum", 0.0),  # target 0: any miss is a full error
    (9.0, "9", "sum", 0.0),  # not an int
    ("9", "9", "sum", 0.0),  # a string is not an int either
    (-2000, "-4000", "min", 0.5),
    (3, "4", "len", 0.75),
])
def test_metric_matches_the_papers_code(answer: object, target: str, view: str, expected: float) -> None:
    assert ll.latent_list_metric(answer, target, view) == pytest.approx(expected, abs=1e-9)


def test_metric_survives_huge_numbers() -> None:
    assert ll.latent_list_metric(10**400, "5", "sum") == 0.0


@pytest.mark.parametrize(("output", "view", "target", "score", "error"), [
    (" [4, 5]", "print", "[4, 5]", 1.0, ""),
    ("[4,5]", "print", "[4, 5]", 1.0, ""),  # parsed, then printed as Python prints it
    ("Output: [4, 5]\n", "print", "[4, 5]", 1.0, ""),
    ("print(a[1:3]) outputs [4, 5].", "print", "[4, 5]", 1.0, ""),
    ("[5, 4]", "print", "[4, 5]", 0.0, "wrong_list"),
    ("four and five", "print", "[4, 5]", 0.0, "no_list"),
    ("[]", "print", "[]", 1.0, ""),
    (" 9", "sum", "9", 1.0, ""),
    ("The sum of a[1:3] is 9.", "sum", "9", 1.0, ""),
    ("9 (4 + 5)", "sum", "9", 1.0, ""),
    ("1,234", "sum", "1234", 1.0, ""),
    ("\u22125", "min", "-5", 1.0, ""),
    ("8", "sum", "10", 0.8, "inexact"),
    ("-10", "sum", "10", 0.0, "wrong_value"),
    ("9.5", "sum", "9", 0.0, "not_an_integer"),
    ("", "sum", "9", 0.0, "not_a_number"),
    ("nine", "len", "9", 0.0, "not_a_number"),
    ("**7**", "len", "7", 1.0, ""),
])
def test_scorer_parses_answers(output: str, view: str, target: str, score: float, error: str) -> None:
    judged = ll.score_latent_list(output, [target], {"view": view, "target": target})
    assert judged.score == pytest.approx(score, abs=1e-9)
    assert judged.error_type == error


def test_scorer_gives_full_marks_to_every_reference(instances: list[Draft]) -> None:
    for d in instances:
        assert ll.score_latent_list(d.references[0], d.references, d.meta).score == 1.0
        assert ll.score_latent_list(f"Output: {d.references[0]}", d.references, d.meta).score == 1.0


_OLD_INT_LIST = re.compile(r"\[\s*(?:[-+]?\d{1,12}\s*(?:,\s*[-+]?\d{1,12}\s*)*,?\s*)?\]")
"""`INT_LIST` before it was made possessive (quadratic on "[1" + spaces): the new one must match the same."""


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["[", "]", "[]", " ", "  ", "\n", ",", ", ", "-", "+", "1", "42", "1234567890123",
                                 "x", "a.", "."]), max_size=16).map("".join))
def test_int_list_pattern_matches_as_before(text: str) -> None:
    assert [m.span() for m in ll.INT_LIST.finditer(text)] == \
        [m.span() for m in _OLD_INT_LIST.finditer(text)]


def test_list_after_a_long_run_of_spaces() -> None:
    assert ll.parse_list("[1" + " " * 19_000 + "x [3, -4]") == [3, -4]
