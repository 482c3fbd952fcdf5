"""RunRoot on the local filesystem: round trips, atomic shards, resume by shard names."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from longeval.errors import DamagedShardError, StoreError
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, Prediction
from longeval.store.location import Location
from longeval.store.run_root import RunRoot


def predictions(model: str, n: int, *, start: int = 0) -> pa.Table:
    rows = [
        Prediction(
            instance_id=f"i{k:04d}",
            model_id=model,
            output=f"answer {k} ✓",
            output_tokens=k,
            finish_reason="stop",
            cached_prompt_tokens=0,
            latency_s=0.5 * k,
        ).to_row()
        for k in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA)


@pytest.fixture
def root(tmp_path: Path) -> RunRoot:
    return RunRoot(str(tmp_path / "run"))


def test_uri_forms_point_at_the_same_folder(tmp_path: Path) -> None:
    plain = RunRoot(str(tmp_path / "run"))
    as_file = RunRoot(f"file://{tmp_path}/run/")
    assert plain.uri == str(tmp_path / "run")
    assert as_file.uri == f"file://{tmp_path}/run"
    assert plain.local_path() == as_file.local_path() == tmp_path / "run"
    assert plain.path("predictions", "s0.parquet") == f"{tmp_path}/run/predictions/s0.parquet"
    plain.write_json("config.json", {"a": 1})
    assert as_file.read_json("config.json") == {"a": 1}


def test_table_round_trip(root: RunRoot) -> None:
    table = predictions("m", 5)
    root.write_table("predictions", "shard-00000", table)
    assert root.read_stage("predictions", PREDICTION_SCHEMA).equals(table)
    assert root.read_stage("predictions").equals(table)
    assert root.has("predictions", "shard-00000")
    assert not root.has("predictions", "shard-00001")
    path = root.local_path() / "predictions" / "shard-00000.parquet"
    assert path.is_file()


def test_shards_are_zstd_parquet(root: RunRoot) -> None:
    import pyarrow.parquet as pq

    root.write_table("predictions", "s", predictions("m", 3))
    meta = pq.ParquetFile(root.local_path() / "predictions" / "s.parquet").metadata
    assert meta.row_group(0).column(0).compression == "ZSTD"


def test_json_and_text_round_trip(root: RunRoot) -> None:
    obj = {"model": "smollm2", "lengths": [4096, 8192], "nested": {"ü": None, "x": 1.5}}
    root.write_json("config.json", obj)
    assert root.read_json("config.json") == obj
    root.write_text("meta/versions.txt", "vllm 0.32.0\nray 2.60.0\n")
    assert root.read_text("meta/versions.txt") == "vllm 0.32.0\nray 2.60.0\n"
    assert root.exists("config.json") and root.exists("meta/versions.txt")
    assert not root.exists("nothing.json")
    assert not root.exists("meta")  # a folder is not a file
    root.write_json("config.json", {"replaced": True})
    assert root.read_json("config.json") == {"replaced": True}


def test_read_stage_concatenates_in_sorted_name_order(root: RunRoot) -> None:
    for k in (2, 0, 10, 1):
        root.write_table("predictions", f"shard-{k:05d}", predictions("m", 2, start=10 * k))
    out = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert out.column("instance_id").to_pylist() == [
        "i0000", "i0001", "i0010", "i0011", "i0020", "i0021", "i0100", "i0101",
    ]  # fmt: skip


def test_empty_stage_gives_empty_table_with_schema(root: RunRoot) -> None:
    empty = root.read_stage("scores", PREDICTION_SCHEMA)
    assert empty.num_rows == 0
    assert empty.schema == PREDICTION_SCHEMA
    assert root.read_stage("scores").num_columns == 0
    assert root.shard_names("scores") == set()


def test_resume_sees_exactly_the_finished_shards(root: RunRoot) -> None:
    wanted = {f"shard-{k:05d}" for k in range(5)}
    for name in sorted(wanted)[:3]:
        root.write_table("predictions", name, predictions("m", 1))
    done = root.shard_names("predictions")
    assert done == {"shard-00000", "shard-00001", "shard-00002"}
    todo = wanted - done
    for name in sorted(todo):
        root.write_table("predictions", name, predictions("m", 1))
    assert root.shard_names("predictions") == wanted
    assert root.read_stage("predictions").num_rows == 5
    assert root.shard_names("scores") == set()


def test_a_successful_write_leaves_no_temp_files(root: RunRoot) -> None:
    root.write_table("predictions", "s0", predictions("m", 3))
    root.write_json("config.json", {})
    root.write_text("notes/a.txt", "x")
    files = sorted(p.relative_to(root.local_path()).as_posix() for p in root.local_path().rglob("*"))
    assert files == ["_manifest", "_manifest/predictions", "_manifest/predictions/s0.json", "config.json", "notes",
                     "notes/a.txt", "predictions", "predictions/s0.parquet"]


def test_a_write_that_fails_midway_publishes_nothing(root: RunRoot) -> None:
    good = predictions("m", 2)
    root.write_table("predictions", "s0", good)
    # A real failure after the temp file is open: Parquet cannot store this column type.
    unwritable = pa.table({"x": pa.array([pa.MonthDayNano([1, 2, 3])], type=pa.month_day_nano_interval())})
    with pytest.raises(pa.ArrowNotImplementedError):
        root.write_table("predictions", "s1", unwritable)
    with pytest.raises(pa.ArrowNotImplementedError):
        root.write_table("predictions", "s0", unwritable)  # a failed rewrite keeps the old shard
    assert root.shard_names("predictions") == {"s0"}
    assert sorted(p.name for p in (root.local_path() / "predictions").iterdir()) == ["s0.parquet"]
    assert root.read_stage("predictions").equals(good)


def test_a_disk_error_after_the_bytes_are_written_publishes_nothing(
    root: RunRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:  # injected fault: the disk fills up when the shard is flushed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("longeval.store.local.os.fsync", disk_full)
    with pytest.raises(StoreError, match="No space left"):
        root.write_table("predictions", "s0", predictions("m", 50))
    monkeypatch.undo()
    assert root.shard_names("predictions") == set()
    assert list((root.local_path() / "predictions").iterdir()) == []


def test_shard_names_ignore_stray_temp_files(root: RunRoot) -> None:
    root.write_table("predictions", "s0", predictions("m", 1))
    stage = root.local_path() / "predictions"
    (stage / ".s1.parquet.0123456789ab.tmp").write_bytes(b"half a shard")  # a crashed writer's leftover
    (stage / ".hidden.parquet").write_bytes(b"not ours")
    (stage / "README.txt").write_text("not a shard")
    (stage / "sub.parquet").mkdir()  # a folder, not a shard
    assert root.shard_names("predictions") == {"s0"}
    assert root.read_stage("predictions").num_rows == 1


def test_incompatible_shards_raise_store_error(root: RunRoot) -> None:
    root.write_table("x", "a", pa.table({"v": [1, 2]}))
    root.write_table("x", "b", pa.table({"v": ["one"]}))
    with pytest.raises(StoreError, match="incompatible schemas"):
        root.read_stage("x")


def test_missing_file_and_bad_json_raise_store_error(root: RunRoot) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        root.read_json("absent.json")
    root.write_text("broken.json", "{not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        root.read_json("broken.json")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_permission_denied_raises_store_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="permissions"):
            RunRoot(str(locked / "run")).write_json("config.json", {})
    finally:
        locked.chmod(0o700)


def test_write_into_a_file_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("i am a file")
    with pytest.raises(StoreError, match=str(tmp_path / "run")):
        RunRoot(str(tmp_path / "run")).write_json("config.json", {})


@pytest.mark.parametrize(
    "uri", ["", "   ", "s3://", "s3:///prefix", "ftp://host/x", "file://otherhost/x", "gs://bucket/run"]
)
def test_bad_uris_raise_store_error(uri: str) -> None:
    with pytest.raises(StoreError, match="run root"):
        RunRoot(uri)


@pytest.mark.parametrize("name", ["", "../escape", "/abs", "a//b", "a/./b"])
def test_names_cannot_escape_the_root(root: RunRoot, name: str) -> None:
    with pytest.raises(StoreError):
        root.write_text(name, "x")


def test_run_root_pickles_without_its_filesystem(root: RunRoot) -> None:
    root.write_json("a.json", [1])
    clone = pickle.loads(pickle.dumps(root))
    assert clone.uri == root.uri
    assert clone.read_json("a.json") == [1]


def test_write_part_names_parts_by_their_rows(tmp_path):
    root = RunRoot(str(tmp_path / "run"))
    table = pa.table({"instance_id": ["b", "a"], "x": [1, 2]})
    name = root.write_part("predictions", table)
    assert name.startswith("part-")
    assert root.write_part("predictions", table.take([1, 0])) == name  # same rows, same part
    assert root.write_part("predictions", table.slice(0, 1)) != name
    assert len(root.shard_names("predictions")) == 2


def test_a_run_root_from_before_commit_records_is_adopted(root: RunRoot) -> None:
    import shutil

    root.write_table("predictions", "p0", predictions("m", 3))
    root.write_table("scores", "scores", predictions("m", 2))
    shutil.rmtree(root.local_path() / "_manifest")  # what an older longeval left: shards, no commit records
    (root.local_path() / "predictions" / "torn.parquet").write_bytes(b"PAR1 cut short")
    assert root.shard_names("predictions") == set()
    assert root.adopt_legacy() == 2  # the torn file is not adopted
    assert root.shard_names("predictions") == {"p0"} and root.read_stage("scores").num_rows == 2
    assert root.commit_record("predictions", "p0")["adopted"] is True
    assert root.verify("predictions") == []
    assert root.adopt_legacy() == 0  # a root with commit records is never adopted again
    (root.local_path() / "predictions" / "late.parquet").write_bytes(
        (root.local_path() / "predictions" / "p0.parquet").read_bytes())
    assert root.adopt_legacy() == 0 and "late" not in root.shard_names("predictions")


# -- copying shards between roots (the instance cache) -------------------------------------------------------


def test_copy_shard_links_the_file_and_its_commit_record(tmp_path: Path) -> None:
    a, b = RunRoot(str(tmp_path / "a")), RunRoot(str(tmp_path / "b"))
    table = predictions("m", 3)
    a.write_table("instances", "s0", table)
    copied = a.copy_shard("instances", "s0", b, "other")
    assert (copied.rows, copied.how) == (3, "link")
    assert copied.bytes == (tmp_path / "a" / "instances" / "s0.parquet").stat().st_size
    for rel in ("instances/{}.parquet", "_manifest/instances/{}.json"):
        assert (tmp_path / "a" / rel.format("s0")).stat().st_ino == (tmp_path / "b" / rel.format("other")).stat().st_ino
    assert b.shard_names("instances") == {"other"} and b.verify("instances") == []
    assert b.read_shard("instances", "other", PREDICTION_SCHEMA).equals(table)
    with pytest.raises(StoreError, match="does not exist"):
        a.copy_shard("instances", "absent", b, "x")


def test_setting_a_damaged_shard_aside_leaves_its_other_links_whole(tmp_path: Path) -> None:
    a, b = RunRoot(str(tmp_path / "a")), RunRoot(str(tmp_path / "b"))
    a.write_table("instances", "s0", predictions("m", 3))
    a.copy_shard("instances", "s0", b, "s0")
    # Root a's copy turns damaged as far as a knows: its commit record is rewritten with a wrong digest.
    a.write_json("_manifest/instances/s0.json", {**a.commit_record("instances", "s0"), "sha256": "0" * 64})
    with pytest.raises(DamagedShardError, match="set aside"):
        a.read_shard("instances", "s0")
    assert a.shard_names("instances") == set()
    assert len(list((tmp_path / "a" / "_damaged" / "instances").iterdir())) == 1
    assert b.verify("instances") == [] and b.read_shard("instances", "s0").num_rows == 3
    assert (tmp_path / "b" / "instances" / "s0.parquet").stat().st_nlink == 1  # a's name is gone, b's stays


def test_copy_shard_refuses_to_spread_a_damaged_shard(tmp_path: Path) -> None:
    a, b = RunRoot(str(tmp_path / "a")), RunRoot(str(tmp_path / "b"))
    a.write_table("instances", "s0", predictions("m", 3))
    a.write_bytes("instances/s0.parquet", b"PAR1 not what was committed")
    with pytest.raises(DamagedShardError, match="sha256 does not match"):
        a.copy_shard("instances", "s0", b, "s0")
    a.write_table("instances", "s1", predictions("m", 3))
    a.write_text("_manifest/instances/s1.json", "{not json")
    with pytest.raises(DamagedShardError, match="commit record is unreadable"):
        a.copy_shard("instances", "s1", b, "s1")
    assert a.shard_names("instances") == set() and b.stored_shards("instances") == []
    # Unchecked (the caller wrote it a moment ago), the bytes are copied as they are.
    a.write_table("instances", "s2", predictions("m", 1))
    assert a.copy_shard("instances", "s2", b, "s2", check=False).rows == 1


def test_stored_shards_and_remove_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = RunRoot(str(tmp_path / "run"))
    for name in ("s0", "s1", "s2"):
        root.write_table("instances", name, predictions("m", 2))
    (tmp_path / "run" / "_manifest" / "instances" / "s1.json").unlink()  # s1: written, never committed
    (tmp_path / "run" / "instances" / "s2.parquet").unlink()  # s2: a record left without its data
    listed = {s.name: s for s in root.stored_shards("instances")}
    assert sorted(listed) == ["s0", "s1", "s2"]
    assert [listed[n].committed for n in ("s0", "s1", "s2")] == [True, False, False]
    assert listed["s0"].size == sum(p.stat().st_size for p in (tmp_path / "run").rglob("s0.*"))
    assert listed["s0"].mtime_ns >= (tmp_path / "run" / "instances" / "s0.parquet").stat().st_mtime_ns
    for name in ("s1", "s2", "absent"):
        root.remove_shard("instances", name)
    assert [s.name for s in root.stored_shards("instances")] == ["s0"]

    # A crash between the two deletes leaves the data uncommitted, never a committed shard without data.
    real_delete = Location.delete
    calls: list[str] = []

    def crash_after_the_record(self: Location, rel: str, **kwargs: bool) -> None:
        calls.append(rel)
        if rel.endswith(".parquet"):
            raise OSError("killed")  # injected fault: the process dies before the data goes
        real_delete(self, rel, **kwargs)

    monkeypatch.setattr(Location, "delete", crash_after_the_record)
    with pytest.raises(OSError, match="killed"):
        root.remove_shard("instances", "s0")
    monkeypatch.undo()
    assert calls == ["_manifest/instances/s0.json", "instances/s0.parquet"]
    assert root.shard_names("instances") == set() and not root.has("instances", "s0")
    assert [s.committed for s in root.stored_shards("instances")] == [False]


def test_touch_marks_a_shard_used(tmp_path: Path) -> None:
    root = RunRoot(str(tmp_path / "run"))
    root.write_table("instances", "s0", predictions("m", 1))
    for path in (tmp_path / "run").rglob("s0.*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    (old,) = root.stored_shards("instances")
    root.touch("instances", "s0")
    (new,) = root.stored_shards("instances")
    assert old.mtime_ns == 1_000_000_000 * 10**9 < new.mtime_ns


def test_metadata_read_from_many_shards_is_held_in_a_few_contiguous_tables_and_a_bounded_set_of_footers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #22: each shard's few small buffers, kept scattered, pinned heap pages (70 MB for 792 shards' 2.5 MB
    of metadata), and every footer kept held 160 MB; the kept columns are gathered `READ_BATCH` shards at a time
    and the footers kept stop at `KEPT_FOOTER_BYTES`."""
    from longeval.store import stage_reads as store
    writer = RunRoot(str(tmp_path))
    for k in range(130):
        rows = [Prediction(instance_id=f"{k}-{i}", model_id="m", output="x" * 100, output_tokens=1,
                           finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1).to_row() for i in range(3)]
        writer.write_table("predictions", f"p{k:03d}", pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA))
    first = _footer_size(tmp_path / "predictions" / "p000.parquet")
    monkeypatch.setattr(store, "KEPT_FOOTER_BYTES", 40 * first)
    root = RunRoot(str(tmp_path), remember_listings=True)
    ids = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "error"])
    assert ids.num_rows == 390 and sorted(ids["instance_id"].to_pylist())[:2] == ["0-0", "0-1"]
    kept = root.kept_reads()
    buffers = {t.column("instance_id").chunks[0].buffers()[2].address for (stage, _), t in kept.columns.items()
               if stage == "predictions"}
    assert len(buffers) == -(-130 // store.READ_BATCH)  # one contiguous table per batch, not one per shard
    assert 35 <= len(kept.footers) <= 40 and kept.footer_bytes <= store.KEPT_FOOTER_BYTES
    again = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id"])  # served from what is kept
    assert again["instance_id"].to_pylist() == ids["instance_id"].to_pylist()


def _footer_size(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.serialized_size


# -- the footer's copy of a long prompts' shard's metadata columns (issue #22) ----------------------------------


def long_prompts(n: int = 4) -> pa.Table:
    """Instance rows whose prompts fill a row group each (with `small_groups`), metadata columns between them."""
    rows = [{"instance_id": f"i{k}", "family": "ruler", "task": "vt", "target_length": 4096, "input_tokens": 3000,
             "max_new_tokens": 8 + k, "prompt": "word " * 3000, "prompt_token_ids": list(range(k, 3000 + k)),
             "references": ["x", str(k)], "meta": "{}", "seed": 0, "shard_index": 0} for k in range(n)]
    return pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA)


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of 16 KiB: a prompt of 3,000 tokens is a row group of its own, as one of 1M tokens is."""
    monkeypatch.setattr("longeval.store.shard_format.ROW_GROUP_BYTES", 16 << 10)


def rewrite(root: RunRoot, name: str, table: pa.Table, pairs: dict[bytes, bytes]) -> None:
    """Write `instances/<name>` again as `table` in a row group a row, with key-value metadata `pairs`, and commit
    it: the file's sha256 matches its record, so only a check of the footer's copy can catch what `pairs` hold."""
    import hashlib

    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, compression="zstd", write_page_checksum=True) as writer:
        writer.write_table(table, row_group_size=1)
        if pairs:
            writer.add_key_value_metadata(pairs)
    data = sink.getvalue().to_pybytes()
    root.write_bytes(f"instances/{name}.parquet", data)
    root.write_json(f"_manifest/instances/{name}.json",
                    {"rows": table.num_rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def test_a_shard_of_one_row_group_is_written_as_before_without_a_copy(root: RunRoot) -> None:
    import pyarrow.parquet as pq

    from longeval.store.shard_format import FOOTER_METADATA, bulky_last, rows_per_group

    table = long_prompts()
    root.write_table("instances", "s0", table)
    sink = pa.BufferOutputStream()
    pq.write_table(bulky_last(table), sink, compression="zstd", write_page_checksum=True,
                   row_group_size=rows_per_group(table))
    path = root.local_path() / "instances" / "s0.parquet"
    assert path.read_bytes() == sink.getvalue().to_pybytes()
    assert FOOTER_METADATA not in pq.read_metadata(path).metadata


@pytest.mark.usefixtures("small_groups")
def test_metadata_columns_are_answered_from_the_footer_as_the_file_holds_them(tmp_path: Path) -> None:
    """Whatever the schema asked for (none, or the stage's), the footer's copy gives what a read of those columns
    of the file gives, without reading their pages; the root keeps the copy, counted by its Arrow bytes, not the
    footer."""
    import pyarrow.parquet as pq

    from longeval.store.shard_format import FOOTER_METADATA

    RunRoot(str(tmp_path)).write_table("instances", "s0", long_prompts())
    path = tmp_path / "instances" / "s0.parquet"
    metadata = pq.read_metadata(path)
    assert metadata.num_row_groups == 4 and FOOTER_METADATA in metadata.metadata
    columns = ["instance_id", "max_new_tokens", "references", "meta"]
    for schema in (None, INSTANCE_SCHEMA):
        root = RunRoot(str(tmp_path), remember_listings=True)
        fragment = root.location.parquet(root.location.join("instances", "s0.parquet"))
        expected = fragment.to_table(columns=columns, schema=schema and pa.schema(
            [schema.field(c) for c in columns]))
        got = root.read_stage("instances", schema, columns=columns)
        assert got.equals(expected) and got.schema.equals(expected.schema, check_metadata=True)
        kept = root.kept_reads()
        (copy, _), = kept.copies.values()
        assert kept.footer_bytes == copy.nbytes and not kept.footers
    assert RunRoot(str(tmp_path)).read_stage("instances", INSTANCE_SCHEMA).equals(long_prompts())


@pytest.mark.usefixtures("small_groups")
def test_a_kept_copy_answers_later_metadata_reads_without_the_file_and_costs_less_than_its_footer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #22, Michelangelo 1M's shape: the driver kept the parsed footers of long prompts' shards (about seven
    times their serialized bytes) until the budget was full, which 10x's shards filled and 1x's did not (+11 % from
    1x to 10x). It keeps their footers' copies of the metadata columns instead: a later read of other metadata
    columns opens no file, and a read of the prompts opens the footer again."""
    import pyarrow.parquet as pq

    from longeval.store.shard_format import FOOTER_METADATA

    RunRoot(str(tmp_path)).write_table("instances", "s0", long_prompts())
    metadata = pq.read_metadata(tmp_path / "instances" / "s0.parquet")
    assert FOOTER_METADATA in metadata.metadata
    root = RunRoot(str(tmp_path), remember_listings=True)
    root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id"])
    kept = root.kept_reads()
    (copy, _), = kept.copies.values()
    assert not kept.footers and kept.footer_bytes == copy.nbytes < metadata.serialized_size
    opened: list[str] = []
    parquet = root.location.parquet
    monkeypatch.setattr(root.location, "parquet", lambda rel, **kw: opened.append(rel) or parquet(rel, **kw))
    meta = root.read_stage("instances", INSTANCE_SCHEMA, columns=["max_new_tokens", "references"])
    assert opened == [] and meta.equals(long_prompts().select(["max_new_tokens", "references"]))
    ids = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "prompt_token_ids"])
    assert len(opened) == 1 and ids.equals(long_prompts().select(["instance_id", "prompt_token_ids"]))


SHARD = "ruler.vt.L4096.s0.{:05d}"
"""Instance shard names, as a replica's `PromptReader` finds them (`ShardName`)."""


def prompts(root: RunRoot, name: str, references: bool = False) -> list:
    """Every prompt of the shard `name` (`long_prompts`), last first, as a replica's prompt reader hands them out."""
    from longeval.stages.infer import PromptReader
    from longeval.store.shards import ShardName

    reader = PromptReader(root, shards=[name], references=references)
    try:
        return [reader.request(f"i{k}", ShardName.parse(name).prefix) for k in (3, 2, 1, 0)]
    finally:
        reader.close()


@pytest.mark.usefixtures("small_groups")
@pytest.mark.parametrize("damage", ["bytes", "sha256"])
def test_a_damaged_footer_copy_sets_the_shard_aside(tmp_path: Path, damage: str) -> None:
    """A copy that does not match its sha256 is never answered from, neither by a metadata read nor by a replica's
    prompt reader: the shard is set aside as damaged and written again by a rerun."""
    from longeval.store.shard_format import FOOTER_METADATA, bulky_last, footer_metadata

    root = RunRoot(str(tmp_path))
    table = bulky_last(long_prompts())
    pairs = footer_metadata(table)
    if damage == "bytes":  # a character of the copy changed (still base64), its sha256 as written
        copy = bytearray(pairs[FOOTER_METADATA])
        middle = len(copy) // 2
        copy[middle] = ord("A") if copy[middle] != ord("A") else ord("B")
        pairs[FOOTER_METADATA] = bytes(copy)
    else:
        pairs[b"longeval:metadata.sha256"] = b"0" * 64
    a, b = SHARD.format(0), SHARD.format(1)
    for name, read in ((a, lambda: root.read_shard("instances", a, INSTANCE_SCHEMA, columns=["instance_id"])),
                       (b, lambda: prompts(root, b))):
        rewrite(root, name, table, pairs)
        with pytest.raises(DamagedShardError, match="footer's copy of the metadata columns does not match"):
            read()
        assert name not in root.shard_names("instances")
    assert len(list((tmp_path / "_damaged" / "instances").iterdir())) == 2


@pytest.mark.usefixtures("small_groups")
def test_a_shard_of_several_row_groups_written_before_the_copy_is_read_from_its_columns(tmp_path: Path) -> None:
    """Run roots and instance caches written before the copy existed keep working: their readers read the columns
    the footer does not copy, and get what a shard with the copy gives."""
    from longeval.store.shard_format import bulky_last

    root = RunRoot(str(tmp_path))
    table = long_prompts()
    old, new = SHARD.format(0), SHARD.format(1)
    rewrite(root, old, bulky_last(table), {})
    root.write_table("instances", new, table)
    for name in (old, new):
        read = root.read_shard("instances", name, INSTANCE_SCHEMA, columns=["instance_id", "max_new_tokens"])
        assert read.equals(table.select(["instance_id", "max_new_tokens"]))
    assert prompts(root, old, references=True) == prompts(root, new, references=True)
    assert [(r.prompt_token_ids[:2], r.max_new_tokens, r.references) for r in prompts(root, old, True)] == \
        [([k, k + 1], 8 + k, ("x", str(k))) for k in (3, 2, 1, 0)]


@pytest.mark.usefixtures("small_groups")
def test_a_column_a_shard_lacks_is_a_clear_error_that_leaves_the_shard_in_place(tmp_path: Path) -> None:
    """Arrow says ArrowInvalid for a missing column as for bad bytes; read as damage, every shard of an older run's
    stage would be set aside in turn and written again (GPU work, for predictions)."""
    root = RunRoot(str(tmp_path))
    table = long_prompts().drop_columns(["references"])  # as a version before the column wrote it
    a, b = SHARD.format(0), SHARD.format(1)
    for name in (a, b):
        root.write_table("instances", name, table)
    for read in (lambda: root.read_shard("instances", a, columns=["instance_id", "references"]),
                 lambda: prompts(root, b, references=True)):
        with pytest.raises(StoreError, match="has no column references") as raised:
            read()
        assert not isinstance(raised.value, DamagedShardError)
    assert root.shard_names("instances") == {a, b} and not (tmp_path / "_damaged").exists()
    assert root.read_shard("instances", a, columns=["instance_id"]).num_rows == table.num_rows
