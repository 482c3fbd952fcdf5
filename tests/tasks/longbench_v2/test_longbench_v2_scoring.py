"""Answer extraction as the reference does it, the scorer, and the Table 2 / Table 5 breakdown."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.scoring.judgement import Judgement
from longeval.tasks.longbench_v2 import LONGBENCH_V2_SCORERS, breakdown, extract_answer, score_longbench_v2

EXTRACTION = [
    ("The correct answer is (B)", "B"),
    ("Reasoning first.\nThe correct answer is (D).", "D"),
    ("**The correct answer is (B)**", "B"),  # every * is removed before matching
    ("The correct answer is **(C)**", "C"),
    ("The correct answer is (**D**)", "D"),
    ("The correct answer is B.", "B"),  # the fallback without parentheses
    ("The correct answer is B) because", "B"),
    ("The correct answer is A. Wait, no. The correct answer is (C).", "C"),  # parenthesised beats an earlier bare
    ("The correct answer is (A). On reflection, The correct answer is (C).", "A"),  # the first parenthesised
    ("The correct answer is Alice's claim", "A"),  # the reference's bare form reads a word's first letter
    ("the correct answer is (B)", ""),  # case-sensitive, as in the reference
    ("The correct answer is (b)", ""),
    ("The Correct Answer Is (B)", ""),
    ("The correct answer is: (B)", ""),
    ("The correct answer is  (B)", ""),
    ("The correct answer is\n(B)", ""),
    ("The correct answer is (E)", ""),
    ("The correct answer is (A or B)", ""),
    ("The correct answer is \uff08B\uff09", ""),  # full-width parentheses
    ("Answer: B", ""),
    ("(B)", ""),
    ("", ""),
    ("<think>The correct answer is (A)</think>The correct answer is (B)", "A"),  # stripping <think> is not ours
]


@pytest.mark.parametrize("output, letter", EXTRACTION)
def test_extraction(output: str, letter: str) -> None:
    assert extract_answer(output) == letter


@pytest.mark.parametrize("output, judgement", [
    ("The correct answer is (B)", Judgement(1.0, "B", "")),
    ("The correct answer is C", Judgement(0.0, "C", "wrong")),
    ("I cannot tell from the text.", Judgement(0.0, "", "invalid")),
    ("", Judgement(0.0, "", "invalid")),
])
def test_scorer(output: str, judgement: Judgement) -> None:
    assert score_longbench_v2(output, ["B"], {"answer": "B"}) == judgement
    assert LONGBENCH_V2_SCORERS["longbench_v2_choice"](output, ["B"], {}) == judgement


def test_scorer_tolerates_missing_pieces() -> None:
    assert score_longbench_v2("The correct answer is (A)", [], {"answer": "A"}).score == 1.0  # meta as fallback
    assert score_longbench_v2("The correct answer is (A)", [], {}).error_type == "wrong"
    assert score_longbench_v2(None, ["A"], {}) == Judgement(0.0, "", "invalid")  # type: ignore[arg-type]
    assert score_longbench_v2("The correct answer is (A)", [" A "], None).score == 1.0  # type: ignore[arg-type]
    assert score_longbench_v2("The correct answer is (C)", np.array(["C"]), {}).score == 1.0  # as read from Arrow
    assert score_longbench_v2("The correct answer is (C)", np.array(["C", "D"]), {}).score == 1.0
    assert score_longbench_v2("The correct answer is (C)", "C", {}).score == 1.0  # type: ignore[arg-type]
    assert score_longbench_v2("The correct answer is (C)", 3, {}).error_type == "wrong"  # type: ignore[arg-type]


def row(difficulty: str, length: str, domain: str, score: float, error_type: str) -> dict:
    return {"score": score, "error_type": error_type, "difficulty": difficulty, "length": length, "domain": domain}


SD, MD, ICL, CODE = ("Single-Document QA", "Multi-Document QA", "Long In-context Learning",
                     "Code Repository Understanding")
ROWS = [
    row("easy", "short", SD, 1, ""),
    row("easy", "short", SD, 0, "wrong"),
    row("easy", "medium", MD, 0, "invalid"),
    row("hard", "medium", MD, 1, ""),
    row("hard", "long", SD, 0, "invalid"),
    row("hard", "long", CODE, 0, "wrong"),
    row("hard", "long", CODE, 1, ""),
    row("hard", "short", SD, 0, "request_failed"),  # a failed request: counted, and as invalid
    row("easy", "long", ICL, 1, ""),
]


def test_breakdown_against_a_hand_worked_example() -> None:
    # Overall: 4 right of 9 = 44.44; 3 invalid (0.25 each): (4 + 0.75) / 9 = 52.78; invalid rate 3/9 = 33.33.
    # Hard: 2 of 5 right, 2 invalid: 40.00, (2 + 0.5) / 5 = 50.00, 40.00. Short: 1 of 3, 1 invalid: 33.33,
    # 1.25 / 3 = 41.67, 33.33. Single-Document QA: 1 of 4, 2 invalid: 25.00, 1.5 / 4 = 37.50, 50.00.
    table = [(r["split"], r["group"], r["n"], r["accuracy"], r["compensated_accuracy"], r["invalid_rate"])
             for r in breakdown(ROWS)]
    assert table == [
        ("overall", "overall", 9, 44.44, 52.78, 33.33),
        ("difficulty", "easy", 4, 50.0, 56.25, 25.0),
        ("difficulty", "hard", 5, 40.0, 50.0, 40.0),
        ("length", "short", 3, 33.33, 41.67, 33.33),
        ("length", "medium", 2, 50.0, 62.5, 50.0),
        ("length", "long", 4, 50.0, 56.25, 25.0),
        ("domain", SD, 4, 25.0, 37.5, 50.0),
        ("domain", MD, 2, 50.0, 62.5, 50.0),
        ("domain", ICL, 1, 100.0, 100.0, 0.0),
        ("domain", CODE, 2, 50.0, 50.0, 0.0),
    ]


def test_breakdown_reads_fields_from_meta_and_keeps_empty_columns() -> None:
    rows = [{"score": 1.0, "error_type": "", "meta": json.dumps({"difficulty": "hard", "length": "long",
                                                                  "domain": "Odd Domain"})},
            {"score": float("nan"), "error_type": "invalid", "meta": {"difficulty": "hard", "length": "long",
                                                                      "domain": CODE}}]
    table = {(r["split"], r["group"]): r for r in breakdown(rows)}
    assert table[("overall", "overall")]["accuracy"] == 50.0
    assert table[("overall", "overall")]["compensated_accuracy"] == 62.5
    assert table[("difficulty", "easy")] == {"split": "difficulty", "group": "easy", "n": 0, "accuracy": None,
                                             "compensated_accuracy": None, "invalid_rate": None}
    assert [r["group"] for r in breakdown(rows) if r["split"] == "domain"] == [CODE, "Odd Domain"]  # paper's first
    assert breakdown([])[0]["n"] == 0


OUTPUT_PIECES = st.sampled_from(["The correct answer is ", "the correct answer is ", "(", ")", "A", "B", "C", "D",
                                 "E", "a", "*", "**", " ", "\n", "\u0000", "\ufffd", "{context}", "Answer: "])
OUTPUTS = st.one_of(st.text(), st.lists(st.one_of(OUTPUT_PIECES, st.text(max_size=4)), max_size=30).map("".join))


@settings(max_examples=400, deadline=None)
@given(output=OUTPUTS, reference=st.sampled_from("ABCD"))
def test_scorer_never_raises_and_is_consistent(output: str, reference: str) -> None:
    judgement = score_longbench_v2(output, [reference], {"answer": reference})
    assert judgement.score in (0.0, 1.0) and judgement.parsed_answer in ("", "A", "B", "C", "D")
    if not judgement.parsed_answer:
        assert (judgement.score, judgement.error_type) == (0.0, "invalid")
    else:
        assert (judgement.parsed_answer == reference) == (judgement.score == 1.0)
        assert judgement.error_type == ("" if judgement.score else "wrong")
    # An answer in the expected form at the very start always wins.
    assert extract_answer(f"The correct answer is ({reference}) " + output) == reference


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from([(1.0, ""), (0.0, "wrong"), (0.0, "invalid"), (0.0, "request_failed")]),
    st.sampled_from(["easy", "hard"]), st.sampled_from(["short", "medium", "long"]), st.sampled_from([SD, MD, CODE]),
), max_size=40))
def test_breakdown_invariants(drawn: list[tuple]) -> None:
    rows = [row(difficulty, length, domain, score, error) for (score, error), difficulty, length, domain in drawn]
    table = breakdown(rows)
    overall = table[0]
    assert overall["n"] == len(rows)
    assert sum(r["n"] for r in table if r["split"] == "difficulty") == len(rows)
    assert sum(r["n"] for r in table if r["split"] == "length") == len(rows)
    assert sum(r["n"] for r in table if r["split"] == "domain") == len(rows)
    for r in table:
        if r["n"]:
            assert 0.0 <= r["invalid_rate"] <= 100.0
            assert not math.isnan(r["accuracy"])
            # Invalid rows score 0, so compensation adds a quarter of the invalid rate (up to rounding).
            assert abs(r["compensated_accuracy"] - (r["accuracy"] + r["invalid_rate"] / 4)) <= 0.02
