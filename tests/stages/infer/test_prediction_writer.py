"""The replica's prediction writer: a part per commit interval, not per row, and never more than the interval's
finished rows uncommitted (what a kill -9 can lose). No Ray, no engine: the writer thread on a local root."""

from __future__ import annotations

import time

from longeval.records import PREDICTION_SCHEMA, Prediction
from longeval.stages.infer import PredictionWriter
from longeval.store.run_root import RunRoot


def _rows(start: int, n: int) -> list[dict]:
    return [Prediction(instance_id=f"i{k}", model_id="", output="x", output_tokens=1, finish_reason="stop",
                       cached_prompt_tokens=0, latency_s=0.0).to_row() for k in range(start, start + n)]


def _committed(root: RunRoot) -> int:
    return root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"]).num_rows


def test_rows_finished_within_an_interval_make_one_part(tmp_path) -> None:
    root = RunRoot(str(tmp_path))
    writer = PredictionWriter(root, extra={"model_id": "m", "replica": "r0", "node": "n"}, interval_s=2.0)
    began = time.monotonic()
    for k in range(20):  # 20 rows finishing over ~0.4 s, as an engine's steps hand them over
        writer.put(_rows(k, 1))
        time.sleep(0.02)
    assert writer.finished == 20
    assert _committed(root) == 0 or time.monotonic() - began >= 2.0  # nothing before the interval ends
    deadline = began + 10.0
    while _committed(root) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _committed(root) == 20, "finished rows waited for the writer's close, not its interval"
    assert writer.close() == 20 and writer.parts == 1
    assert len(root.shard_names("predictions")) == 1


def test_closing_commits_what_is_left_at_once(tmp_path) -> None:
    root = RunRoot(str(tmp_path))
    writer = PredictionWriter(root, extra={"model_id": "m", "replica": "r0", "node": "n"}, interval_s=3600.0)
    writer.put(_rows(0, 3))
    began = time.monotonic()
    assert writer.close() == 3 and _committed(root) == 3
    assert time.monotonic() - began < 3600.0 / 10  # it did not wait for the interval to end


def test_an_interval_of_zero_commits_every_hand_over(tmp_path) -> None:
    root = RunRoot(str(tmp_path))
    writer = PredictionWriter(root, extra={"model_id": "m", "replica": "r0", "node": "n"}, interval_s=0.0)
    for k in range(3):
        writer.put(_rows(k, 1))
        deadline = time.monotonic() + 5.0
        while _committed(root) < k + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _committed(root) == k + 1
    assert writer.close() == 3 and writer.parts == 3
