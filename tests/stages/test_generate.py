"""The generate stage's driver side: preflight builds one small instance per task before any Ray work."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from longeval.config import load_config
from longeval.planning.plan import ShardSpec, make_plan
from longeval.stages import generate
from longeval.stages.generate import PREFLIGHT_MAX_LENGTH, preflight


@pytest.mark.parametrize(("lengths", "built"), [
    ("[262144,1048576]", PREFLIGHT_MAX_LENGTH),  # a suite above 128K: built at 128K, never at 1M
    ("[2048,1048576]", 2048),  # the shortest length when it is shorter
])
def test_preflight_never_builds_above_128k_on_the_driver(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch, lengths: str, built: int
) -> None:
    cfg = load_config(["model=tiny_random", "suite.tasks=[vt,niah_single_1]", f"suite.lengths={lengths}",
                       "suite.samples=2", "suite.allow_too_long=true"])
    specs: list[ShardSpec] = []
    real = generate.generate_shard

    def recording(ctx, spec: ShardSpec) -> pa.Table:
        specs.append(spec)
        return real(ctx, spec)

    monkeypatch.setattr(generate, "generate_shard", recording)
    preflight(cfg, make_plan(cfg), str(tiny_model_path))
    assert sorted((s.task, s.target_length, s.stop - s.start) for s in specs) == [
        ("ruler/niah_single_1", built, 1), ("ruler/vt", built, 1)]


def test_a_generation_actor_hands_back_what_each_shard_freed(tmp_path, monkeypatch, tiny_model_path) -> None:
    """A shard's rows are Python objects until it is written: an actor that kept what they freed held about 150
    MiB more after each shard of ten 1M-token prompts (benchmarks/README.md, sizing_figures.py)."""
    import numpy as np

    from longeval.config import load_config
    from longeval.planning.plan import make_plan
    from longeval.stages import generate

    calls: list[int] = []
    monkeypatch.setattr(generate, "release_freed_memory", lambda: calls.append(1))
    cfg = load_config(["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=3",
                       "suite.shard_size=1", f"store.root={tmp_path}", "run_name=r"])
    rows = [s.to_row() for s in make_plan(cfg).shards]
    out = generate.ShardGenerator(cfg, str(tiny_model_path), cfg.run_root)(
        {k: np.array([r[k] for r in rows]) for k in rows[0]})
    assert out["instances"] == [1, 1, 1] and len(calls) == 3  # once per shard written


def test_a_small_generation_starts_one_actor_and_a_large_one_up_to_the_parallelism() -> None:
    """An actor's start costs more than a small suite's whole generation: one actor per `ACTOR_WORTH_CPU_S` of
    work as the plan estimates it, one per shard at most, `cluster.generate_parallelism` at most."""
    from longeval.stages.generate import ACTOR_WORTH_CPU_S, generation_actors, generation_cpu_s

    small = make_plan(load_config(["suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,2048]", "suite.samples=8",
                                   "suite.shard_size=2"])).shards
    assert len(small) == 16 and generation_cpu_s(list(small)) < ACTOR_WORTH_CPU_S
    assert generation_actors(load_config([]), list(small)) == 1
    large_cfg = load_config(["model=llama31_8b", "suite.tasks=[cwe]", "suite.lengths=[131072]", "suite.samples=5000",
                             "suite.shard_size=25", "cluster.generate_parallelism=8"])
    large = list(make_plan(large_cfg).shards)
    assert generation_cpu_s(large) > 8 * ACTOR_WORTH_CPU_S  # cwe at 128K: 34 ms an instance
    assert generation_actors(large_cfg, large) == 8
    assert generation_actors(large_cfg, large[:3]) <= 3  # never more than a shard each


def test_a_worker_keeps_its_generator_for_the_run_and_builds_the_next_runs(tmp_path, monkeypatch,
                                                                          tiny_model_path) -> None:
    """`generate_shards` runs as a Ray task in a pooled worker: the shards of one run share one generator (the
    tokenizer, the encoded corpora), and the next run's first task replaces it."""
    import numpy as np

    built: list[str] = []
    real = generate.ShardGenerator

    class Recording(real):  # the real generator, counted
        def __init__(self, cfg, model_path, root_uri):
            built.append(root_uri)
            super().__init__(cfg, model_path, root_uri)

    monkeypatch.setattr(generate, "ShardGenerator", Recording)
    generate.release_kept()
    for run in ("a", "a", "b"):
        cfg = load_config(["model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=2",
                           "suite.shard_size=1", f"store.root={tmp_path}", f"run_name={run}"])
        for row in (s.to_row() for s in make_plan(cfg).shards):
            out = generate.generate_shards({k: np.array([v]) for k, v in row.items()}, cfg=cfg,
                                           model_path=str(tiny_model_path), root_uri=cfg.run_root)
            assert out["instances"] == [1]
    assert [Path(uri).name for uri in built] == ["a", "b"]  # four shards of run a, two of run b
    assert isinstance(generate.kept_generator(), Recording)
    generate.release_kept()
    assert generate.kept_generator() is None
