"""The generate stage's driver side: preflight builds one small instance per task before any Ray work."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from longeval.config import load_config
from longeval.plan import ShardSpec, make_plan
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
