"""TAIL on real parts: `longeval tail build` with the tiny random model on vLLM CPU and the real MiniLM embedder,
and `longeval run suite=tail` on a benchmark in the built format. The tiny model's questions never parse, so
the build exercises Algorithm 1's failure path: every attempt recorded with its reason, the fall-back to the
preceding segment, and resume."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longeval.cli import main
from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA
from longeval.run.pipeline import run
from longeval.store.run_root import RunRoot
from tests.tasks.tail.tail_helpers import build_dataset, domain_of, report

pytestmark = pytest.mark.engine


@pytest.mark.ray
def test_build_records_every_attempt_and_resumes(tmp_path, tiny_model_path, capsys):
    docs = tmp_path / "docs"
    for name, sentences in (("finance", 160), ("law", 150)):  # about 2,000 words: a few 600-word segments
        (docs / name).mkdir(parents=True)
        (docs / name / f"{name}.txt").write_text(report(name, sentences))
    out = tmp_path / "bench"
    args = ["tail", "build", str(docs), str(out), "--depths", "0.5", "--max-attempts", "2", "--question-tokens",
            "24", "model=tiny_random"]
    assert main(args) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out
    attempts = pq.read_table(out / "build" / "attempts.parquet").to_pylist()
    assert attempts and all(a["reason"] for a in attempts)  # junk never passes: every attempt says why
    for domain in ("finance", "law"):
        mine = [a for a in attempts if a["domain"] == domain]
        segments = [a["segment"] for a in mine]
        assert segments == sorted(segments, reverse=True)  # Algorithm 1 moves to the preceding segment
        assert all(sum(1 for a in mine if a["segment"] == s) == 2 for s in set(segments))  # 2 attempts each
        assert segments[-1] == 0 and {a["outcome"] for a in mine} == {"exhausted"}
    assert "0 questions (2 depths without one)" in printed
    assert (out / "manifest.json").exists() and pq.read_table(out / "questions.parquet").num_rows == 0
    # a rerun resumes from the saved slots: all finished, nothing is sent again
    assert main(args) == 0
    assert "in 0 rounds" in capsys.readouterr().out


@pytest.mark.ray
def test_run_evaluates_a_built_benchmark_per_depth_and_length(tmp_path, tiny_model_path):
    bench = build_dataset(tmp_path / "bench", [domain_of("finance", 900), domain_of("law", 900)], (0.25, 0.75))
    cfg = load_config(["model=tiny_random", "suite=tail", "suite.lengths=[2048,4096]", "suite.samples=4",
                       "suite.shard_size=4", f"suite.params.tail.dataset={bench}",
                       "suite.params.tail.depths=[0.25,0.75]", "suite.params.tail.cot=false", f"store.root={tmp_path}"])
    result = run(cfg)
    instances = RunRoot(cfg.run_root).read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    assert len(instances) == 8 and all(i["input_tokens"] + i["max_new_tokens"] <= i["target_length"]
                                       for i in instances)
    grid = result.tables["tail_grid"].to_pylist()
    assert {(c["target_length"], c["depth"]) for c in grid} == {(n, d) for n in (2048, 4096) for d in (25.0, 75.0)}
    assert all(c["n"] == 2 for c in grid)
    (head,) = result.tables["tail_headline"].to_pylist()
    assert (head["shortest"], head["longest"]) == (2048, 4096)
    assert head["avg"] is not None and 0 <= head["avg"] <= 100


@pytest.mark.ray
def test_the_judge_maps_what_the_parser_cannot(tmp_path, tiny_model_path):
    """The tiny model's junk answers are unmapped: each gets a judge call, and only the judge's call is scored."""
    import json

    from longeval.records import SCORE_SCHEMA

    bench = build_dataset(tmp_path / "bench", [domain_of("finance", 900), domain_of("law", 900)], (0.25, 0.75))
    cfg = load_config(["model=tiny_random", "suite=tail", "suite.lengths=[2048]", "suite.samples=4",
                       "suite.shard_size=4", f"suite.params.tail.dataset={bench}",
                       "suite.params.tail.depths=[0.25,0.75]", "suite.params.tail.cot=false",
                       "+suite.params.tail.judge=true", f"store.root={tmp_path}"])
    result = run(cfg)
    root = RunRoot(cfg.run_root)
    instances = root.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    judged = [i for i in instances if json.loads(i["meta"]).get("mapped_by") == "judge"]
    firsts = [i for i in instances if i not in judged]
    assert len(firsts) == 4 and 1 <= len(judged) <= 4
    scores = root.read_stage("scores", SCORE_SCHEMA).to_pylist()
    assert len(scores) == 4  # every question counts once: its judge call when it had one, else its first call
    judged_ids = {i["instance_id"] for i in judged}
    (head,) = result.tables["tail_headline"].to_pylist()
    assert head["answers"] == 4 and head["judged"] == len(judged_ids)
    assert head["judge_mapped"] == sum(1 for s in scores if s["instance_id"] in judged_ids
                                       and s["error_type"] != "unmapped")
    assert result.status["complete"]
    # one engine ran the answers and the judge's calls (a pool is sized from its first calls)
    [record] = [json.loads(p.read_text()) for p in (Path(cfg.run_root) / "engines").glob("*.json")]
    assert record["stats"]["runs"] == 2, record["stats"]
