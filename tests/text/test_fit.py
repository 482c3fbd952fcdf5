"""The exact-length API of `longeval.text`: whole items chosen to the token, and the budget's clear error."""

from __future__ import annotations

import numpy as np
import pytest

from longeval.errors import LengthError
from longeval.text import Frame, choose_lengths, context_budget


@pytest.mark.parametrize("seed", range(20))
def test_choose_lengths_fills_the_budget_with_whole_items_in_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 60, size=400)
    budget = int(rng.integers(500, 8000))
    chosen = choose_lengths(lengths, budget)
    assert np.all(np.diff(chosen) > 0)  # positions, in their original order, each once
    total = int(lengths[chosen].sum())
    assert total <= budget and budget - total < lengths.min()  # never room left for a whole item: nearly exact


def test_choose_lengths_takes_all_when_all_fit() -> None:
    lengths = np.array([5, 7, 9])
    assert choose_lengths(lengths, 100).tolist() == [0, 1, 2]


def test_context_budget_says_what_to_change() -> None:
    frame = Frame(head="h", tail="t", head_ids=np.zeros(300, np.int32), tail_ids=np.zeros(20, np.int32),
                  answer_prefix="")
    assert context_budget(frame, 1024, 64) == 1024 - 64 - 320
    with pytest.raises(LengthError, match="use a larger suite.lengths value"):
        context_budget(frame, 256, 64)
