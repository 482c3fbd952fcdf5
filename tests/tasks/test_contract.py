"""The task contract, checked for every registered task (issues #13, #26): what the pipeline relies on of any task.

Each task's instance is generated at the smallest length the task declares (`TaskSpec.min_length`, at least 2048;
fixtures in tests/task_instances.py), and must keep these requirements, which name every assertion's message:

- R1 fits: `input_tokens + max_new_tokens <= target_length`.
- R2 counted: `input_tokens` is the number of prompt token ids the engine receives, and those ids are what the
  prompt text tokenizes to (with the contract's tokenizer and prompt format: SmolLM2's chat template), so the
  model reads the prompt the instance shows.
- R3 deterministic: the same seed, length and index give the same instance, byte for byte.
- R4 labelled: the instance's family, task and metric are its TaskSpec's.
- R5 depth in percent: `depth` is in [0, 100], or -1 where the task has none (whole documents).
- R6 judged safely: the bound judge scores an empty output, junk, the reference and all references in [0, 1]
  without raising.

and every registered family:

- R7 declared once: every task belongs to exactly one registered family, under its key `family/name`.
- R8 described: the family has a title and an intro (the report's paragraph above its section).
- R9 bare names unique: no two tasks share a bare name (suites select tasks by bare name).
- R10 tables named once: its summary tables have distinct names.
- R11 panels well-formed: each dashboard panel shows either metrics or a table, a metrics panel has a title,
  and metric bars come from a table that gives summary metrics.
- R12 sample data declared: a task that reads a `DataPaths` file (`TaskSpec.needs`) belongs to a family whose
  `sample_data` writes it; the instances above are generated from every family's sample data.

A new family gets these checks by registering; nothing here names one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from longeval.scoring import score_prediction
from longeval.tasks import FAMILIES, TASKS
from longeval.tasks.base import GenContext
from tests.task_instances import family_samples, length_of, prediction, reference_answer, task_instance

JUNK = "Lorem ipsum \x00\x1f ??? [1, 2 \\boxed{ Answer: Option (Z) <think> 🙂" * 20


@pytest.mark.parametrize("key", sorted(TASKS))
def test_every_task_keeps_the_contract(task_ctx: GenContext, key: str) -> None:
    spec = TASKS[key]
    first, again = task_instance(task_ctx, key), task_instance(task_ctx, key)
    assert first.target_length == length_of(spec)
    assert first.input_tokens + first.max_new_tokens <= first.target_length, (
        f"R1 fits: {key}: {first.input_tokens} input + {first.max_new_tokens} output tokens > {first.target_length}")
    assert first.input_tokens == len(first.prompt_token_ids), f"R2 counted: {key}: input_tokens is not the id count"
    retokenized = task_ctx.encoder.encode(first.prompt)
    assert np.array_equal(retokenized, np.asarray(first.prompt_token_ids)), (
        f"R2 counted: {key}: the prompt's ids are not what its text tokenizes to ({len(first.prompt_token_ids)} "
        f"ids, {len(retokenized)} from the text): encode a piece that ends in whitespace against what follows it "
        "(`piece(encoder, text, follower=...)`) and start each piece at a word boundary")
    row, row_again = first.to_row(), again.to_row()
    ids, ids_again = row.pop("prompt_token_ids"), row_again.pop("prompt_token_ids")
    assert row == row_again, f"R3 deterministic: {key}: two instances of one seed differ"
    assert np.array_equal(np.asarray(ids), np.asarray(ids_again)), f"R3 deterministic: {key}: token ids differ"
    assert (first.family, first.task, first.metric) == (spec.family, spec.name, spec.metric), (
        f"R4 labelled: {key}: instance says {first.family}/{first.task} scored by {first.metric}")
    assert first.depth == -1.0 or 0.0 <= first.depth <= 100.0, (
        f"R5 depth in percent: {key}: depth {first.depth} (a fraction? Draft.depth is 0-100, or -1)")
    for output in ("", JUNK, reference_answer(first), " ".join(first.references)):
        score = score_prediction(first, prediction(first, output), spec.judge)
        assert 0.0 <= score.score <= 1.0, f"R6 judged safely: {key}: score {score.score} on {output[:80]!r}"


def test_every_task_belongs_to_one_described_family() -> None:
    declared = [spec.key for family in FAMILIES.values() for spec in family.tasks]
    assert sorted(declared) == sorted(TASKS), "R7 declared once: TASKS and the families' tasks differ"
    twice = [key for key, count in Counter(declared).items() if count > 1]
    assert not twice, f"R7 declared once: {twice} in two families"
    for name, family in FAMILIES.items():
        assert all(spec.family == name for spec in family.tasks), f"R7 declared once: {name} holds another's task"
        assert family.title and family.intro.strip(), f"R8 described: {name} needs a title and an intro"
    bare = Counter(spec.name for spec in TASKS.values())
    assert not [n for n, count in bare.items() if count > 1], f"R9 bare names unique: {bare.most_common(3)}"


def test_every_family_names_its_tables_once_and_declares_panels_well() -> None:
    for name, family in FAMILIES.items():
        tables = [table.name for table in family.tables]
        assert len(set(tables)) == len(tables), f"R10 tables named once: {name}: {tables}"
        for panel in family.panels:
            assert bool(panel.metrics) != (panel.table is not None), (
                f"R11 panels well-formed: {name}: {panel} shows both or neither of metrics and a table")
            assert panel.table is not None or panel.title, f"R11 panels well-formed: {name}: {panel} has no title"
        if any(panel.metrics for panel in family.panels):
            assert any(table.metrics for table in family.tables), (
                f"R11 panels well-formed: {name}: metric bars but no table gives summary metrics")


def test_a_task_that_reads_data_files_has_its_family_write_samples(tmp_path_factory: pytest.TempPathFactory) -> None:
    samples = family_samples(tmp_path_factory.mktemp("samples"))
    for name, family in FAMILIES.items():
        needs = {field for spec in family.tasks for field in spec.needs}
        given = samples[name].data if name in samples else {}
        assert needs <= set(given), (f"R12 sample data declared: {name} reads {sorted(needs - set(given))}: "
                                     f"declare Family.sample_data writing them")
        for field, path in given.items():
            assert Path(path).exists(), f"R12 sample data declared: {name}'s {field} {path} was not written"


def test_every_family_declares_its_effective_length_threshold_and_where_it_comes_from() -> None:
    for name, family in FAMILIES.items():
        assert family.threshold is not None, f"R13 threshold declared: {name}: give Family(threshold=...)"
        assert 0 < family.threshold.value < 100 and family.threshold.source.strip(), f"R13 threshold declared: {name}"
    assert FAMILIES["ruler"].threshold.value == 85.6 and "RULER §4" in FAMILIES["ruler"].threshold.source
    for name in set(FAMILIES) - {"ruler"}:  # a borrowed bar says whose it is and that the paper sets none
        assert "borrowed" in FAMILIES[name].threshold.source, name
        assert FAMILIES[name].title in FAMILIES[name].threshold.source, name
