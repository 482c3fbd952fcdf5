"""Instance shards are cached by content and reused across runs and models that share a tokenizer."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longeval.config import load_config
from longeval.engines.models import resolve_model_path
from longeval.errors import ConfigError
from longeval.planning.plan import make_plan
from longeval.records import INSTANCE_SCHEMA
from longeval.stages.generate import ShardGenerator, make_context
from longeval.stages.instance_cache import (
    DAMAGED,
    InstanceCache,
    cache_uri,
    parse_age,
    parse_size,
    path_fingerprint,
    prune,
    shard_key,
)
from longeval.store.location import Location
from longeval.store.run_root import RunRoot
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


def _keys(*overrides: str) -> list[str]:
    """The cache keys of the plan's shards, in plan order."""
    cfg = load_config([*TINY, *overrides])
    ctx = make_context(cfg, str(resolve_model_path(cfg.model.path)))
    return [shard_key(ctx, spec) for spec in make_plan(cfg).shards]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A `store.root` on local disk, or on the module's SeaweedFS (emptied for each test)."""
    if request.param == "local":
        return str(tmp_path)
    server = request.getfixturevalue("s3_env")
    client = server.client()
    for key in server.keys("cache-tests/"):
        client.delete_object(Bucket=server.bucket, Key=key)
    return f"s3://{server.bucket}/cache-tests"


@pytest.fixture
def codec_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often Parquet is encoded (`pq.ParquetWriter`, in `store.shard_format`) and decoded (`pq.read_table`, in
    `store.stage_reads`) in the store."""
    import longeval.store.shard_format
    import longeval.store.stage_reads

    calls = {"ParquetWriter": 0, "read_table": 0}
    modules = {"ParquetWriter": longeval.store.shard_format, "read_table": longeval.store.stage_reads}

    def counting(name: str) -> Callable:
        real = getattr(modules[name].pq, name)

        def spy(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return spy

    for name in calls:
        monkeypatch.setattr(modules[name].pq, name, counting(name))
    return calls


def _inodes(folder: Path) -> set[int]:
    return {p.stat().st_ino for p in folder.glob("*") if not p.name.startswith(".")}


def test_a_miss_writes_the_run_root_once_and_a_hit_is_a_hard_link(
    tmp_path: Path, tiny_model_path: Path, codec_calls: dict[str, int]
) -> None:
    first, _ = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=a")
    assert first == [False] * 4
    assert codec_calls == {"ParquetWriter": 4, "read_table": 0}  # each shard encoded once, for the run root
    cache = tmp_path / "_cache"
    for kind in ("instances", "_manifest/instances"):  # the cache's files are the run root's, linked
        assert _inodes(tmp_path / "a" / kind) == _inodes(cache / kind) and len(_inodes(cache / kind)) == 4
    again, root_b = _generate("model=tiny_random", f"store.root={tmp_path}", "run_name=b")
    assert again == [True] * 4
    assert codec_calls == {"ParquetWriter": 4, "read_table": 0}  # a hit neither decodes nor encodes
    for kind in ("instances", "_manifest/instances"):
        assert _inodes(tmp_path / "b" / kind) == _inodes(cache / kind)
    assert all(p.stat().st_nlink == 3 for p in (cache / "instances").glob("*.parquet"))
    assert root_b.verify("instances") == []
    assert root_b.read_stage("instances", INSTANCE_SCHEMA).equals(
        RunRoot(str(tmp_path / "a")).read_stage("instances", INSTANCE_SCHEMA))


@pytest.mark.s3
def test_an_s3_hit_is_a_server_side_copy(
    s3_env, tiny_model_path: Path, codec_calls: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = s3_env.client()
    for key in s3_env.keys("cache-s3/"):
        client.delete_object(Bucket=s3_env.bucket, Key=key)
    store = f"s3://{s3_env.bucket}/cache-s3"

    def objects(prefix: str) -> dict[str, bytes]:
        return {key.rsplit("/", 1)[1]: client.get_object(Bucket=s3_env.bucket, Key=key)["Body"].read()
                for key in s3_env.keys(f"cache-s3/{prefix}/")}

    first, _ = _generate("model=tiny_random", f"store.root={store}", "run_name=a")
    assert first == [False] * 4 and codec_calls["ParquetWriter"] == 4
    keys = _keys("model=tiny_random")
    cached = objects("_cache/instances")
    assert sorted(cached) == sorted(f"{k}.parquet" for k in keys)
    assert sorted(objects("a/instances").values()) == sorted(cached.values())  # the same bytes, byte for byte

    kinds: list[str] = []
    real_copy = Location.copy

    def recording(self: Location, rel: str, to: Location, to_rel: str) -> str:
        kinds.append(how := real_copy(self, rel, to, to_rel))
        return how

    monkeypatch.setattr(Location, "copy", recording)
    again, root_b = _generate("model=tiny_random", f"store.root={store}", "run_name=b")
    assert again == [True] * 4
    assert kinds == ["server-side copy"] * 8  # each shard's data and commit record: CopyObject
    assert codec_calls == {"ParquetWriter": 4, "read_table": 0}  # nothing decoded or encoded again
    assert sorted(objects("b/instances").values()) == sorted(cached.values())
    assert objects("b/_manifest/instances").keys() == objects("a/_manifest/instances").keys()
    assert root_b.verify("instances") == []


def test_a_damaged_cache_entry_is_generated_again_with_a_warning(
    store_root: str, tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, root_a = _generate("model=tiny_random", f"store.root={store_root}", "run_name=a")
    keys = _keys("model=tiny_random")
    cache = RunRoot(cache_uri(store_root, None))
    cache.write_bytes(f"instances/{keys[0]}.parquet", b"PAR1 damaged")  # other bytes than committed
    cache.write_text(f"_manifest/instances/{keys[2]}.json", "{not json")  # a commit record cut short
    with caplog.at_level(logging.WARNING, logger="longeval.stages.instance_cache"):
        cached, root_b = _generate("model=tiny_random", f"store.root={store_root}", "run_name=b")
    assert cached == [False, True, False, True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("generating it again" in w and "set aside" in w for w in warnings)
    assert root_b.verify("instances") == [] and cache.verify("instances") == []  # regenerated, cached again
    assert root_b.read_stage("instances", INSTANCE_SCHEMA).equals(root_a.read_stage("instances", INSTANCE_SCHEMA))
    assert len(cache.stored_shards(DAMAGED)) == 2  # set aside, for prune to remove
    assert _generate("model=tiny_random", f"store.root={store_root}", "run_name=c")[0] == [True] * 4


def test_prune_by_age_and_size_least_recently_used_first(store_root: str, tiny_model_path: Path) -> None:
    _generate("model=tiny_random", f"store.root={store_root}", "run_name=a")
    time.sleep(1.5)  # S3 times have one-second resolution
    used, _ = _generate("model=tiny_random", f"store.root={store_root}", "run_name=b", "suite.tasks=[niah_single_1]")
    assert used == [True, True]  # a hit marks its entry used
    niah, vt = set(_keys("model=tiny_random")[:2]), set(_keys("model=tiny_random")[2:])
    uri = cache_uri(store_root, None)
    entries = InstanceCache(uri).entries()  # oldest first
    assert {e.name for e in entries[:2]} == vt and {e.name for e in entries[2:]} == niah
    sizes = {e.name: e.size for e in entries}

    dry = prune(uri, max_bytes=sum(sizes[k] for k in niah), dry_run=True)
    assert {e.name for e in dry.removed} == vt and {e.name for e in dry.kept} == niah
    assert dry.removed_bytes == sum(sizes[k] for k in vt) and len(InstanceCache(uri).entries()) == 4

    last_use = min(e.shard.mtime_ns for e in entries[2:]) / 1e9
    by_age = prune(uri, older_than_s=60.0, now=last_use + 59.9)  # vt unused for over a minute, niah not
    assert {e.name for e in by_age.removed} == vt
    assert {e.name for e in InstanceCache(uri).entries()} == niah
    root_a = RunRoot(f"{store_root}/a")
    assert root_a.verify("instances") == [] and root_a.read_stage("instances").num_rows == 6  # run roots keep theirs
    local = RunRoot(uri).local_path() is not None
    assert by_age.freed_bytes == (0 if local else by_age.removed_bytes)  # locally still linked from run a

    everything = prune(uri, max_bytes=0)
    assert {e.name for e in everything.removed} == niah and InstanceCache(uri).entries() == []
    assert prune(uri, older_than_s=0.0).removed == []
    assert _generate("model=tiny_random", f"store.root={store_root}", "run_name=c")[0] == [False] * 4


def test_prune_removes_dead_entries_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache, run = InstanceCache(str(tmp_path / "_cache")), RunRoot(str(tmp_path / "run"))
    table = pa.table({"instance_id": ["i0", "i1"], "prompt": ["x" * 1000, "y" * 1000]})
    for age, name in enumerate(["new", "mid", "old"]):
        run.write_table("instances", name, table)
        cache.put(name, run, name)
        stamp = time.time() - 3600 * (age + 1)
        for path in (tmp_path / "_cache").rglob(f"{name}.*"):
            os.utime(path, (stamp, stamp))
    other = RunRoot(str(tmp_path / "other"))
    RunRoot(cache.uri).write_bytes("instances/mid.parquet", b"PAR1 damaged")
    with caplog.at_level(logging.WARNING):
        assert cache.fetch("mid", other, "mid") is None  # set aside under _damaged/
    RunRoot(cache.uri).write_bytes("instances/torn.parquet", b"PAR1 cut short")  # a write cut short: no record
    entries = {(e.stage, e.name): e for e in cache.entries()}
    assert [e.useful for e in entries.values()].count(True) == 2
    useful = entries["instances", "new"].size + entries["instances", "old"].size
    result = prune(cache.uri, max_bytes=useful - 1)
    assert [(e.stage, e.name) for e in result.removed][-1] == ("instances", "old")  # then the oldest useful one
    assert sorted((e.stage, e.name.split(".")[0]) for e in result.removed[:-1]) == [(DAMAGED, "mid"),
                                                                                     ("instances", "torn")]
    assert [e.name for e in result.kept] == ["new"]
    assert result.freed_bytes == result.removed_bytes - entries["instances", "old"].size  # "old" stays in run/
    assert run.verify("instances") == []


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("1.5h", 5400), ("90m", 5400),
                                               ("45s", 45), ("2w", 14 * 86400), (" 0s ", 0)])
def test_ages_parse(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize(("text", "size"), [("50GB", 50 * 10**9), ("500mb", 5 * 10**8), ("1.5TB", 15 * 10**11),
                                            ("2GiB", 2 * 2**30), ("1000", 1000), ("0", 0), ("10 KB", 10**4)])
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["30", "soon", "3y", ""])
def test_bad_ages_name_the_format(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--older-than .* is not an age; give a number and a unit .* e.g."):
        parse_age(text)


@pytest.mark.parametrize("text", ["lots", "5XB", "GB", ""])
def test_bad_sizes_name_the_format(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--max-size .* is not a size; give a number and a unit .* e.g."):
        parse_size(text)


@pytest.mark.parametrize("text", ["-1d", " -2.5h", "-1GB", "-0"])
def test_negative_ages_and_sizes_say_why_they_make_no_sense(text: str) -> None:
    """Not "is not an age": the number and unit are fine, the sign is what is wrong."""
    if text.strip()[-1] in "dh":
        with pytest.raises(ConfigError, match=r"--older-than .* is negative: .* give a positive age, e.g. "
                                              rf"--older-than {text.strip()[1:]}$"):
            parse_age(text)
    else:
        with pytest.raises(ConfigError, match=r"--max-size .* is negative: .* give a size of 0 or more, e.g."):
            parse_size(text)


def test_prune_needs_an_age_or_a_size(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--older-than AGE .* or --max-size SIZE"):
        prune(str(tmp_path))


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
