"""The task contract, checked for every registered task (issue #13): what the pipeline relies on of any task.

At its smallest test length a task's instance fits (`input + max_new <= target`), is the same bytes for the same
seed, and its bound judge scores an empty output, junk and the reference in [0, 1] without raising. A new family
gets these checks by registering; nothing here names one.
"""

from __future__ import annotations

import numpy as np
import pytest

from longeval.scoring import score_prediction
from longeval.tasks import FAMILIES, TASKS
from tests.qa_fixtures import hotpotqa_file, squad_file  # noqa: F401
from tests.scoring.test_scorers_linear import _instance, _prediction, _reference, ctx, encoder  # noqa: F401

JUNK = "Lorem ipsum \x00\x1f ??? [1, 2 \\boxed{ Answer: Option (Z) <think> 🙂" * 20


@pytest.mark.parametrize("key", sorted(TASKS))
def test_every_task_keeps_the_contract(ctx, key):  # noqa: F811
    spec = TASKS[key]
    first, again = _instance(ctx, key), _instance(ctx, key)
    assert first.input_tokens + first.max_new_tokens <= first.target_length
    assert first.input_tokens == len(first.prompt_token_ids)
    row, row_again = first.to_row(), again.to_row()
    ids, ids_again = row.pop("prompt_token_ids"), row_again.pop("prompt_token_ids")
    assert row == row_again and np.array_equal(np.asarray(ids), np.asarray(ids_again))
    assert first.family == spec.family and first.task == spec.name and first.metric == spec.metric
    for output in ("", JUNK, _reference(first), " ".join(first.references)):
        score = score_prediction(first, _prediction(first, output), spec.judge)
        assert 0.0 <= score.score <= 1.0, (output[:80], score)


def test_every_task_belongs_to_one_registered_family():
    declared = [spec.key for family in FAMILIES.values() for spec in family.tasks]
    assert sorted(declared) == sorted(TASKS) and len(set(declared)) == len(declared)
    for family in FAMILIES.values():
        assert family.title and family.intro, family.name
        assert all(callable(spec.judge) for spec in family.tasks)
        names = [table.name for table in family.tables]
        assert len(set(names)) == len(names)


def test_every_declared_panel_shows_either_metrics_or_a_table():
    for family in FAMILIES.values():
        for panel in family.panels:
            assert bool(panel.metrics) != (panel.table is not None), (family.name, panel)
            assert panel.table is not None or panel.title, (family.name, panel)
        if any(panel.metrics for panel in family.panels):  # bars need a table that gives summary metrics
            assert any(table.metrics for table in family.tables), family.name
