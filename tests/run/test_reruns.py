"""A run root never mixes configurations: summaries cover exactly the current suite's instances, and the
default run name differs per suite. Driven through the command line, without an engine: the predictions are
written the way the infer stage writes them.

Most commands run in process (`longeval.cli.main`, on this worker's Ray); a `longeval` subprocess is kept where
the check is about what a user's terminal shows of a fresh process (Ray's actor-restart line, piped output's
width) or about the process's own start (RAY_ADDRESS reaches a fresh process: no Ray started)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longeval.cli import main
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, Prediction
from longeval.run.consistency import PARTIAL_EXIT
from longeval.store.run_root import RunRoot
from tests.cli_subprocess import flat, longeval

BASE = ["model=tiny_random", "suite.lengths=[1024]", "suite.shard_size=2"]
FINISHED = [*BASE, "suite.tasks=[vt]", "suite.samples=2", "run_name=done"]
"""The finished root the `finished` fixture builds (instances, predictions, scores, summaries), named `done`."""


def cli(*argv: str) -> tuple[int, str, str]:
    """`longeval ARGV` in this process: its exit code, its stdout, and stdout, stderr and log lines with whitespace
    collapsed (as `flat` gives them for a subprocess). Usable in module fixtures, unlike capsys and caplog."""
    out, err, logged = io.StringIO(), io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logged)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        logging.getLogger().removeHandler(handler)
    return code, out.getvalue(), " ".join((out.getvalue() + err.getvalue() + logged.getvalue()).split())


def predict_everything(root: RunRoot) -> int:
    """A right answer for every instance without a prediction, as one committed predictions part."""
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "references"])
    done = set(root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"])["instance_id"].to_pylist())
    rows = [Prediction(instance_id=r["instance_id"], model_id="tiny-random", output=" ".join(r["references"]),
                       output_tokens=3, finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1).to_row()
            for r in instances.to_pylist() if r["instance_id"] not in done]
    if rows:
        root.write_part("predictions", pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA))
    return len(rows)


def tasks_table(root: RunRoot) -> list[tuple[str, int]]:
    return sorted((row["task"], row["n"]) for row in root.read_json("summary.json")["tasks"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_path) -> tuple[Path, str]:
    """A finished root (`FINISHED`: generated, predicted here, then `longeval run` scored and summarised it): its
    store.root, and the text of that `run`. Tests copy it (`finished_copy`) before they change it."""
    store = tmp_path_factory.mktemp("finished")
    code, _, text = cli("generate", *FINISHED, f"store.root={store}")
    assert code == 0, text
    assert predict_everything(RunRoot(str(store / "done"))) == 2
    code, _, text = cli("run", *FINISHED, f"store.root={store}")
    assert code == 0, text
    return store, text


@pytest.fixture
def finished_copy(finished, tmp_path) -> tuple[RunRoot, list[str]]:
    """A fresh copy of the finished root in tmp_path, and the overrides that name it."""
    shutil.copytree(finished[0] / "done", tmp_path / "done")
    return RunRoot(str(tmp_path / "done")), [*FINISHED, f"store.root={tmp_path}"]


@pytest.mark.ray
def test_a_smaller_suite_on_the_same_root_reports_only_its_own_instances(tmp_path):
    """Ray's actor-restart line (ray #53727) as a fresh process's terminal shows it is checked on the `longeval
    run` subprocess of `test_the_table_shows_n_intervals_all_failure_cells_and_incomplete_runs` (the same score
    pool); here on what the in-process commands print and log."""
    big = [*BASE, "suite.tasks=[niah_single_1,vt]", "suite.samples=4", f"store.root={tmp_path}", "run_name=same"]
    code, _, gen = cli("generate", *big)
    assert code == 0, gen
    root = RunRoot(str(tmp_path / "same"))
    assert predict_everything(root) == 8
    code, _, first = cli("run", *big)
    assert code == 0, first
    assert tasks_table(root) == [("niah_single_1", 4), ("vt", 4)]
    assert "53727" not in first and "53727" not in gen  # Ray's actor-restart line is gone

    small = [*BASE, "suite.tasks=[vt]", "suite.samples=2", f"store.root={tmp_path}", "run_name=same"]
    code, _, second = cli("run", *small)
    assert code == 0, second
    assert tasks_table(root) == [("vt", 2)]  # neither the other task nor the other samples
    assert all(row["tasks"] == 1 for row in root.read_json("summary.json")["lengths"])
    assert "niah_single_1" not in second


@pytest.mark.ray
def test_more_samples_than_a_finished_shard_holds_are_refused(tmp_path):
    first = [*BASE, "suite.tasks=[vt]", "suite.samples=1", f"store.root={tmp_path}", "run_name=r"]
    code, _, gen = cli("generate", *first)
    assert code == 0, gen
    code, _, text = cli("generate", *BASE, "suite.tasks=[vt]", "suite.samples=2", f"store.root={tmp_path}",
                        "run_name=r")
    assert code == 2
    assert "suite.samples=1" in text and "suite.samples=2" in text and "run_name=" in text
    assert "Traceback" not in text


def test_default_run_names_differ_per_suite(tmp_path):
    one = cli("plan", *BASE, "suite.tasks=[vt]", "suite.samples=2", f"store.root={tmp_path}")
    two = cli("plan", *BASE, "suite.tasks=[vt]", "suite.samples=3", f"store.root={tmp_path}")
    assert one[0] == two[0] == 0
    roots = [re.search(r"-> (\S+)", text).group(1) for _, _, text in (one, two)]
    assert roots[0] != roots[1]
    assert all(re.fullmatch(rf"{re.escape(str(tmp_path))}/tiny-random-quick-seed42-[0-9a-f]{{8}}", r) for r in roots)


@pytest.mark.ray
def test_a_damaged_shard_is_named_set_aside_and_redone(finished_copy):
    root, args = finished_copy
    (shard,) = sorted(Path(root.uri, "instances").glob("*.parquet"))
    # One flipped byte in a page the rerun reads (instance ids; metadata reads check only the pages they read,
    # by Parquet's page checksums): same size, another checksum.
    footer = pq.ParquetFile(shard).metadata
    column = footer.schema.to_arrow_schema().get_field_index("instance_id")
    data = bytearray(shard.read_bytes())
    data[footer.row_group(0).column(column).data_page_offset + 20] ^= 0xFF
    shard.write_bytes(bytes(data))

    code, _, text = cli("run", *args)
    assert code == 0, text
    assert "Traceback" not in text
    assert f"damaged shard {shard}" in text and "set aside" in text
    assert "this command writes it again now" in text and "rerun the same command" not in text  # it did, itself
    assert len(list(Path(root.uri, "_damaged", "instances").glob("*.parquet"))) == 1
    assert root.verify("instances") == []  # written again, whole
    assert tasks_table(root) == [("vt", 2)]


def test_bad_input_gets_one_line_naming_the_setting_and_the_expected_value(tmp_path):
    cases = [
        (["+suite.params.vt.num_hops=abc"], "ruler/vt parameter num_hops='abc' is a str; expected int"),
        (["suite.samples=many"], "suite.samples must be an integer, got 'many'; write suite.samples=500"),
        (["suite.tasks=[]"], "suite.tasks is empty; give at least one task, e.g. suite.tasks=[niah_single_1]"),
        (["cluster.replicas=0"], "cluster.replicas=0: expected an integer of at least 1"),
        (["cluster.batch_size=0"], "cluster.batch_size=0: expected an integer of at least 1"),
    ]
    for argv, expected in cases:
        code, stdout, text = cli("run", "model=tiny_random", f"store.root={tmp_path}", *argv)
        assert code == 2, text
        assert expected in text
        assert "Traceback" not in text and len(stdout.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # failed before any work


@pytest.mark.ray
def test_a_rerun_with_nothing_left_to_do_does_not_start_ray(finished, finished_copy):
    """The rerun is a `longeval` subprocess: RAY_ADDRESS must reach a fresh process, which would start (join) Ray
    if it tried."""
    _, first = finished  # the `run` that scored the root
    assert "Ray not started" not in first  # the scores were missing: Ray scored them
    root, args = finished_copy
    again = longeval("run", *args, env={"RAY_ADDRESS": "127.0.0.1:1"})  # a Ray start would fail loudly here
    text = flat(again)
    assert again.returncode == 0, text
    assert "nothing left to do" in text and "Ray not started" in text
    assert tasks_table(root) == [("vt", 2)]


@pytest.mark.ray
def test_the_table_shows_n_intervals_all_failure_cells_and_incomplete_runs(tmp_path):
    """A length above max_model_len (allowed): every prompt is recorded too long without an engine, and the
    table says so instead of showing a model that scored 0; before that, the partial report is marked. The
    full `run` is a `longeval` subprocess: its table is what a user's pipe gets, without Ray's actor-restart line
    (ray #53727) from its score pool."""
    args = ["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024,16384]", "suite.samples=2",
            "suite.allow_too_long=true", f"store.root={tmp_path}", "run_name=t"]
    code, _, gen = cli("generate", *args)
    assert code == 0, gen
    root = RunRoot(str(tmp_path / "t"))
    short = [r for r in root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "references",
                                                                                "target_length"]).to_pylist()
             if r["target_length"] == 1024]
    root.write_part("predictions", pa.Table.from_pylist(
        [Prediction(instance_id=r["instance_id"], model_id="tiny-random", output=" ".join(r["references"]),
                    output_tokens=2,
                    finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1).to_row() for r in short],
        schema=PREDICTION_SCHEMA))
    code, _, scored = cli("score", *args)  # partial: `score` says so as `report` does (issue #46)
    assert code == PARTIAL_EXIT and "2 of 4 instances are not predicted" in scored, scored
    code, _, partial = cli("report", *args)  # the 16K prompts have not been through the infer stage yet
    assert code == PARTIAL_EXIT, partial
    assert "INCOMPLETE RUN: partial results" in partial and "warning: partial run" in partial
    page = tmp_path / "partial.html"
    code, _, html = cli("report", str(tmp_path / "t"), "-o", str(page))
    assert code == PARTIAL_EXIT, html
    assert "2 of 4 instances are not predicted (0 engine errors, 2 not run yet)" in html
    assert "INCOMPLETE RUN tiny-random: partial run" in page.read_text()

    full = longeval("run", *args)
    text = flat(full)
    assert full.returncode == 0, text
    assert "INCOMPLETE" not in text
    assert "53727" not in text  # Ray's actor-restart line is gone
    cells = [line for line in full.stdout.splitlines() if line.startswith("│ vt")]
    assert cells and "100.00" in cells[0] and "all too long" in cells[0]  # 1K scored; 16K never sent
    assert re.search(r"│ vt +│ +100\.00 │ all too long │.*\n│ +│ \[\d+–100\] n=2 │ +n=2 │", full.stdout)
    assert max(len(line) for line in full.stdout.splitlines()) > 80  # piped output is not cut at 80 columns
    page = tmp_path / "full.html"
    code, _, html = cli("report", str(tmp_path / "t"), "-o", str(page))
    assert code == 0, html
    text = page.read_text()
    assert 'class="failed"' in text and ">all too long<" in text and "INCOMPLETE" not in text
    assert "<th>n</th>" in text or ">n<" in text


@pytest.mark.ray
def test_preflight_runs_only_when_an_instance_shard_is_missing(finished_copy, monkeypatch):
    """Issue #22: a rerun with every planned shard there generates nothing, so its driver builds no preflight
    instance (the tokenizer, Punkt and the QA files: about 200 MB of a resumed driver's peak)."""
    from longeval.config import load_config
    from longeval.run import pipeline

    root, args = finished_copy
    cfg = load_config(args)
    tried: list[str] = []

    class Tried(Exception):
        pass

    def preflight(cfg, plan, model_path):
        tried.append(model_path)
        raise Tried  # before any Ray work: the run stops here

    monkeypatch.setattr(pipeline, "preflight", preflight)
    pipeline.run(cfg, stages=["generate"])  # every shard there: no preflight, no Ray
    assert tried == []
    root.remove_shard("instances", sorted(root.shard_names("instances"))[0])
    with pytest.raises(Tried):
        pipeline.run(cfg, stages=["generate"])
    assert len(tried) == 1
