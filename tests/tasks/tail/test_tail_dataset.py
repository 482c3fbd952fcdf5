"""The built benchmark's format: round trip, the builder's row from a slot, and an error for every bad field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longeval.errors import DataFileError
from longeval.tasks.tail import (
    FORMAT_VERSION,
    Stage,
    accepted_question,
    load_tail_dataset,
    make_manifest,
    next_step,
    shuffle_options,
    start,
    write_tail_dataset,
)
from longeval.tasks.tail.dataset import QUESTIONS_FILE, SEGMENTS_FILE
from tests.tasks.tail.tail_helpers import domain_of, question_for

DOMAINS = [domain_of("finance", 200), domain_of("law", 150)]


def write(folder: Path) -> str:
    questions = [question_for(DOMAINS[0], 1, 0.25), question_for(DOMAINS[0], 4, 0.75, "F"),
                 question_for(DOMAINS[1], 2, 0.5, "A")]
    write_tail_dataset(str(folder), questions, {d.name: d.segments for d in DOMAINS},
                       make_manifest(generator_model="gen-model", seed=11, domains=DOMAINS, depths=[0.25, 0.5, 0.75]))
    return str(folder)


def rewrite(folder: Path, name: str, change) -> None:
    rows = pq.read_table(folder / name).to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows), folder / name)


def test_round_trip(tmp_path: Path) -> None:
    data = load_tail_dataset(write(tmp_path / "bench"))
    assert data.manifest.version == FORMAT_VERSION and data.manifest.generator_model == "gen-model"
    assert data.manifest.seed == 11 and data.manifest.extra["depths"] == [0.25, 0.5, 0.75]
    assert data.manifest.extra["domains"]["law"]["sources"] == ["law.txt"]
    assert [q.domain for q in data.questions] == ["finance", "finance", "law"]
    first = data.questions[0]
    assert first.options[2].startswith("finance option C") and len(first.options) == 6
    assert first.gold_text == DOMAINS[0].segments[1] and first.depth == 0.25
    assert data.segments["law"] == DOMAINS[1].segments
    assert data.depths == (0.25, 0.5, 0.75)
    again = load_tail_dataset(f"file://{tmp_path / 'bench'}")
    assert again.fingerprint == data.fingerprint and again.questions == data.questions
    manifest = json.loads((tmp_path / "bench" / "manifest.json").read_text())
    assert manifest["format"] == "longeval-tail" and manifest["prompt_fingerprint"]


def test_accepted_slot_becomes_a_row() -> None:
    good = json.dumps({"question": "What rose in Leeds?", "options": list("uvwxyz"), "answer": "B"})
    slot = start("law", 0.5, 3)
    for out in (good, "Answer: B", "Answer: NONE"):
        slot = next_step(slot, out)
    assert slot.stage is Stage.ACCEPTED
    row = accepted_question(slot, DOMAINS[1], generator_model="gen")
    assert (row.domain, row.gold_segment, row.depth, row.answer) == ("law", 3, 0.5, "B")
    assert row.gold_text == DOMAINS[1].segments[3] and json.loads(row.provenance)["attempts"][0]["stage"] == "accepted"
    assert accepted_question(slot, DOMAINS[1], generator_model="gen").question_id == row.question_id
    shuffled = shuffle_options(slot.question, np.random.default_rng(3))
    moved = accepted_question(slot, DOMAINS[1], generator_model="gen", question=shuffled)
    assert (moved.options, moved.answer) == (shuffled.options, shuffled.answer)
    assert moved.question_id != row.question_id
    assert json.loads(moved.provenance)["final_question"]["answer"] == shuffled.answer
    with pytest.raises(ValueError, match="no accepted question"):
        accepted_question(start("law", 0.5, 3), DOMAINS[1], generator_model="gen")


def test_unset_and_missing(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"suite\.params\.tail\.dataset is not set.*TAIL builder"):
        load_tail_dataset(None)
    with pytest.raises(DataFileError, match=r"folder not found.*set suite\.params\.tail\.dataset="):
        load_tail_dataset(str(tmp_path / "nowhere"))
    folder = Path(write(tmp_path / "bench"))
    (folder / SEGMENTS_FILE).unlink()
    with pytest.raises(DataFileError, match="has no segments.parquet"):
        load_tail_dataset(str(folder))
    with pytest.raises(DataFileError, match="tail.dataset_other"):
        load_tail_dataset(str(tmp_path / "nowhere"), key="tail.dataset_other")


@pytest.mark.parametrize("manifest, message", [
    ("not json", "manifest.json is not valid JSON"),
    ("[1]", "holds a list"),
    ({"format": "other", "version": 1, "generator_model": "g", "seed": 1}, "has format 'other'"),
    ({"version": 2, "generator_model": "g", "seed": 1}, "format version 2, newer than this longeval reads"),
    ({"version": "1", "generator_model": "g", "seed": 1}, "no valid 'version'"),
    ({"version": 1, "seed": 1}, "no 'generator_model'"),
    ({"version": 1, "generator_model": "g", "seed": 1.5}, "no integer 'seed'"),
])
def test_bad_manifest(tmp_path: Path, manifest, message: str) -> None:
    folder = Path(write(tmp_path / "bench"))
    (folder / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    with pytest.raises(DataFileError, match=message):
        load_tail_dataset(str(folder))


def _set(field: str, value):
    def change(rows):
        rows[1][field] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set("options", ["a", "b", "c", "d", "e"]), "'options' must be six non-empty strings"),
    (_set("options", ["a", "b", "c", "d", "e", " "]), "'options' must be six non-empty strings"),
    (_set("answer", "G"), "'answer' is 'G', not one of A-F"),
    (_set("depth", 50.0), "'depth' is 50.0, not a fraction"),
    (_set("gold_segment", 99), "'gold_segment' 99 is not a segment of 'finance'"),
    (_set("domain", "patent"), "domain 'patent' has no segments"),
    (_set("gold_text", "edited"), "'gold_text' differs from segment 4"),
    (_set("question", None), "has no 'question'"),
    (lambda rows: rows.append(dict(rows[0])), "repeats the question_id of row 0"),
    (lambda rows: rows.clear(), "holds no questions"),
])
def test_bad_question_rows_are_named(tmp_path: Path, change, message: str) -> None:
    folder = Path(write(tmp_path / "bench"))
    if message == "holds no questions":
        empty = pq.read_table(folder / QUESTIONS_FILE).slice(0, 0)
        pq.write_table(empty, folder / QUESTIONS_FILE)
    else:
        rewrite(folder, QUESTIONS_FILE, change)
    with pytest.raises(DataFileError, match=message) as err:
        load_tail_dataset(str(folder))
    assert "suite.params.tail.dataset" in str(err.value)
    if "repeats" not in message and "no questions" not in message:
        assert "row 1 (question_id" in str(err.value)


def test_bad_segments(tmp_path: Path) -> None:
    folder = Path(write(tmp_path / "bench"))
    rewrite(folder, SEGMENTS_FILE, lambda rows: rows.remove(next(r for r in rows if r["domain"] == "law"
                                                                and r["index"] == 0)))
    with pytest.raises(DataFileError, match="domain 'law' lacks segment 0"):
        load_tail_dataset(str(folder))
    folder = Path(write(tmp_path / "bench2"))
    rewrite(folder, SEGMENTS_FILE, lambda rows: rows.append(dict(rows[0])))
    with pytest.raises(DataFileError, match="repeats segment 0 of domain 'finance'"):
        load_tail_dataset(str(folder))
    (folder / SEGMENTS_FILE).write_bytes(b"PAR1 broken")
    with pytest.raises(DataFileError, match="not a readable Parquet file"):
        load_tail_dataset(str(folder))
