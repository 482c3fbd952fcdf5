"""Reading run roots for reports: summaries as written, or computed from the scores when missing."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from longeval.errors import StoreError
from longeval.report.runs import SUMMARY_NAMES, essay_note, instance_rows, load_run, load_scores, provenance_pairs
from longeval.stages.summarise import summarise_root
from longeval.text.corpus import PAUL_GRAHAM
from tests.report.report_helpers import EXPECTED_HEADLINE, HOSTILE_OUTPUT


def _headline(run) -> dict:
    row = [r for r in run.tables["headline"].to_pylist() if r["family"] == "ruler"][0]
    return {"avg": f"{row['avg']:.2f}", "wavg_inc": f"{row['wavg_inc']:.2f}", "wavg_dec": f"{row['wavg_dec']:.2f}",
            "effective": {8192: "8K", 4096: "4K"}[row["effective_length"]]}


def test_a_summarised_run_root_is_read_as_written(run_roots) -> None:
    a, _ = run_roots
    run = load_run(str(a))
    assert not run.computed
    assert tuple(run.tables) == SUMMARY_NAMES  # every table pipeline.report writes is one the report reads
    assert (run.label, run.model, run.suite, run.claimed_length) == ("model-a", "model-a", "synthetic", 32768)
    assert run.name == "model-a-run"
    assert _headline(run) == EXPECTED_HEADLINE["model-a"]


def test_summaries_are_computed_with_the_runs_own_config_when_missing(run_roots) -> None:
    _, b = run_roots
    assert not (b / "summary").exists()
    run = load_run(str(b), summarise=summarise_root)
    assert run.computed and (b / "summary" / "tasks.csv").is_file()
    assert _headline(run) == EXPECTED_HEADLINE["model-b"]
    assert not load_run(str(b), summarise=summarise_root).computed  # written once, then read
    with pytest.raises(StoreError, match="no summary/"):
        shutil.rmtree(b / "summary")
        load_run(str(b))  # the report alone never runs a stage


def test_a_folder_that_is_no_run_root_says_so(tmp_path, run_roots) -> None:
    with pytest.raises(StoreError, match="is this a run root"):
        load_run(str(tmp_path / "nothing"))
    _, b = run_roots
    (b / "config.yaml").unlink()
    with pytest.raises(StoreError, match="neither summary/ nor config.yaml"):
        load_run(str(b), summarise=summarise_root)
    with pytest.raises(StoreError, match="no scores"):
        load_scores(str(tmp_path / "nothing"))


def test_a_damaged_config_yaml_is_read_around_or_named(run_roots, caplog) -> None:
    """Issue #46: a config.yaml cut short so that it no longer parses. A summarised root is still read (its plan is
    then its instances); one whose summaries must be computed with that config names the damaged file and how to
    restore it, and changes nothing."""
    a, b = run_roots
    for root in (a, b):
        text = (root / "config.yaml").read_text()
        (root / "config.yaml").write_text(text[:text.index("reasoning:") + 4])
    run = load_run(str(a))
    assert run.label == "model-a" and _headline(run) == EXPECTED_HEADLINE["model-a"]
    assert "config.yaml is damaged: it does not parse as YAML" in caplog.text
    with pytest.raises(StoreError, match=r"has scores but no summary/, and .*config.yaml, which its summaries are "
                                         r"computed with, is damaged: it does not parse as YAML .*; move it aside"):
        load_run(str(b), summarise=summarise_root)
    assert not (b / "summary").exists()


def test_instance_rows_join_references_outputs_and_scores(run_roots) -> None:
    a, _ = run_roots
    rows = instance_rows(str(a)).to_pylist()
    assert len(rows) == len(load_scores(str(a)))
    failed = [r for r in rows if r["error_type"] not in ("", None)]
    assert failed and all(r["output"] == HOSTILE_OUTPUT for r in failed)
    assert all(r["references"] == "42" and r["finish_reason"] == "stop" for r in rows)
    assert [r["family"] for r in rows] == sorted(r["family"] for r in rows)


def test_provenance_names_the_settings_instance_ids_depend_on(run_roots) -> None:
    a, b = run_roots
    pairs = provenance_pairs(str(a), str(b))
    assert pairs["suite.seed"] == (42, 42)
    assert pairs["tokenizer_fingerprint"] == ("tok-1", "tok-1")
    assert "suite.lengths" not in pairs  # only named when the runs share no length


def test_essay_note_says_when_essay_tasks_are_not_comparable_with_rulers_table(run_roots) -> None:
    tasks = pa.table({"family": ["ruler", "ruler", "ruler"], "task": ["niah_single_2", "vt", "niah_multivalue"]})
    pydoc = {"essay_corpus": {"name": "pydoc_data.topics (not RULER's)"}}
    note = essay_note("m", pydoc, tasks)
    assert note.startswith("m: ruler/niah_multivalue, ruler/niah_single_2 ran on the essay haystack")
    assert "not comparable with RULER's published table" in note and "vt" not in note
    assert essay_note("m", {"essay_corpus": {"name": PAUL_GRAHAM}}, tasks) == ""
    assert essay_note("m", pydoc, pa.table({"family": ["ruler"], "task": ["niah_single_1"]})) == ""  # noise
    assert essay_note("m", {}, tasks) == ""  # runs from before versions.json recorded the corpus
    # load_run reads the run's versions.json: the synthetic run has no essay-haystack task, so no note
    a, _ = run_roots
    (a / "versions.json").write_text(json.dumps(pydoc), encoding="utf-8")
    assert load_run(str(a)).notes == ()
