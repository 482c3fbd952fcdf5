"""Instance shards are cached by content and reused across runs and models that share a tokenizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from longeval.config import load_config
from longeval.instance_cache import cache_uri, path_fingerprint, shard_key
from longeval.models import resolve_model_path
from longeval.plan import make_plan
from longeval.records import INSTANCE_SCHEMA
from longeval.stages.generate import ShardGenerator, make_context
from longeval.store import RunRoot
from longeval.tasks import TASKS
from longeval.tasks.base import GENERATOR_VERSION
from longeval.tasks.ruler.templates import TEMPLATES, prompt_fingerprint

TINY = ["suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024]", "suite.samples=3", "suite.shard_size=2"]


def _generate(*overrides: str) -> tuple[list[bool], RunRoot]:
    """Run the generate stage's actor callable on every shard of the plan (no Ray needed)."""
    cfg = load_config([*TINY, *overrides])
    model_path = str(resolve_model_path(cfg.model.path))
    generator = ShardGenerator(cfg, model_path, cfg.run_root)
    rows = [s.to_row() for s in make_plan(cfg).shards]
    batch = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    return list(generator(batch)["cached"]), RunRoot(cfg.run_root)


def test_a_second_run_and_a_second_model_read_the_cache(tmp_path: Path, tiny_model_path: Path) -> None:
    first, root_a = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=a")
    assert first == [False] * 4
    assert len(RunRoot(cache_uri(str(tmp_path), None)).shard_names("instances")) == 4
    again, root_b = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=b")
    assert again == [True] * 4
    a = root_a.read_stage("instances", INSTANCE_SCHEMA)
    assert a.equals(root_b.read_stage("instances", INSTANCE_SCHEMA))
    # SmolLM2 shares the tiny model's tokenizer and chat template: same instances, from the cache
    other_model, root_c = _generate("model=smollm2_cpu", f"store.root={tmp_path}", "run_name=c")
    assert other_model == [True] * 4
    assert a.equals(root_c.read_stage("instances", INSTANCE_SCHEMA))


def test_anything_that_changes_the_rows_changes_the_key(tmp_path: Path, tiny_model_path: Path) -> None:
    _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=a")
    for k, change in enumerate(("suite.seed=7", "model.chat_template=false", "model.system_prompt=brief")):
        cached, _ = _generate("model=tiny_random", f"store.root={tmp_path}", f"run_name=c{k}", change)
        assert not any(cached), change
    # a parameter of one task: only that task's shards are generated again
    cached, _ = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=hops", "+suite.params.vt.num_hops=2")
    assert cached == [True, True, False, False]


def test_cache_can_be_turned_off_or_moved(tmp_path: Path, tiny_model_path: Path) -> None:
    _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=a", "store.cache_instances=false")
    assert not (tmp_path / "_cache").exists()
    elsewhere = tmp_path / "shared-cache"
    _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=b", f"store.instance_cache={elsewhere}")
    assert len(RunRoot(str(elsewhere)).shard_names("instances")) == 4


def test_files_named_by_parameters_enter_the_key_by_content(tmp_path: Path, tiny_model_path: Path) -> None:
    data = tmp_path / "pool.parquet"
    data.write_bytes(b"one")
    before = path_fingerprint(data)
    data.write_bytes(b"two")
    assert path_fingerprint(data) != before
    folder = tmp_path / "docs"
    (folder / "d").mkdir(parents=True)
    (folder / "d" / "a.txt").write_text("x")
    listed = path_fingerprint(folder)
    (folder / "d" / "b.txt").write_text("y")
    assert path_fingerprint(folder) != listed
    cfg = load_config(["model=tiny_random", "suite=tail", "suite.params.tail.dataset=s3://bucket/tail",
                       "suite.allow_too_long=true"])
    ctx = make_context(cfg, str(tiny_model_path))
    assert shard_key(ctx, make_plan(cfg).shards[0]) is None  # remote data is not fingerprinted: never cached


def test_a_changed_prompt_template_changes_ids_and_keys(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #12: a template edit must never be served the old prompts from the cache."""
    first, root_a = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=a")
    old = root_a.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    spec = TASKS["ruler/vt"]
    assert spec.prompt_fingerprint == prompt_fingerprint("variable_tracking")
    versions = {r["generator_version"] for r in old if r["task"] == "vt"}
    assert versions == {f"{GENERATOR_VERSION}+{spec.prompt_fingerprint}"}
    # Edit the VT template as a code change would; its task is registered with the new fingerprint.
    entry = dict(TEMPLATES["variable_tracking"], template=TEMPLATES["variable_tracking"]["template"] + " Be brief.")
    monkeypatch.setitem(TEMPLATES, "variable_tracking", entry)
    changed = dataclasses.replace(spec, prompt_fingerprint=prompt_fingerprint("variable_tracking"))
    assert changed.prompt_fingerprint != spec.prompt_fingerprint
    monkeypatch.setitem(TASKS, "ruler/vt", changed)
    cached, root_b = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=b")
    assert cached == [True, True, False, False]  # niah_single_1 from the cache, vt generated again
    new = root_b.read_stage("instances", INSTANCE_SCHEMA).to_pylist()
    old_vt, new_vt = ([r for r in rows if r["task"] == "vt"] for rows in (old, new))
    assert not any("Be brief." in r["prompt"] for r in old_vt)
    assert all("in the text above. Be brief." in r["prompt"] for r in new_vt)
    assert not {r["instance_id"] for r in old_vt} & {r["instance_id"] for r in new_vt}
    assert {r["generator_version"] for r in new_vt} == {f"{GENERATOR_VERSION}+{changed.prompt_fingerprint}"}
