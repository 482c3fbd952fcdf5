"""Reports that cannot be stale: scores are checked against the predictions they scored and against the plan, and
`report`, `compare` and status.json say what is stale, missing or partial (issue #24).

The runs are real (local Ray, the stand-in engine, the real scorer); each test changes a copy of one scored run
the way a user's run root gets into that state.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from longeval.cli import main
from longeval.config import load_config
from longeval.records import PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.consistency import PARTIAL_EXIT, Consistency, State, check_consistency, prediction_fingerprints
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot

SUITE = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]",
         "suite.samples=3", "suite.shard_size=2", "store.cache_instances=false", "cluster.commit_interval_s=0"]
ONE_CELL = "ruler.vt.L2048."
"""The instance shards (and their prediction shards) of one task x length: 3 of the run's 12 instances."""


@pytest.fixture(scope="module")
def scored(tmp_path_factory, tiny_model_path) -> Path:
    """A complete, current run: 2 tasks x 2 lengths x 3 samples, predicted, scored and summarised."""
    base = tmp_path_factory.mktemp("consistency")
    run(load_config([*SUITE, f"store.root={base}", "run_name=pristine"]))
    return base / "pristine"


@pytest.fixture
def copy(scored: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """A fresh copy of the scored run, and the overrides that name it."""
    shutil.copytree(scored, tmp_path / "run")
    return tmp_path / "run", [*SUITE, f"store.root={tmp_path}", "run_name=run"]


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def _drop_cell_predictions(root: RunRoot) -> list[str]:
    """Delete the committed prediction shards of ONE_CELL (as a user deleting files, or a shard set aside)."""
    gone = sorted(n for n in root.shard_names("predictions") if n.startswith(ONE_CELL))
    for name in gone:
        root.remove_shard("predictions", name)
    assert len(gone) == 2
    return gone


# -- the check itself (pure) ------------------------------------------------------------------------------------


def _preds(*rows: tuple[str, float, str]) -> pa.Table:
    return pa.Table.from_pylist([{"instance_id": i, "model_id": "m", "output": "", "output_tokens": 1,
                                  "finish_reason": "stop", "cached_prompt_tokens": 0, "latency_s": latency,
                                  "error": error} for i, latency, error in rows], schema=PREDICTION_SCHEMA)


def _scores(*rows: tuple[str, str | None]) -> pa.Table:
    return pa.table({"instance_id": [i for i, _ in rows], "prediction_fingerprint": [f for _, f in rows]},
                    schema=pa.schema([SCORE_SCHEMA.field("instance_id"), SCORE_SCHEMA.field("prediction_fingerprint")]))


def test_each_score_is_checked_against_its_instance_latest_prediction() -> None:
    first = _preds(("a", 0.1, ""), ("b", 0.2, ""), ("c", 0.3, "engine_error: boom"), ("d", 0.4, ""))
    fa, fb, fc, fd = prediction_fingerprints(first).to_pylist()
    assert len({fa, fb, fc, fd}) == 4 and prediction_fingerprints(first).to_pylist() == [fa, fb, fc, fd]
    retried = pa.concat_tables([first, _preds(("c", 0.5, ""))])  # c's engine error retried after scoring
    check = check_consistency({"a", "b", "c", "d", "e"}, set(), retried,
                              _scores(("a", fa), ("b", None), ("c", fc), ("x", "?")),
                              shards_planned=3, shards_written=3)
    assert check == Consistency(shards_planned=3, shards_written=3, instances=5, predicted=4, engine_errors=0,
                                not_predicted=1, scored=3, not_scored=1, stale_scores=1, scores_without_prediction=0,
                                unverified_scores=1, outside_plan=1)
    assert check.state is State.STALE and not check.complete
    line = check.one_line("ROOT")
    assert line.startswith("stale scores in ROOT: 1 scores are stale (their prediction changed after scoring); ")
    assert "1 predictions are not scored" in line and "1 scores predate prediction fingerprints" in line
    assert "\n" not in line


def test_a_current_run_says_nothing_and_a_partial_one_says_what_is_missing() -> None:
    preds = _preds(("a", 0.1, ""), ("b", 0.2, ""))
    fa, fb = prediction_fingerprints(preds).to_pylist()
    current = check_consistency({"a", "b"}, set(), preds, _scores(("a", fa), ("b", fb)),
                                shards_planned=1, shards_written=1)
    assert current.state is State.CURRENT and current.complete and current.one_line("ROOT") == ""
    partial = check_consistency({"a", "b", "c"}, set(), preds, _scores(("a", fa)), shards_planned=2, shards_written=1)
    assert partial.state is State.PARTIAL
    assert partial.one_line("ROOT") == (
        "partial run ROOT: 1 of 2 planned instance shards are missing; 1 of 3 instances are not predicted (0 engine "
        "errors, 1 not run yet); 1 predictions are not scored; the numbers cover 1 of 3 instances. Rerun the same "
        "command to finish (`longeval run` with the run's overrides; finished work is kept)")


# -- the four situations of issue #24, on real run roots --------------------------------------------------------


@pytest.mark.ray


@pytest.mark.engine
def test_a_complete_current_run_reports_exit_0(capsys, copy, tmp_path) -> None:
    path, overrides = copy
    code, text = _cli(capsys, "report", *overrides)
    assert code == 0 and "warning" not in text, text
    status = RunRoot(str(path)).read_json("status.json")
    assert status["state"] == "current" and status["complete"] and status["scored"] == 12
    code, text = _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert code == 0 and 'class="banner"' not in (tmp_path / "r.html").read_text(), text


@pytest.mark.ray


@pytest.mark.engine
def test_scores_of_predictions_redone_after_scoring_are_refused(capsys, copy, tmp_path) -> None:
    """A kill during a re-score: the predictions changed (redone by `infer`), the scores did not."""
    path, overrides = copy
    root = RunRoot(str(path))
    old = root.read_stage("scores", SCORE_SCHEMA)
    _drop_cell_predictions(root)
    run(load_config(overrides), stages=("infer",))  # new predictions for the cell; then no `score` (killed)
    assert root.read_stage("scores", SCORE_SCHEMA).equals(old)
    stale = (f"error: stale scores in {root.uri}: 3 scores are stale (their prediction changed after scoring); no "
             "numbers reported. Run `longeval run` with the run's overrides to predict and rescore what changed "
             "(finished work is kept)")
    code, text = _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert (code, text) == (2, stale) and not (tmp_path / "r.html").exists()
    code, text = _cli(capsys, "report", *overrides)
    assert code == 2 and text.endswith(stale), text
    assert root.read_json("status.json")["state"] == "stale" and root.read_json("status.json")["stale_scores"] == 3
    assert _cli(capsys, "compare", str(path), str(path)) == (2, stale)
    # the fix the line names: rescore; the report is then current again
    code, text = _cli(capsys, "run", *overrides)
    assert code == 0, text
    assert _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))[0] == 0


@pytest.mark.ray


@pytest.mark.engine
def test_predictions_made_after_scoring_make_the_report_partial(capsys, copy, tmp_path) -> None:
    """`score` on a partial root, then `infer`: the report must not summarise the old scores as the whole run."""
    path, overrides = copy
    root = RunRoot(str(path))
    _drop_cell_predictions(root)
    cfg = load_config(overrides)
    run(cfg, stages=("score",))
    assert root.read_stage("scores", SCORE_SCHEMA).num_rows == 9
    run(cfg, stages=("infer",))
    code, text = _cli(capsys, "report", *overrides)
    partial = (f"warning: partial run {root.uri}: 3 predictions are not scored; the numbers cover 9 of 12 instances. "
               "Rerun the same command to finish (`longeval run` with the run's overrides; finished work is kept)")
    assert code == PARTIAL_EXIT and partial in text, text
    status = root.read_json("status.json")
    assert (status["complete"], status["state"], status["predicted"], status["scored"]) == (False, "partial", 12, 9)
    code, text = _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert code == PARTIAL_EXIT and partial in text, text
    page = (tmp_path / "r.html").read_text()
    assert '<p class="banner" role="alert">tiny-random: partial run' in page and "3 predictions are not scored" in page


@pytest.mark.ray


@pytest.mark.engine
def test_summaries_older_than_the_scores_are_computed_again(capsys, copy, tmp_path) -> None:
    """`report` on a partial root, then `infer` and `score` alone: `report -o` must not show the old summaries."""
    path, overrides = copy
    root = RunRoot(str(path))
    _drop_cell_predictions(root)
    cfg = load_config(overrides)
    run(cfg, stages=("score", "report"))
    assert sum(root.read_stage("summary", names=["tasks"])["n"].to_pylist()) == 9
    run(cfg, stages=("infer", "score"))
    code, text = _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert code == 0 and f"tiny-random: summaries computed from the scores and written to {root.uri}/summary/" in text
    assert sum(root.read_stage("summary", names=["tasks"])["n"].to_pylist()) == 12
    assert _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))[1].count("summaries computed") == 0


@pytest.mark.ray


@pytest.mark.engine
def test_scores_whose_predictions_shard_was_deleted_are_refused(capsys, copy, tmp_path) -> None:
    path, overrides = copy
    root = RunRoot(str(path))
    _drop_cell_predictions(root)
    stale = (f"error: stale scores in {root.uri}: 3 scores have no prediction (its shard is gone); 3 of 12 instances "
             "are not predicted (0 engine errors, 3 not run yet); no numbers reported. Run `longeval run` with the "
             "run's overrides to predict and rescore what changed (finished work is kept)")
    code, text = _cli(capsys, "report", str(path), "-o", str(tmp_path / "r.html"))
    assert (code, text) == (2, stale) and not (tmp_path / "r_files").exists()
    assert _cli(capsys, "compare", str(path), str(path)) == (2, stale)
    code, text = _cli(capsys, "report", *overrides)
    assert code == 2 and text.endswith(stale), text
    assert root.read_json("status.json")["scores_without_prediction"] == 3


@pytest.mark.ray


@pytest.mark.engine
def test_status_counts_only_the_current_plan_on_a_reused_root(capsys, copy, scored) -> None:
    path, overrides = copy
    fewer = [o if not o.startswith("suite.tasks=") else "suite.tasks=[niah_single_1]" for o in overrides]
    code, text = _cli(capsys, "report", *fewer)
    assert code == 0, text
    status = RunRoot(str(path)).read_json("status.json")
    assert (status["instances"], status["predicted"], status["scored"], status["outside_plan"]) == (6, 6, 6, 6)
    assert status["shards_planned"] == status["shards_written"] == 4 and status["complete"]
    code, text = _cli(capsys, "compare", str(path), str(scored), "--resamples", "100")  # config.yaml: the new plan
    assert code == 0 and "matched 6 instance(s) by instance_id: 0 of A's 6 and 6 of B's 12 have no partner" in text, \
        text


@pytest.mark.ray


@pytest.mark.engine
def test_scores_from_before_fingerprints_are_partial_until_rescored(capsys, copy) -> None:
    """An older root's score rows have no `prediction_fingerprint`: reported, flagged, and redone by `score`."""
    path, overrides = copy
    root = RunRoot(str(path))
    old = root.read_stage("scores").drop_columns(["prediction_fingerprint"])
    root.write_table("scores", "scores", old)
    root.delete("scores_input.json")  # an older longeval's input fingerprint is not this one's
    code, text = _cli(capsys, "report", *overrides)
    assert code == PARTIAL_EXIT and "12 scores predate prediction fingerprints and cannot be checked" in text, text
    run(load_config(overrides), stages=("score",))
    assert root.read_stage("scores", SCORE_SCHEMA)["prediction_fingerprint"].null_count == 0
    assert _cli(capsys, "report", *overrides)[0] == 0


def test_the_exit_codes_are_in_the_help(capsys) -> None:
    for command in ("report", "compare", "run"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert f"{PARTIAL_EXIT} results partial" in text and "2 error, stale scores included" in text, command
