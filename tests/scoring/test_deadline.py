"""Every scorer call has a deadline: a stalled scorer is cut, recorded as `scorer_timeout`, and the run completes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, Prediction
from longeval.scoring.deadline import DeadlineScorer
from longeval.store.run_root import RunRoot
from longeval.tasks import judge_for
from tests.cli_subprocess import REPO

PATHOLOGICAL = "Answer" + " " * 2000 + "?"  # the IDK output of issue 14: nested quantifiers take forever on it
PLUGIN = "plugins=[tests.scoring.slow_judge]"


# `longeval generate`, then (once the test has planted the predictions) `longeval run`, in one process of their own:
# the plugin registers its family where it is imported, which must not be this one, and the run reuses the Ray the
# generate started.
TWO_COMMANDS = """
import sys
from longeval.cli import main

common = sys.argv[1:]
code = main(["generate", *common])
print(f"@@ generate exited {code}", flush=True)
if code == 0:
    sys.stdin.readline()
    code = main(["run", *common])
sys.exit(code)
"""


@pytest.mark.ray
def test_a_stalled_scorer_is_cut_at_the_deadline_and_the_run_completes(tmp_path, smollm2_path):
    common = ["model=tiny_random", "suite.tasks=[slow_niah]", "suite.lengths=[1024]", "suite.samples=2",
              PLUGIN, f"store.root={tmp_path}", "run_name=slow", "cluster.scorer_timeout_s=3"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-c", TWO_COMMANDS, *common], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        generated = []
        while (line := proc.stdout.readline()) and not line.startswith("@@ generate exited"):
            generated.append(line)
        assert line.strip() == "@@ generate exited 0", "".join(generated)[-3000:] + line
        root = RunRoot(str(tmp_path / "slow"))
        ids = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "references"]).to_pylist()
        assert len(ids) == 2
        outputs = [PATHOLOGICAL, f"It is {ids[1]['references'][0]}."]
        preds = [Prediction(instance_id=row["instance_id"], model_id="tiny-random", output=out, output_tokens=5,
                            finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1, error="").to_row()
                 for row, out in zip(ids, outputs, strict=True)]
        root.write_part("predictions", pa.Table.from_pylist(preds, schema=PREDICTION_SCHEMA))

        started = time.monotonic()
        out, _ = proc.communicate("go\n", timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = " ".join(out.split())
    assert proc.returncode == 0, text[-3000:]
    assert time.monotonic() - started < 240
    scores = root.read_stage("scores", SCORE_SCHEMA)
    by_id = dict(zip(scores["instance_id"].to_pylist(), scores.to_pylist(), strict=True))
    stalled, fine = by_id[ids[0]["instance_id"]], by_id[ids[1]["instance_id"]]
    assert (stalled["error_type"], stalled["score"]) == ("scorer_timeout", 0.0)
    assert (fine["error_type"], fine["score"]) == ("", 1.0)
    assert "scorer_timeout" in text  # the error table counts it like any other failure
    assert "score" in text and "2/2" in text  # the scoring bar
    assert pc.sum(pc.equal(scores["error_type"], "scorer_timeout")).as_py() == 1


def test_the_deadline_scorer_goes_on_after_a_timeout_with_the_next_rows():
    """Three rows, the middle one stalls: the child is replaced and the third is still scored."""
    SLOW_METRIC = "slow_for_tests"  # the plugin's, not imported here: it would register its family in this process

    base = {name: None for name in INSTANCE_SCHEMA.names}
    rows = []
    for i, output in enumerate(["the ref", PATHOLOGICAL, "no"]):
        rows.append({**base, "instance_id": f"i{i}", "family": "slow_for_tests", "task": "slow_niah", "context_id": "",
                     "target_length": 1024, "input_tokens": 10, "depth": 0.5, "complexity": "", "answer_prefix": "",
                     "max_new_tokens": 8, "references": ["ref"], "metric": SLOW_METRIC, "meta": "", "seed": 1,
                     "shard_index": 0, "index": i, "generator_version": "", "tokenizer_id": "",
                     **Prediction(instance_id=f"i{i}", model_id="m", output=output, output_tokens=1,
                                  finish_reason="stop", cached_prompt_tokens=0, latency_s=0.0, error="").to_row()})
    scorer = DeadlineScorer(2.0, judge_for, ["tests.scoring.slow_judge"])
    try:
        out = scorer.score_rows(rows)
    finally:
        scorer.close()
    assert [(r["instance_id"], r["score"], r["error_type"]) for r in out] == [
        ("i0", 1.0, ""), ("i1", 0.0, "scorer_timeout"), ("i2", 0.0, "")]
    assert scorer.timeouts == 1
