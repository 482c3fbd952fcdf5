"""The file layer (`longeval.store.location` and its backends, `local` and `s3`): URI parsing, the S3 endpoint from
the environment, stat, listing, open, read and fingerprint, on local disk and on a real S3 server (SeaweedFS on
loopback)."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from longeval.errors import StoreError
from longeval.store import location as files
from longeval.store.location import Location
from longeval.store.s3 import (
    ENDPOINT_ENV_VARS,
    default_patience,
    default_retry_wait,
    is_transient,
    s3_endpoint_from_env,
)

# -- parsing ---------------------------------------------------------------------------------------------------


def test_local_paths_and_file_uris_are_normalised(tmp_path: Path) -> None:
    plain = Location(str(tmp_path / "a" / ".." / "b"))
    assert (plain.kind, plain.base, plain.uri) == ("local", str(tmp_path / "b"), str(tmp_path / "b"))
    uri = Location(f"file://{tmp_path}/b/")
    assert (uri.kind, uri.base, uri.uri) == ("local", str(tmp_path / "b"), f"file://{tmp_path}/b")
    assert isinstance(uri.fs, pafs.LocalFileSystem)


def test_s3_uris_split_into_bucket_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGEVAL_S3_ENDPOINT", "http://127.0.0.1:8333")
    location = Location(" s3://bucket/some/prefix/ ")
    assert (location.kind, location.bucket, location.base) == ("s3", "bucket", "bucket/some/prefix")
    assert location.uri == "s3://bucket/some/prefix"
    assert location.endpoint is not None and location.endpoint.url == "http://127.0.0.1:8333"
    assert Location("s3://bucket").base == "bucket"


@pytest.mark.parametrize(("uri", "match"), [
    ("", "empty run root"),
    ("   ", "empty run root"),
    ("s3:///prefix", "names no bucket"),
    ("file://host/x", "must be local"),
    ("gs://bucket/x", "unsupported scheme 'gs'"),
])
def test_bad_uris_say_what_is_expected(uri: str, match: str) -> None:
    with pytest.raises(StoreError, match=match):
        Location(uri)


@pytest.mark.parametrize("parts", [("",), ("../escape",), ("/abs",), ("a//b",), ("a/./b",)])
def test_joined_paths_cannot_escape_the_location(tmp_path: Path, parts: tuple[str, ...]) -> None:
    with pytest.raises(StoreError, match="run root"):
        Location(str(tmp_path)).join(*parts)


def test_join_full_and_path(tmp_path: Path) -> None:
    location = Location(f"file://{tmp_path}")
    rel = location.join("stage", "x/y.json")
    assert rel == "stage/x/y.json"
    assert location.full(rel) == f"{tmp_path}/stage/x/y.json"
    assert location.path(rel) == f"file://{tmp_path}/stage/x/y.json"
    assert location.full() == str(tmp_path) and location.path() == f"file://{tmp_path}"


def test_a_location_pickles_without_its_filesystem(tmp_path: Path) -> None:
    location = Location(str(tmp_path))
    assert location.fs is not None and location.fs_built
    clone = pickle.loads(pickle.dumps(location))
    assert not clone.fs_built and clone.uri == location.uri
    assert isinstance(clone.fs, pafs.LocalFileSystem)


# -- the environment -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333"}, ("http", "127.0.0.1:8333", "AWS_ENDPOINT_URL")),
        (
            {"LONGEVAL_S3_ENDPOINT": "https://s3.lab:9000/", "AWS_ENDPOINT_URL": "http://x:1"},
            ("https", "s3.lab:9000", "LONGEVAL_S3_ENDPOINT"),
        ),
        ({"AWS_ENDPOINT_URL_S3": "minio:9000"}, ("https", "minio:9000", "AWS_ENDPOINT_URL_S3")),
    ],
)
def test_endpoint_from_env(env: dict[str, str], expected: tuple[str, str, str] | None) -> None:
    endpoint = s3_endpoint_from_env(env)
    got = None if endpoint is None else (endpoint.scheme, endpoint.host, endpoint.source)
    assert got == expected


@pytest.mark.parametrize("value", ["ftp://host:1", "http://host:1/some/path", "http://"])
def test_bad_endpoint_raises_store_error(value: str) -> None:
    with pytest.raises(StoreError, match="LONGEVAL_S3_ENDPOINT"):
        s3_endpoint_from_env({"LONGEVAL_S3_ENDPOINT": value})


def test_patience_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LONGEVAL_S3_PATIENCE_S", raising=False)
    assert default_patience() == 300.0
    monkeypatch.setenv("LONGEVAL_S3_PATIENCE_S", "-5")
    assert default_patience() == 0.0
    monkeypatch.setenv("LONGEVAL_S3_PATIENCE_S", "soon")
    with pytest.raises(StoreError, match="LONGEVAL_S3_PATIENCE_S='soon'"):
        default_patience()


def test_the_longest_wait_between_tries_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault tests shorten it (a restarted server seen at once); a run keeps 10 s."""
    monkeypatch.delenv("LONGEVAL_S3_RETRY_WAIT_S", raising=False)
    assert default_retry_wait() == 10.0
    monkeypatch.setenv("LONGEVAL_S3_RETRY_WAIT_S", "0.5")
    assert default_retry_wait() == 0.5
    monkeypatch.setenv("LONGEVAL_S3_RETRY_WAIT_S", "soon")
    with pytest.raises(StoreError, match="LONGEVAL_S3_RETRY_WAIT_S='soon'"):
        default_retry_wait()


@pytest.mark.parametrize(("exc", "transient"), [
    (OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7"), True),
    (OSError("AWS Error SLOW_DOWN during PutObject operation"), True),
    (OSError("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation"), True),
    (OSError("AWS Error UNKNOWN (HTTP status 404) during HeadObject operation"), False),
    (OSError("AWS Error ACCESS_DENIED during PutObject operation"), False),
    (FileNotFoundError("AWS Error NETWORK_CONNECTION"), False),
    (ValueError("AWS Error NETWORK_CONNECTION"), False),
])
def test_only_transient_s3_errors_are_retried(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_call_retries_transient_errors_then_gives_up_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENDPOINT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    location = Location("s3://bucket/run", attempts=3, patience_s=0)
    tries = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise OSError("AWS Error SERVICE_UNAVAILABLE (HTTP status 503)")
        return "ok"

    assert location.call("read s3://bucket/run/x", flaky) == "ok" and len(tries) == 3

    def down() -> None:
        tries.append(1)
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7")

    tries.clear()
    with pytest.raises(StoreError, match=r"cannot read s3://bucket/run/x: cannot reach the S3 endpoint AWS \(no "):
        location.call("read s3://bucket/run/x", down)
    assert len(tries) == 3


# -- local files ----------------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "b.txt").write_text("beta")
    (tmp_path / "sub" / "deeper" / "c.txt").write_text("gamma")
    return tmp_path


def test_local_stat_and_exists(tree: Path) -> None:
    assert files.stat(str(tree / "a.txt")).type == pafs.FileType.File
    assert files.stat(str(tree / "a.txt")).size == 5
    assert files.stat(f"file://{tree}/sub").type == pafs.FileType.Directory
    assert files.stat(str(tree / "absent")).type == pafs.FileType.NotFound
    assert files.exists(str(tree / "a.txt")) and not files.exists(str(tree / "sub"))


def test_local_listing(tree: Path) -> None:
    assert files.list_files(str(tree)) == ["a.txt"]
    assert files.list_files(str(tree), recursive=True) == ["a.txt", "sub/b.txt", "sub/deeper/c.txt"]
    assert files.list_files(f"file://{tree}/sub", recursive=True) == ["b.txt", "deeper/c.txt"]
    assert files.list_files(str(tree / "absent")) == []
    location = Location(str(tree))
    assert location.files("sub") == ["b.txt"]
    assert location.has_files("sub") and not location.has_files("absent")


def test_a_local_folder_appearing_mid_listing_is_listed_not_an_error(tmp_path: Path) -> None:
    """pyarrow raises FileNotFoundError when a folder is created between its failed listing and the existence
    check after it (racing lease claims hit this in CI); a listing here must never raise for that."""
    location = Location(str(tmp_path))
    errors: list[BaseException] = []
    for trial in range(300):
        folder = tmp_path / f"d{trial}"
        done = threading.Event()

        def lister(name: str = folder.name, done: threading.Event = done) -> None:
            while not done.is_set():
                try:
                    location.files(name)
                    location.has_files(name)
                except StoreError as exc:
                    errors.append(exc)
                    return

        thread = threading.Thread(target=lister)
        thread.start()
        folder.mkdir()
        done.set()
        thread.join()
    assert errors == []


def test_local_open_and_read(tree: Path) -> None:
    with files.open_input(str(tree / "sub" / "b.txt")) as f:
        assert f.size() == 4 and f.read() == b"beta"
    assert files.read_uri(str(tree / "a.txt")) == b"alpha"
    with pytest.raises(FileNotFoundError):
        files.read_uri(str(tree / "absent.txt"))
    with pytest.raises(StoreError, match="the file does not exist"):
        files.open_input(str(tree / "absent.txt"))
    with pytest.raises(StoreError, match="is not a file path"):
        files.read_uri("s3://bucket")


def test_local_writes_are_atomic_and_leave_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files.write_uri(str(tmp_path / "out" / "pool.parquet"), b"first")
    files.write_uri(f"file://{tmp_path}/out/pool.parquet", b"second")
    assert (tmp_path / "out" / "pool.parquet").read_bytes() == b"second"

    def disk_full(fd: int) -> None:  # injected fault: the disk fills up when the file is flushed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("longeval.store.local.os.fsync", disk_full)
    with pytest.raises(StoreError, match="No space left"):
        files.write_uri(str(tmp_path / "out" / "pool.parquet"), b"third")
    assert (tmp_path / "out" / "pool.parquet").read_bytes() == b"second"  # the old file, whole
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["pool.parquet"]


def test_a_local_copy_is_a_hard_link_published_atomically(tmp_path: Path) -> None:
    source, target = Location(str(tmp_path / "src")), Location(str(tmp_path / "dst"))
    source.write_bytes("stage/a.bin", b"alpha")
    target.write_bytes("stage/b.bin", b"old")
    assert source.copy("stage/a.bin", target, "stage/b.bin") == "link"
    a, b = tmp_path / "src" / "stage" / "a.bin", tmp_path / "dst" / "stage" / "b.bin"
    assert a.stat().st_ino == b.stat().st_ino and a.stat().st_nlink == 2
    assert source.copy("stage/a.bin", target, "stage/b.bin") == "link"  # again onto the same file: a no-op
    assert sorted(p.name for p in b.parent.iterdir()) == ["b.bin"]  # no temp file left
    # A later write replaces the name (atomic rename), so the other link keeps its bytes.
    target.write_bytes("stage/b.bin", b"new")
    assert (a.read_bytes(), b.read_bytes()) == (b"alpha", b"new")
    assert a.stat().st_nlink == 1
    target.delete("stage/b.bin")
    target.delete("stage/b.bin", missing_ok=True)
    assert a.read_bytes() == b"alpha"
    with pytest.raises(StoreError, match="the file does not exist"):
        source.copy("stage/absent.bin", target, "stage/c.bin")
    assert not (tmp_path / "dst" / "stage" / "c.bin").exists()


def test_a_copy_across_devices_copies_the_bytes(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem (/dev/shm) to copy across")
    other = Path(tempfile.mkdtemp(prefix="longeval-test-", dir=shm))
    try:
        source = Location(str(tmp_path))
        source.write_bytes("a.bin", b"alpha")
        assert source.copy("a.bin", Location(str(other)), "x/b.bin") == "copy"  # os.link: EXDEV
        assert (other / "x" / "b.bin").read_bytes() == b"alpha"
        assert [p.name for p in (other / "x").iterdir()] == ["b.bin"]
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_local_touch_sets_the_modification_time(tmp_path: Path) -> None:
    location = Location(str(tmp_path))
    location.write_bytes("a.bin", b"alpha")
    os.utime(tmp_path / "a.bin", (1_000_000_000, 1_000_000_000))
    before = time.time()
    location.touch("a.bin")
    assert (tmp_path / "a.bin").stat().st_mtime >= before - 1
    (info,) = location.listing()
    assert (info.base_name, info.size) == ("a.bin", 5) and info.mtime.timestamp() >= before - 1


def test_local_fingerprint_is_the_content_hash(tree: Path) -> None:
    assert files.fingerprint(str(tree / "a.txt")) == hashlib.sha256(b"alpha").digest()
    assert files.fingerprint(f"file://{tree}/a.txt") == hashlib.sha256(b"alpha").digest()
    assert files.fingerprint(str(tree / "absent")) == b"-"
    assert files.fingerprint(None) == files.fingerprint("") == b"-"


def test_filesystem_gives_pyarrow_the_base_path(tree: Path) -> None:
    fs, base = files.filesystem(f"file://{tree}/sub")
    assert base == str(tree / "sub")
    with fs.open_input_stream(f"{base}/b.txt") as f:
        assert f.read() == b"beta"


# -- S3 files -------------------------------------------------------------------------------------------------


@pytest.fixture
def bucket(s3_env) -> str:
    """The server's bucket with a small tree under `files/`, rewritten for each test."""
    client = s3_env.client()
    for key in s3_env.keys("files/"):
        client.delete_object(Bucket=s3_env.bucket, Key=key)
    for key, body in {"a.txt": b"alpha", "sub/b.txt": b"beta", "sub/deeper/c.txt": b"gamma"}.items():
        client.put_object(Bucket=s3_env.bucket, Key=f"files/{key}", Body=body)
    return s3_env.bucket


@pytest.mark.s3
def test_s3_stat_and_exists(bucket: str) -> None:
    info = files.stat(f"s3://{bucket}/files/a.txt")
    assert (info.type, info.size) == (pafs.FileType.File, 5)
    assert files.stat(f"s3://{bucket}/files/sub").type == pafs.FileType.Directory
    assert files.stat(f"s3://{bucket}/files/absent").type == pafs.FileType.NotFound
    assert files.exists(f"s3://{bucket}/files/a.txt") and not files.exists(f"s3://{bucket}/files/sub")


@pytest.mark.s3
def test_s3_listing(bucket: str) -> None:
    assert files.list_files(f"s3://{bucket}/files") == ["a.txt"]
    assert files.list_files(f"s3://{bucket}/files/", recursive=True) == ["a.txt", "sub/b.txt", "sub/deeper/c.txt"]
    assert files.list_files(f"s3://{bucket}/files/absent") == []
    location = Location(f"s3://{bucket}/files")
    assert location.files("sub") == ["b.txt"]
    assert location.has_files("sub") and not location.has_files("absent")


@pytest.mark.s3
def test_s3_listing_a_missing_bucket_says_so(s3_env) -> None:
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-longeval' does not exist"):
        Location("s3://no-such-bucket-longeval/run").files("x")


@pytest.mark.s3
def test_s3_open_read_and_put(bucket: str) -> None:
    with files.open_input(f"s3://{bucket}/files/sub/b.txt") as f:
        assert f.size() == 4 and f.read() == b"beta"
    assert files.read_uri(f"s3://{bucket}/files/sub/deeper/c.txt") == b"gamma"
    with pytest.raises(FileNotFoundError):
        files.read_uri(f"s3://{bucket}/files/absent.txt")
    location = Location(f"s3://{bucket}/files")
    location.put("new/d.txt", b"delta")
    assert location.read_bytes("new/d.txt") == b"delta"
    location.delete("new/d.txt")
    assert not location.exists("new/d.txt")
    with pytest.raises(StoreError, match="the object does not exist"):
        location.read_bytes("new/d.txt")


@pytest.mark.s3
def test_s3_copies_are_server_side_and_publish_whole_objects(bucket: str, s3_env, tmp_path: Path) -> None:
    location = Location(f"s3://{bucket}/files")
    other = Location(f"s3://{bucket}/files/copies")
    assert location.copy("sub/b.txt", other, "b.txt") == "server-side copy"  # one CopyObject request
    assert s3_env.client().get_object(Bucket=bucket, Key="files/copies/b.txt")["Body"].read() == b"beta"
    with pytest.raises(StoreError, match="cannot copy"):
        location.copy("absent.txt", other, "c.txt")
    assert not other.exists("c.txt")
    # Between a local folder and S3 the bytes pass through: read, then one upload.
    local = Location(str(tmp_path))
    assert location.copy("a.txt", local, "a.txt") == "stream"
    assert (tmp_path / "a.txt").read_bytes() == b"alpha"
    assert local.copy("a.txt", other, "a.txt") == "stream"
    assert other.read_bytes("a.txt") == b"alpha"
    other.delete("a.txt")
    other.delete("a.txt", missing_ok=True)
    with pytest.raises(StoreError, match="cannot delete"):
        other.delete("a.txt")


@pytest.mark.s3
def test_s3_touch_writes_the_object_again(bucket: str) -> None:
    location = Location(f"s3://{bucket}/files")
    before = location.info("a.txt").mtime
    time.sleep(1.1)  # S3 times have one-second resolution
    location.touch("a.txt")
    assert location.info("a.txt").mtime > before
    assert location.read_bytes("a.txt") == b"alpha"
    assert [(i.base_name, i.size) for i in location.listing()] == [("a.txt", 5)]


@pytest.mark.s3
def test_s3_write_uri(bucket: str, s3_env) -> None:
    files.write_uri(f"s3://{bucket}/files/out/pool.parquet", b"pool")
    assert s3_env.client().get_object(Bucket=bucket, Key="files/out/pool.parquet")["Body"].read() == b"pool"


@pytest.mark.s3
def test_s3_fingerprint_follows_the_object(bucket: str, s3_env) -> None:
    uri = f"s3://{bucket}/files/a.txt"
    first = files.fingerprint(uri)
    assert first not in (b"-", hashlib.sha256(b"alpha").digest())  # size and ETag, not the bytes
    assert files.fingerprint(uri) == first
    s3_env.client().put_object(Bucket=bucket, Key="files/a.txt", Body=b"ALPHA")
    assert files.fingerprint(uri) != first
    assert files.fingerprint(f"s3://{bucket}/files/absent") == b"-"
