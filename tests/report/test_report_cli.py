"""`longeval report RUN_ROOT ... -o report.html` and `longeval compare A B` from the command line."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from longeval.cli import main
from longeval.config import load_config
from longeval.records import SCORE_SCHEMA
from longeval.run.consistency import PARTIAL_EXIT
from longeval.run.pipeline import run
from longeval.store.lease import acquire
from longeval.store.run_root import RunRoot

SYNTHETIC_PARTIAL = "6 of 33 planned instance shards are missing"
"""The synthetic runs hold SYNC and TAIL at two of the three lengths their config.yaml plans, LongBench v2 at one:
a report on them is partial (exit PARTIAL_EXIT) and says so."""


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_report_writes_the_page_and_compares_each_run_with_the_first(capsys, run_roots, tmp_path) -> None:
    a, b = run_roots
    out = tmp_path / "site" / "report.html"
    code, text = _run(capsys, "report", str(a), "-o", str(out), str(b), "--resamples", "200")  # options anywhere
    assert code == PARTIAL_EXIT and text.count(SYNTHETIC_PARTIAL) == 2, text
    assert out.is_file() and "model-a" in out.read_text()
    assert "compared model-b with model-a: matched 184 instance(s)" in text
    assert "model-b: summaries computed from the scores" in text
    assert sorted(p.name for p in (tmp_path / "site" / "report_files").iterdir()) == [
        "01-model-a.instances.csv", "02-model-b.instances.csv"]


def test_report_defaults_to_report_html_and_can_skip_comparisons(capsys, run_roots, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = run_roots
    code, text = _run(capsys, "report", str(a), str(b), "--no-compare")
    assert code == PARTIAL_EXIT, text
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
    assert code == PARTIAL_EXIT and f"warning: partial run {RunRoot(str(a)).uri}: {SYNTHETIC_PARTIAL}" in text, text
    assert "matched 184 instance(s)" in text and "exact McNemar" in text and "permutation" in text
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    overall = {r["family"]: r for r in rows if r["task"] == "overall"}
    assert set(overall) == {"ruler", "sync", "michelangelo", "longbench_v2", "tail"}
    assert (float(overall["ruler"]["mean_a"]), float(overall["ruler"]["mean_b"])) == (80.0, 83.33)
    again = tmp_path / "d.csv"
    assert main(["compare", str(a), str(b), "--resamples", "300", "--csv", str(again)]) == PARTIAL_EXIT
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


def _read_only_dir(path) -> bool:
    """A folder no write can go into: a read-only tmpfs as root (root ignores permission bits), else chmod."""
    import os
    import subprocess

    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        return True
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _one_error_line(text_lines: list[str]) -> str:
    errors = [line for line in text_lines if line.startswith("error:")]
    assert len(errors) == 1, text_lines
    return errors[0]


def test_report_onto_an_existing_directory_is_one_line_and_writes_nothing(capsys, run_roots, tmp_path) -> None:
    a, _ = run_roots
    folder = tmp_path / "out"
    folder.mkdir()
    code = main(["report", str(a), "-o", str(folder)])
    out = capsys.readouterr()
    assert code == 2
    assert _one_error_line(out.out.splitlines()) == (f"error: -o {folder}: {folder} is a directory; give the report's "
                                                     f"file name, e.g. -o {folder / 'report.html'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "runs"] and list(folder.iterdir()) == []


def test_report_to_proc_is_one_line_and_leaves_nothing_behind(capsys, run_roots) -> None:
    from pathlib import Path

    a, _ = run_roots
    code = main(["report", str(a), "-o", "/proc/x.html"])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    line = _one_error_line(out.out.splitlines())
    assert line.startswith("error: cannot write the report /proc/x.html: ")
    assert line.endswith("nothing was left behind; give -o a file in a folder you can write, e.g. -o ./report.html")
    assert "Traceback" not in out.out + out.err
    assert not Path("/proc/x_files").exists() and not Path("/proc/.x.html.tmp").exists()


def test_report_onto_a_read_only_folder_is_one_line_and_leaves_nothing_behind(capsys, run_roots, tmp_path) -> None:
    import subprocess

    import pytest

    a, _ = run_roots
    locked = tmp_path / "locked"
    if not _read_only_dir(locked):
        pytest.skip("cannot make a read-only folder here")
    try:
        code = main(["report", str(a), "-o", str(locked / "site" / "r.html")])
        out = capsys.readouterr()
        assert code == 2, out.out + out.err
        line = _one_error_line(out.out.splitlines())
        assert line.startswith(f"error: cannot write the report {locked}/site/r.html: Read-only file system") or \
            "Permission denied" in line, line
        assert list(locked.iterdir()) == []
    finally:
        subprocess.run(["umount", str(locked)], capture_output=True)
        locked.chmod(0o755)


def test_a_failed_report_write_removes_its_csvs_and_temp_file(capsys, run_roots, tmp_path, monkeypatch) -> None:
    """Mock: the page's temp file cannot be written (a disk that fills up after the CSVs)."""
    import errno
    from pathlib import Path

    a, _ = run_roots

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    code = main(["report", str(a), "-o", str(tmp_path / "new" / "r.html")])
    out = capsys.readouterr()
    assert code == 2
    assert "No space left on device" in _one_error_line(out.out.splitlines())
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]  # the CSVs, r_files/ and new/ are gone again


# -- a root with instances and nothing scored yet: what a report meets while `longeval run` infers (issue #46) ------

STAND_IN = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
            "suite.samples=2", "store.cache_instances=false"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory, tiny_model_path) -> Path:
    """A run root with its instances only (`longeval generate`, the stand-in engine's config): 2 instances."""
    base = tmp_path_factory.mktemp("generated")
    run(load_config([*STAND_IN, f"store.root={base}", "run_name=g"]), stages=("generate",))
    return base / "g"


@pytest.fixture
def unscored(generated, tmp_path) -> tuple[Path, list[str]]:
    """A fresh copy of the generated root, and the overrides that name it."""
    shutil.copytree(generated, tmp_path / "g")
    return tmp_path / "g", [*STAND_IN, f"store.root={tmp_path}", "run_name=g"]


def _unscored_lines(path: Path) -> tuple[str, str]:
    """The `warning: partial run` line of the unscored root, and the start of its page's banner."""
    uri = RunRoot(str(path)).uri
    what = (f"partial run {uri}: 2 of 2 instances are not predicted (0 engine errors, 2 not run yet); the numbers "
            "cover 0 of 2 instances. Rerun the same command to finish")
    return f"warning: {what}", f'<p class="banner" role="alert">tiny-random: {what}'


def _partial_report(capsys, line: str, *argv: str) -> str:
    code, text = _run(capsys, "report", *argv)
    assert code == PARTIAL_EXIT and text.count("warning: partial run") == 1 and line in text, text
    return text


@pytest.mark.ray
def test_a_root_with_nothing_scored_is_partial_whichever_form_reports_it(capsys, unscored, tmp_path) -> None:
    """Was: `report RUN_ROOT -o` an error (exit 2, "run `longeval score` first"), the overrides form exit 3, and
    the overrides form's page without the banner. Now both forms: exit 3, one line, the banner."""
    path, overrides = unscored
    line, banner = _unscored_lines(path)
    page = tmp_path / "r.html"
    _partial_report(capsys, line, str(path), "-o", str(page))
    assert banner in page.read_text() and not (path / "summary").exists()  # nothing to summarise: nothing written
    _partial_report(capsys, line, *overrides)
    page.unlink()
    _partial_report(capsys, line, *overrides, "-o", str(page))
    assert banner in page.read_text()
    for folder in ("instances", "_manifest/instances", "summary", "_manifest/summary"):  # config.yaml only: no run
        shutil.rmtree(path / folder)
    code, text = _run(capsys, "report", str(path), "-o", str(tmp_path / "none.html"))
    assert code == 2 and text == (f"error: run root {RunRoot(str(path)).uri} has no summary/ and no "
                                  "scores/scores.parquet; it holds no instances either: run `longeval run` with its "
                                  "overrides first"), text


@pytest.mark.ray
def test_a_root_being_written_with_nothing_scored_is_partial_not_complete(capsys, unscored, tmp_path) -> None:
    """Issue #46: during a live `longeval run` (it holds the lease; 0 instances predicted) `report RUN_ROOT -o`
    exited 0 with only the "being written" warning and a page without a banner. The summaries an earlier report
    wrote (empty: nothing scored) made it read as complete: with no scores, the root was not checked at all."""
    path, overrides = unscored
    line, banner = _unscored_lines(path)
    page = tmp_path / "r.html"
    _partial_report(capsys, line, *overrides)  # writes summary/ (empty), as a report before the run went on did
    assert (path / "summary" / "tasks.parquet").is_file()
    with acquire(RunRoot(str(path)), heartbeat_s=30.0, stale_s=300.0, command="longeval generate infer score report"):
        text = _partial_report(capsys, line, str(path), "-o", str(page))
        assert "is being written by host" in text and banner in page.read_text()
        _partial_report(capsys, line, *overrides)
    text = _partial_report(capsys, line, str(path), "-o", str(page))  # the run gone: the same answer
    assert "is being written" not in text and banner in page.read_text()
