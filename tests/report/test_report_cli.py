"""`longeval report RUN_ROOT ... -o report.html` and `longeval compare A B` from the command line."""

from __future__ import annotations

import csv

import pyarrow as pa

from longeval.cli import main
from longeval.records import SCORE_SCHEMA
from longeval.store import RunRoot


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_report_writes_the_page_and_compares_each_run_with_the_first(capsys, run_roots, tmp_path) -> None:
    a, b = run_roots
    out = tmp_path / "site" / "report.html"
    code, text = _run(capsys, "report", str(a), "-o", str(out), str(b), "--resamples", "200")  # options anywhere
    assert code == 0, text
    assert out.is_file() and "model-a" in out.read_text()
    assert "compared model-b with model-a: matched 186 instance(s)" in text
    assert "model-b: summaries computed from the scores" in text
    assert sorted(p.name for p in (tmp_path / "site" / "report_files").iterdir()) == [
        "01-model-a.instances.csv", "02-model-b.instances.csv"]


def test_report_defaults_to_report_html_and_can_skip_comparisons(capsys, run_roots, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = run_roots
    code, text = _run(capsys, "report", str(a), str(b), "--no-compare")
    assert code == 0, text
    assert (tmp_path / "report.html").is_file()
    assert "compared" not in text and 'id="comparisons"' not in (tmp_path / "report.html").read_text()


def test_report_refuses_run_roots_mixed_with_overrides(capsys, run_roots) -> None:
    a, _ = run_roots
    code, text = _run(capsys, "report", str(a), "suite=quick")
    assert code == 2
    assert "give run roots" in text and "not both" in text


def test_compare_prints_the_paired_table_and_writes_csv(capsys, run_roots, tmp_path) -> None:
    a, b = run_roots
    code, text = _run(capsys, "compare", str(a), str(b), "--resamples", "300", "--csv", str(tmp_path / "c.csv"))
    assert code == 0, text
    assert "matched 186 instance(s)" in text and "exact McNemar" in text and "permutation" in text
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    overall = {r["family"]: r for r in rows if r["task"] == "overall"}
    assert set(overall) == {"ruler", "sync", "michelangelo", "longbench_v2", "tail"}
    assert (float(overall["ruler"]["mean_a"]), float(overall["ruler"]["mean_b"])) == (80.0, 83.33)
    again = tmp_path / "d.csv"
    assert main(["compare", str(a), str(b), "--resamples", "300", "--csv", str(again)]) == 0
    assert again.read_text() == (tmp_path / "c.csv").read_text()  # seeded: the same table every time


def test_compare_without_shared_instances_explains_why(capsys, run_roots) -> None:
    a, b = run_roots
    root = RunRoot(str(b))
    scores = root.read_stage("scores", SCORE_SCHEMA)
    renamed = scores.set_column(0, "instance_id", pa.array([f"other-{i}" for i in scores["instance_id"].to_pylist()]))
    root.write_table("scores", "scores", renamed)
    root.write_json("versions.json", {"tokenizer_fingerprint": "tok-2"})
    code, text = _run(capsys, "compare", str(a), str(b))
    assert code == 2
    assert "no instance in common" in text and "tokenizer_fingerprint 'tok-1' vs 'tok-2'" in text
    assert "Traceback" not in text
