"""The score stage (`longeval.stages.score`): each scorer reads its own instance shard's inputs, so the driver holds
score rows only, whatever the predictions weigh; parts not merged yet still reach the right shard (the driver
reads only their ids); the scores equal those of the whole root scored at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longeval.cluster.ray_runtime import init_ray
from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, Prediction
from longeval.scoring.deadline import DeadlineScorer
from longeval.stages.score import score, scoring_input, scoring_units
from longeval.store.compact import compact_predictions
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName
from longeval.tasks import judge_for

ROWS = 4
SHARDS = [ShardName("ruler", "niah_single_1", 4096, 42, i) for i in range(3)]
OUTPUT_BYTES = 2_000_000  # per prediction: 24 MB of outputs in all
OVERRIDES = ["model=tiny_random", "suite.tasks=[niah_single_1]", "suite.lengths=[4096]", f"suite.samples={2 * ROWS}",
             f"suite.shard_size={ROWS}"]  # plans the first two shards: the third is outside the plan


def _rchar() -> int:
    """Bytes this process has read through read(2)/pread(2) so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _root(path: Path, *, compact: bool, output_bytes: int = OUTPUT_BYTES) -> RunRoot:
    """Three instance shards and a prediction each, outputs of 2 MB (random, so they do not compress), every
    other one holding the needle; written as two parts, merged per shard when `compact`."""
    root = RunRoot(str(path))
    rng = np.random.default_rng(0)
    for shard in SHARDS:
        rows = [{"instance_id": f"{shard.shard_index}-{i}", "family": shard.family, "task": shard.task,
                 "context_id": f"{shard.shard_index}-{i}", "target_length": shard.target_length,
                 "input_tokens": 4096, "max_new_tokens": 128, "seed": shard.seed, "shard_index": shard.shard_index,
                 "index": shard.shard_index * ROWS + i, "prompt": "", "prompt_token_ids": [1, 2, 3],
                 "references": ["1234567"], "meta": "{}", "metric": "string_match_all"} for i in range(ROWS)]
        root.write_table("instances", shard.text, pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA))
    preds = [Prediction(instance_id=f"{s.shard_index}-{i}", model_id="m", output_tokens=3, finish_reason="stop",
                        output=("1234567 " if i % 2 == 0 else "") + rng.bytes(output_bytes // 2).hex(),
                        cached_prompt_tokens=0, latency_s=0.1).to_row()
             for s in SHARDS for i in range(ROWS)]
    half = len(preds) // 2
    for rows in (preds[:half], preds[half:]):  # the middle shard's rows lie in both parts
        root.write_part("predictions", pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA))
    if compact:
        compact_predictions(root)
    return root


def _config(root: RunRoot):
    return load_config([*OVERRIDES, f"store.root={root.local_path().parent}", f"run_name={root.local_path().name}"])


def test_unmerged_parts_are_routed_to_the_shards_whose_rows_they_hold(tmp_path: Path) -> None:
    root = _root(tmp_path / "run", compact=False)
    parts = sorted(root.shard_names("predictions"))
    units = scoring_units(_config(root), root)
    assert [u.instances for u in units] == [(SHARDS[0].text,), (SHARDS[1].text,)]  # the third is not planned
    first, second = (set(u.predictions) for u in units)
    holds = {p: set(root.read_shard("predictions", p, PREDICTION_SCHEMA)["instance_id"].to_pylist()) for p in parts}
    assert first == {p for p in parts if any(i.startswith("0-") for i in holds[p])}
    assert second == set(parts) and len(parts) == 2  # shard 1's rows are split over both parts


def test_merged_predictions_are_found_by_name_without_reading_them(tmp_path: Path) -> None:
    root = _root(tmp_path / "run", compact=True)
    before = _rchar()
    units = scoring_units(_config(root), root)
    assert _rchar() - before < 100_000
    for unit, shard in zip(units, SHARDS, strict=False):
        assert unit.instances == (shard.text,) and len(unit.predictions) == 1
        assert unit.predictions[0].startswith(shard.prefix + ".p")


@pytest.mark.parametrize("compact", [True, False], ids=["merged", "parts"])
@pytest.mark.ray
def test_the_driver_reads_no_outputs_and_scores_equal_the_whole_root_scored_at_once(tmp_path: Path,
                                                                                   compact: bool) -> None:
    root = _root(tmp_path / "run", compact=compact)
    cfg = _config(root)
    init_ray(cfg)
    warm_up = _root(tmp_path / "warm", compact=compact, output_bytes=10)
    score(_config(warm_up), warm_up)  # Ray Data imports its modules on first use: not the stage's reads
    outputs = ROWS * len(SHARDS) * OUTPUT_BYTES
    before = _rchar()
    scores = score(cfg, root)
    read = _rchar() - before
    assert read < 0.02 * outputs, f"the driver read {read:,} bytes; the outputs are {outputs:,}"
    whole = DeadlineScorer(30.0, judge_for).score_rows(scoring_input(cfg, root).to_pylist())
    expected = pa.Table.from_pylist(whole, schema=SCORE_SCHEMA).sort_by("instance_id")
    got = scores.sort_by("instance_id")
    assert got.num_rows == 2 * ROWS and got["instance_id"].to_pylist() == expected["instance_id"].to_pylist()
    assert got["score"].to_pylist() == expected["score"].to_pylist() == [1.0, 0.0] * ROWS
    assert root.read_stage("scores", SCORE_SCHEMA).sort_by("instance_id").equals(got)


def test_a_worker_keeps_its_scoring_child_across_runs_with_the_same_deadline(tmp_path: Path) -> None:
    """`score_units` runs as a Ray task in a pooled worker: the next run's units get a scorer of their own, and
    the child process that runs the judges is kept while the deadline and the plugins stay the same."""
    import psutil

    from longeval.stages import score as stage

    stage.release_kept()
    children = []
    for run, timeout in (("a", 30), ("b", 30), ("c", 20)):
        root = _root(tmp_path / run, compact=True, output_bytes=10)
        cfg = load_config([*OVERRIDES, f"store.root={tmp_path}", f"run_name={run}",
                           f"cluster.scorer_timeout_s={timeout}"])
        [unit, *_] = scoring_units(cfg, root)
        batch = pa.Table.from_pylist([{"instances": list(unit.instances), "predictions": list(unit.predictions),
                                       "instance_sizes": list(unit.instance_sizes)}])
        scores = stage.score_units(batch, cfg=cfg, root=root)
        assert scores["score"].to_pylist() == [1.0, 0.0, 1.0, 0.0]
        kept = stage.kept_scorer()
        assert kept is not None and kept.scorer.pid is not None
        children.append(kept.scorer.pid)
    assert children[0] == children[1]  # run b: the same child
    assert children[2] != children[0] and not psutil.pid_exists(children[0])  # a new deadline: the old one stopped
    stage.release_kept()
    assert stage.kept_scorer() is None and not psutil.pid_exists(children[2])
