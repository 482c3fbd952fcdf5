"""A run reads as complete only when every planned shard and every instance's prediction is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.cli import main
from longeval.config import load_config
from longeval.run.consistency import PARTIAL_EXIT
from longeval.run.pipeline import run
from longeval.stages.summarise import run_status
from longeval.store.run_root import RunRoot

TINY = ["model=tiny_random", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]", "suite.samples=3",
        "suite.shard_size=2"]


@pytest.mark.ray
def test_a_run_without_predictions_reports_itself_incomplete(tmp_path: Path, tiny_model_path: Path, capsys) -> None:
    args = [*TINY, f"store.root={tmp_path}", "run_name=partial"]
    cfg = load_config(args)
    result = run(cfg, stages=("generate", "score", "report"))
    assert result.status == {"complete": False, "state": "partial", "shards_planned": 2, "shards_written": 2,
                             "instances": 3, "predicted": 0, "engine_errors": 0, "not_predicted": 3, "scored": 0,
                             "not_scored": 0, "stale_scores": 0, "scores_without_prediction": 0,
                             "unverified_scores": 0, "outside_plan": 0}
    root = RunRoot(cfg.run_root)
    assert root.read_json("status.json") == result.status
    # one instance shard gone (its commit record deleted): the plan says what is missing
    (tmp_path / "partial" / "_manifest" / "instances" / "ruler.niah_single_1.L1024.s42.00001.json").unlink()
    assert run_status(cfg, root)["shards_written"] == 1
    assert main(["report", *args]) == PARTIAL_EXIT
    out = " ".join(capsys.readouterr().out.split())
    assert (f"warning: partial run {root.uri}: 1 of 2 planned instance shards are missing; 2 of 2 instances are not "
            "predicted (0 engine errors, 2 not run yet); the numbers cover 0 of 2 instances. Rerun the same command "
            "to finish") in out
