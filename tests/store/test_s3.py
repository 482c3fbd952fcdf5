"""RunRoot on a real S3 server (SeaweedFS on loopback): the same contract as on local disk, plus S3 errors."""

from __future__ import annotations

import io
import pickle
import random
import socket
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longeval.errors import StoreError
from longeval.records import PREDICTION_SCHEMA, Prediction
from longeval.store.run_root import RunRoot
from longeval.store.s3 import ENDPOINT_ENV_VARS
from tests.s3server import S3Server, seaweedfs  # noqa: F401  (the module-scoped server fixture)

PREFIX = "run1"


def predictions(n: int, *, start: int = 0) -> pa.Table:
    rows = [
        Prediction(
            instance_id=f"i{k:04d}",
            model_id="m",
            output=f"answer {k} ✓",
            output_tokens=k,
            finish_reason="stop",
            cached_prompt_tokens=0,
            latency_s=0.5 * k,
        ).to_row()
        for k in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA)


def use_server(monkeypatch: pytest.MonkeyPatch, server: S3Server) -> None:
    for var in (*ENDPOINT_ENV_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in server.env().items():
        monkeypatch.setenv(var, value)


@pytest.fixture
def server(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:  # noqa: F811
    """The shared server, with `s3://<bucket>/run1` emptied so each test starts from a fresh run root."""
    use_server(monkeypatch, seaweedfs)
    client = seaweedfs.client()
    for key in seaweedfs.keys(PREFIX + "/"):
        client.delete_object(Bucket=seaweedfs.bucket, Key=key)
    yield seaweedfs


@pytest.fixture
def root(server: S3Server) -> RunRoot:
    return RunRoot(f"s3://{server.bucket}/{PREFIX}")


@pytest.mark.s3
def test_uri_and_paths(root: RunRoot, server: S3Server) -> None:
    assert root.uri == f"s3://{server.bucket}/{PREFIX}"
    assert RunRoot(f"s3://{server.bucket}/{PREFIX}/").uri == root.uri
    assert root.path("predictions", "s0.parquet") == f"s3://{server.bucket}/{PREFIX}/predictions/s0.parquet"
    assert root.local_path() is None


@pytest.mark.s3
def test_table_round_trip(root: RunRoot, server: S3Server) -> None:
    table = predictions(5)
    root.write_table("predictions", "shard-00000", table)
    assert root.read_stage("predictions", PREDICTION_SCHEMA).equals(table)
    assert root.has("predictions", "shard-00000")
    assert not root.has("predictions", "shard-00001")
    # What landed is one plain zstd Parquet object that any S3 client can read, and its commit record.
    assert server.keys(PREFIX + "/") == [f"{PREFIX}/_manifest/predictions/shard-00000.json",
                                         f"{PREFIX}/predictions/shard-00000.parquet"]
    record = root.commit_record("predictions", "shard-00000")
    assert record["rows"] == 5 and root.verify("predictions") == []
    body = server.client().get_object(Bucket=server.bucket, Key=f"{PREFIX}/predictions/shard-00000.parquet")
    parquet = pq.ParquetFile(io.BytesIO(body["Body"].read()))
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    assert parquet.read().select(table.column_names).equals(table)  # outputs last in the file (`bulky_last`)


@pytest.mark.s3
def test_json_and_text_round_trip(root: RunRoot, server: S3Server) -> None:
    obj = {"model": "smollm2", "lengths": [4096, 8192], "nested": {"ü": None, "x": 1.5}}
    root.write_json("config.json", obj)
    assert root.read_json("config.json") == obj
    root.write_text("meta/versions.txt", "vllm 0.32.0\nray 2.60.0\n")
    assert root.read_text("meta/versions.txt") == "vllm 0.32.0\nray 2.60.0\n"
    assert root.exists("config.json") and root.exists("meta/versions.txt")
    assert not root.exists("nothing.json")
    root.write_json("config.json", {"replaced": True})
    assert root.read_json("config.json") == {"replaced": True}
    assert server.keys(PREFIX + "/") == [f"{PREFIX}/config.json", f"{PREFIX}/meta/versions.txt"]


@pytest.mark.s3
def test_read_stage_concatenates_in_sorted_name_order(root: RunRoot) -> None:
    for k in (2, 0, 10, 1):
        root.write_table("predictions", f"shard-{k:05d}", predictions(2, start=10 * k))
    out = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert out.column("instance_id").to_pylist() == [
        "i0000", "i0001", "i0010", "i0011", "i0020", "i0021", "i0100", "i0101",
    ]  # fmt: skip


@pytest.mark.s3
def test_empty_stage_gives_empty_table_with_schema(root: RunRoot) -> None:
    empty = root.read_stage("scores", PREDICTION_SCHEMA)
    assert empty.num_rows == 0 and empty.schema == PREDICTION_SCHEMA
    assert root.read_stage("scores").num_columns == 0
    assert root.shard_names("scores") == set()


@pytest.mark.s3
def test_resume_sees_exactly_the_finished_shards(root: RunRoot) -> None:
    wanted = {f"shard-{k:05d}" for k in range(5)}
    for name in sorted(wanted)[:3]:
        root.write_table("predictions", name, predictions(1))
    # A second RunRoot on the same URI (a rerun) sees the same finished shards.
    rerun = RunRoot(root.uri)
    done = rerun.shard_names("predictions")
    assert done == {"shard-00000", "shard-00001", "shard-00002"}
    for name in sorted(wanted - done):
        rerun.write_table("predictions", name, predictions(1))
    assert root.shard_names("predictions") == wanted
    assert root.read_stage("predictions").num_rows == 5


@pytest.mark.s3
def test_a_write_that_fails_midway_publishes_nothing(root: RunRoot, server: S3Server) -> None:
    good = predictions(2)
    root.write_table("predictions", "s0", good)
    unwritable = pa.table({"x": pa.array([pa.MonthDayNano([1, 2, 3])], type=pa.month_day_nano_interval())})
    with pytest.raises(pa.ArrowNotImplementedError):
        root.write_table("predictions", "s1", unwritable)
    with pytest.raises(pa.ArrowNotImplementedError):
        root.write_table("predictions", "s0", unwritable)  # a failed rewrite keeps the old shard
    assert server.keys(PREFIX + "/") == [f"{PREFIX}/_manifest/predictions/s0.json", f"{PREFIX}/predictions/s0.parquet"]
    assert root.read_stage("predictions").equals(good)


@pytest.mark.s3
def test_a_shard_without_its_commit_record_is_not_read(root: RunRoot, server: S3Server) -> None:
    """A crash between the data upload and the commit record leaves a shard that readers never see."""
    root.write_table("predictions", "s0", predictions(2))
    body = server.client().get_object(Bucket=server.bucket, Key=f"{PREFIX}/predictions/s0.parquet")["Body"].read()
    server.client().put_object(Bucket=server.bucket, Key=f"{PREFIX}/predictions/s1.parquet", Body=body)
    assert root.shard_names("predictions") == {"s0"}
    assert not root.has("predictions", "s1")
    assert root.read_stage("predictions").num_rows == 2


@pytest.mark.s3
def test_verify_names_a_shard_whose_bytes_changed(root: RunRoot, server: S3Server) -> None:
    root.write_table("predictions", "s0", predictions(2))
    root.write_table("predictions", "s1", predictions(3))
    server.client().put_object(Bucket=server.bucket, Key=f"{PREFIX}/predictions/s1.parquet", Body=b"truncated")
    assert root.verify("predictions") == ["s1"]


@pytest.mark.s3
def test_shard_names_ignore_stray_objects(root: RunRoot, server: S3Server) -> None:
    root.write_table("predictions", "s0", predictions(1))
    client = server.client()
    for key in (".s1.parquet.0123456789ab.tmp", ".hidden.parquet", "README.txt", "nested/deep.parquet"):
        client.put_object(Bucket=server.bucket, Key=f"{PREFIX}/predictions/{key}", Body=b"not a shard")
    assert root.shard_names("predictions") == {"s0"}
    assert root.read_stage("predictions").num_rows == 1


@pytest.mark.s3
def test_large_shard_round_trip(root: RunRoot) -> None:
    """A shard bigger than pyarrow's upload part size (10 MB) still arrives whole."""
    rng = random.Random(0)  # incompressible bytes, so the Parquet file really is ~16 MB
    big = pa.table({"blob": pa.array([rng.randbytes(4096) for _ in range(4000)], pa.large_binary())})
    root.write_table("instances", "big", big)
    assert root.read_stage("instances").equals(big)


@pytest.mark.s3
def test_pickled_run_root_works_and_carries_no_secrets(root: RunRoot, server: S3Server) -> None:
    root.write_json("a.json", [1])
    blob = pickle.dumps(root)
    assert server.secret_key.encode() not in blob
    assert server.access_key.encode() not in blob
    assert pickle.loads(blob).read_json("a.json") == [1]


@pytest.mark.s3
def test_missing_object_raises_store_error(root: RunRoot) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        root.read_text("absent.txt")


@pytest.mark.s3
def test_missing_bucket_raises_store_error(server: S3Server) -> None:
    root = RunRoot("s3://no-such-bucket-longeval/run1")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-longeval' does not exist") as info:
        root.shard_names("predictions")
    assert "s3://no-such-bucket-longeval/run1" in str(info.value)


@pytest.mark.s3
def test_wrong_credentials_raise_store_error(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    root = RunRoot(f"s3://{server.bucket}/{PREFIX}")
    with pytest.raises(StoreError, match="check the credentials") as info:
        root.write_json("config.json", {})
    assert "wrong-secret-value" not in str(info.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with pytest.raises(StoreError, match="AWS_ACCESS_KEY_ID"):
        RunRoot(f"s3://{server.bucket}/{PREFIX}").shard_names("predictions")


def test_wrong_endpoint_fails_fast_with_a_helpful_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """No server needed: a closed loopback port stands for a mistyped endpoint."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    for var in ENDPOINT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    root = RunRoot("s3://bucket/run1")
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        root.probe()  # what a run does first: no long patience before the first answer
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "s3://bucket/run1" in message
    assert f"http://127.0.0.1:{port} (from AWS_ENDPOINT_URL)" in message
    assert "LONGEVAL_S3_ENDPOINT" in message
    assert elapsed < 5, f"bounded retries should fail fast, took {elapsed:.1f} s"
    with pytest.raises(StoreError, match="cannot reach the S3 endpoint"):
        RunRoot("s3://bucket/run1", patience_s=0.5).write_table("predictions", "s0", predictions(1))


@pytest.mark.s3
def test_a_store_outage_within_the_patience_costs_a_pause_not_the_write(
    root: RunRoot, server: S3Server
) -> None:
    """Kill the S3 server, write while it is down, restart it: the write waits and lands."""
    import threading

    root.write_table("predictions", "s0", predictions(1))
    patient = RunRoot(root.uri, patience_s=120)
    server.crash()
    restarter = threading.Timer(4.0, server.restart)
    restarter.start()
    started = time.monotonic()
    try:
        patient.write_table("predictions", "s1", predictions(2))
    finally:
        restarter.join()
    assert time.monotonic() - started >= 3.5  # it really waited for the server
    assert patient.shard_names("predictions") == {"s0", "s1"}
    assert patient.read_stage("predictions").num_rows == 3


@pytest.mark.s3
def test_an_s3_run_root_from_before_commit_records_is_adopted(server: S3Server) -> None:
    root = RunRoot(f"s3://{server.bucket}/legacy-run")
    root.write_table("predictions", "p0", predictions(3))
    client = server.client()
    for key in server.keys("legacy-run/_manifest/"):
        client.delete_object(Bucket=server.bucket, Key=key)
    assert root.shard_names("predictions") == set()
    assert root.adopt_legacy() == 1
    assert root.read_stage("predictions", PREDICTION_SCHEMA).num_rows == 3
    assert root.adopt_legacy() == 0


@pytest.mark.s3
def test_copy_shard_is_a_server_side_copy_of_both_objects(root: RunRoot, server: S3Server) -> None:
    table = predictions(4)
    root.write_table("instances", "s0", table)
    other = RunRoot(f"s3://{server.bucket}/{PREFIX}/other")
    copied = root.copy_shard("instances", "s0", other, "t0")
    assert (copied.rows, copied.how) == (4, "server-side copy")
    client = server.client()

    def body(key: str) -> bytes:
        return client.get_object(Bucket=server.bucket, Key=f"{PREFIX}/{key}")["Body"].read()

    assert body("other/instances/t0.parquet") == body("instances/s0.parquet")  # the same bytes, not re-encoded
    assert body("other/_manifest/instances/t0.json") == body("_manifest/instances/s0.json")
    assert other.verify("instances") == [] and other.read_shard("instances", "t0", PREDICTION_SCHEMA).equals(table)
    # Removing a shard drops its commit record first, then its data; the copy is untouched.
    root.remove_shard("instances", "s0")
    root.remove_shard("instances", "s0")  # already gone: fine
    assert root.stored_shards("instances") == [] and other.shard_names("instances") == {"t0"}
    (shard,) = other.stored_shards("instances")
    assert shard.committed and shard.size == copied.bytes + len(body("other/_manifest/instances/t0.json"))
