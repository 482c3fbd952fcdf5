"""`longeval mrcr build-pool` on real parts: the tiny random model on vLLM CPU writes a small pool, and MRCR
instances are then drawn from it (the writings are junk; the plumbing and provenance are what is checked)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from longeval.builders.mrcr_pool import pool_requests
from longeval.cli import main


def test_requests_are_distinct_and_deterministic():
    first = pool_requests(per_key=3, seed=5, topics=2)
    assert len(first) == 2 * 8 * 3
    assert len({req.text for _, _, req in first}) == len(first)  # greedy decoding needs distinct requests
    assert [r.text for _, _, r in first] == [r.text for _, _, r in pool_requests(per_key=3, seed=5, topics=2)]
    assert [r.text for _, _, r in first] != [r.text for _, _, r in pool_requests(per_key=3, seed=6, topics=2)]
    assert all(req.text.startswith(f"Write a{'n' if fmt[0] in 'aeiou' else ''} {fmt} about {topic}.")
               for fmt, topic, req in first)


@pytest.mark.engine
@pytest.mark.ray
def test_built_pool_feeds_mrcr_instances(tmp_path, tiny_model_path, capsys):
    out = tmp_path / "pool.parquet"
    code = main(["mrcr", "build-pool", str(out), "--per-key", "2", "--topics", "2", "--max-new-tokens", "48",
                 "model=tiny_random"])
    assert code == 0, capsys.readouterr().out
    table = pq.read_table(out)
    info = json.loads(table.schema.metadata[b"longeval_pool"])
    assert info["model_id"] == "tiny-random" and info["seed"] == 0
    assert 0 < table.num_rows <= 32 and set(table["model_id"].to_pylist()) == {"tiny-random"}

    from longeval.config import load_config
    from longeval.planning.plan import ShardSpec
    from longeval.stages.generate import generate_shard, make_context

    cfg = load_config(["model=tiny_random", "suite=michelangelo_quick", f"+suite.params.mrcr.pool_path={out}",
                       "+suite.params.mrcr.needles=[2]", "+suite.params.mrcr.near_misses=2"])
    ctx = make_context(cfg, str(tiny_model_path))
    rows = generate_shard(ctx, ShardSpec("michelangelo/mrcr", 4096, 42, 0, 0, 2)).to_pylist()
    by_key: dict[tuple[str, str], set[str]] = {}
    for f, t, x in zip(table["format"].to_pylist(), table["topic"].to_pylist(), table["text"].to_pylist(), strict=True):
        by_key.setdefault((f, t), set()).add(x)
    for row in rows:
        meta = json.loads(row["meta"])
        assert meta["pool"] == "longeval-pool:tiny-random@seed0"
        assert row["references"][0] in by_key[(meta["format"], meta["topic"])]  # the needle is the model's writing
        assert row["references"][0] in row["prompt"]
