"""One filesystem layer for a run root: a local folder, a `file://` URI or `s3://bucket/prefix`.

Every stage writes its output as Parquet shards under `<root>/<stage>/<name>.parquet`. A shard is committed in
two steps: the data is written atomically (a local temp file renamed into place; on S3 a single object upload,
which only becomes visible when complete), then a small commit record `<root>/_manifest/<stage>/<name>.json`
(rows, bytes, sha256) is written. Only shards with a commit record exist for readers, so a shard cut short by a
crash, or half-written by a store without atomic publish, is never read. Resume is therefore just "skip the
names in `shard_names(stage)`": a crash loses at most the shards in flight.

Transient S3 errors (connection refused, timeouts, 5xx, throttling) are retried with exponential backoff for up
to `patience_s` seconds (default 300, `LONGEVAL_S3_PATIENCE_S`), so a store that restarts mid-run costs a pause,
not the run; `probe()` checks a store once, quickly, so a mistyped endpoint fails at once instead.

S3 access goes through `pyarrow.fs.S3FileSystem`. The endpoint comes from `LONGEVAL_S3_ENDPOINT`,
`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (for SeaweedFS, MinIO, Ceph...), credentials from the AWS SDK's
usual chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, instance roles). Credentials are
never passed to pyarrow explicitly, so they are neither logged nor pickled when a `RunRoot` goes to a Ray
worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from longeval.errors import DamagedShardError, StoreError

__all__ = ["ENDPOINT_ENV_VARS", "RunRoot", "default_patience", "filesystem", "read_uri", "s3_endpoint_from_env"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Environment variables that name a custom S3 endpoint, first match wins.
ENDPOINT_ENV_VARS = ("LONGEVAL_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

_PARQUET = ".parquet"
_TMP_SUFFIX = ".tmp"
_MANIFEST = "_manifest"
LEGACY_STAGES = ("instances", "predictions", "scores", "summary")
"""The stages a run root written before commit records may hold (`RunRoot.adopt_legacy`)."""
DEFAULT_PATIENCE_S = 300.0
PATIENCE_ENV_VAR = "LONGEVAL_S3_PATIENCE_S"
_AWS_CODE = re.compile(r"AWS Error (\w+)")
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")
# Worth another try: the server was briefly away, overloaded or restarting.
_TRANSIENT_CODES = {
    "NETWORK_CONNECTION",
    "SLOW_DOWN",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_FAILURE",
    "REQUEST_TIMEOUT",
    "THROTTLING",
}
_AUTH_CODES = {
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "MISSING_AUTHENTICATION_TOKEN",
    "INVALID_SIGNATURE",
    "UNRECOGNIZED_CLIENT",
    "INVALID_CLIENT_TOKEN_ID",
}


@dataclass(frozen=True)
class S3Endpoint:
    """A custom S3 endpoint split the way pyarrow wants it."""

    scheme: str  # "http" | "https"
    host: str  # "host:port", pyarrow's endpoint_override
    source: str  # the environment variable it came from, for error messages

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}"


def s3_endpoint_from_env(env: dict[str, str] | None = None) -> S3Endpoint | None:
    """The custom S3 endpoint configured in the environment, or None for AWS itself.

    `http://127.0.0.1:8333` gives scheme `http` and host `127.0.0.1:8333`; a value without a scheme is taken
    as https, the AWS default.
    """
    env = dict(os.environ) if env is None else env
    for var in ENDPOINT_ENV_VARS:
        value = env.get(var, "").strip()
        if not value:
            continue
        parts = urlsplit(value if "://" in value else f"https://{value}")
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
            raise StoreError(
                f"{var}={value!r} is not an S3 endpoint; expected a URL like http://127.0.0.1:8333 "
                "(scheme http or https, host and port, no path)"
            )
        return S3Endpoint(scheme=parts.scheme, host=parts.netloc, source=var)
    return None


def _aws_code(exc: BaseException) -> str:
    """The AWS error code inside a pyarrow OSError message ('' if none)."""
    match = _AWS_CODE.search(str(exc))
    return match.group(1) if match else ""


def _is_transient(exc: BaseException) -> bool:
    if not isinstance(exc, OSError) or isinstance(exc, FileNotFoundError | PermissionError):
        return False
    if _aws_code(exc) in _TRANSIENT_CODES:
        return True
    status = _HTTP_STATUS.search(str(exc))
    return bool(status and status.group(1).startswith("5"))


class RunRoot:
    """The folder (or S3 prefix) that holds everything one evaluation run writes.

    Args:
        uri: a local path, `file:///abs/path` or `s3://bucket/prefix`.
        attempts: tries per S3 operation for transient errors (connection refused, 5xx, throttling), at least.
        connect_timeout: seconds to wait for an S3 connection before counting the attempt as failed.
        patience_s: keep retrying transient S3 errors this long (an S3 server restarting mid-run); default
            $LONGEVAL_S3_PATIENCE_S, else 300 s.
    """

    def __init__(
        self, uri: str, *, attempts: int = 3, connect_timeout: float = 5.0, patience_s: float | None = None
    ) -> None:
        if not isinstance(uri, str) or not uri.strip():
            raise StoreError(f"empty run root {uri!r}; give a local path, file:///path or s3://bucket/prefix")
        self._attempts = max(1, attempts)
        self._patience_s = default_patience() if patience_s is None else max(0.0, patience_s)
        self._connect_timeout = connect_timeout
        self._endpoint: S3Endpoint | None = None
        self._fs_cache: pafs.FileSystem | None = None
        uri = uri.strip()
        parts = urlsplit(uri)
        if len(parts.scheme) <= 1:  # a plain path (a one-letter "scheme" is a Windows drive)
            self._kind = "local"
            self._base = str(Path(uri).expanduser().resolve())
            self._uri = self._base
        elif parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise StoreError(f"run root {uri!r}: file:// URIs must be local, like file:///abs/path")
            self._kind = "local"
            self._base = str(Path(parts.path).resolve())
            self._uri = f"file://{self._base}"
        elif parts.scheme == "s3":
            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise StoreError(f"run root {uri!r} names no bucket; expected s3://bucket/prefix")
            self._kind = "s3"
            self._bucket = bucket
            self._base = f"{bucket}/{prefix}" if prefix else bucket
            self._uri = f"s3://{self._base}"
            self._endpoint = s3_endpoint_from_env()
        else:
            raise StoreError(
                f"run root {uri!r} has unsupported scheme {parts.scheme!r}; "
                "use a local path, file:///abs/path or s3://bucket/prefix"
            )

    # -- identity ---------------------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The normalised run root: an absolute path, `file:///...` or `s3://bucket/prefix`."""
        return self._uri

    def path(self, *parts: str) -> str:
        """Where `parts` live under the root, as a URI-ish string for messages and logs."""
        rel = self._rel(*parts) if parts else ""
        return f"{self._uri}/{rel}" if rel else self._uri

    def local_path(self) -> Path | None:
        """The root as a local `Path`, or None when it is remote."""
        return Path(self._base) if self._kind == "local" else None

    def __repr__(self) -> str:
        return f"RunRoot({self._uri!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Ray pickles RunRoots into workers: ship the URI and options, rebuild the filesystem there.
        state = self.__dict__.copy()
        state["_fs_cache"] = None
        return state

    # -- shards -----------------------------------------------------------------------------------------

    def write_table(self, stage: str, name: str, table: pa.Table) -> None:
        """Write one shard and commit it: readers see the whole shard or none of it."""
        rel = self._rel(stage, name + _PARQUET)
        # Serialise first, so a failure while encoding never reaches the store; the write is then one atomic
        # file rename or object upload, and the commit record after it publishes the shard.
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        data = sink.getvalue()
        if self._kind == "local":
            self._local_atomic(rel, lambda f: f.write(data))
        else:
            self._s3_put(rel, data)
        record = {"rows": table.num_rows, "bytes": data.size, "sha256": hashlib.sha256(data).hexdigest()}
        self.write_bytes(self._commit_name(stage, name), json.dumps(record, sort_keys=True).encode("utf-8"))

    def commit_record(self, stage: str, name: str) -> dict[str, Any]:
        """The commit record of a finished shard: its rows, bytes and sha256."""
        return json.loads(self.read_bytes(self._commit_name(stage, name)))

    def verify(self, stage: str) -> list[str]:
        """Finished shards of a stage whose bytes do not match their commit record (empty when all do)."""
        bad = []
        for name in sorted(self.shard_names(stage)):
            record = self.commit_record(stage, name)
            data = self.read_bytes(f"{stage}/{name}{_PARQUET}")
            if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
                bad.append(name)
        return bad

    def read_stage(
        self, stage: str, schema: pa.Schema | None = None, *, columns: list[str] | None = None
    ) -> pa.Table:
        """All finished shards of a stage, concatenated in sorted shard-name order.

        With no shards, an empty table with `schema` (or with no columns when `schema` is None).
        `columns` reads only those columns (prompts are large; metadata reads should not pay for them).
        """
        if columns is not None and schema is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        names = sorted(self.shard_names(stage))
        if not names:
            return schema.empty_table() if schema is not None else pa.table({})
        tables = [self.read_shard(stage, n, schema, columns=columns) for n in names]
        try:
            return pa.concat_tables(tables, promote_options="default" if schema is None else "none")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise StoreError(
                f"shards of stage {stage!r} under {self._uri} have incompatible schemas ({exc}); "
                "were they written by different longeval versions? Use a fresh run root or delete the stage"
            ) from exc

    def read_shard(self, stage: str, name: str, schema: pa.Schema | None = None, *,
                   columns: list[str] | None = None) -> pa.Table:
        """One finished shard of a stage (only `columns`, when given), checked against its commit record.

        Raises:
            DamagedShardError: the bytes do not match the record's sha256 (a damaged disk, a hand edit, a
                partial copy); the shard is set aside under `_damaged/` and uncommitted, so a rerun redoes it.
        """
        data = self.read_bytes(f"{stage}/{name}{_PARQUET}")
        record = self.commit_record(stage, name) if self.exists(self._commit_name(stage, name)) else None
        if record is not None and (len(data) != record["bytes"]
                                   or hashlib.sha256(data).hexdigest() != record["sha256"]):
            raise self._set_aside(stage, name, "its sha256 does not match its commit record")
        try:
            return pq.read_table(pa.BufferReader(data), schema=schema, columns=columns)
        except (pa.ArrowInvalid, OSError) as exc:
            raise self._set_aside(stage, name, f"it is not readable Parquet ({str(exc).splitlines()[0]})") from exc

    def _set_aside(self, stage: str, name: str, why: str) -> DamagedShardError:
        """Move a damaged shard out of its stage and drop its commit record: readers no longer see it and a
        rerun writes it again."""
        source = f"{stage}/{name}{_PARQUET}"
        target = f"_damaged/{stage}/{name}.{uuid.uuid4().hex[:8]}{_PARQUET}"
        self.write_bytes(target, self.read_bytes(source))
        self._call(f"delete {self.path(self._commit_name(stage, name))}", self._fs.delete_file,
                   f"{self._base}/{self._commit_name(stage, name)}")
        self._call(f"delete {self.path(source)}", self._fs.delete_file, self._full(source))
        return DamagedShardError(
            f"damaged shard {self.path(source)}: {why}. It was set aside as {self.path(target)} and will be "
            "written again; rerun the same command (finished work is kept)")

    def write_part(self, stage: str, table: pa.Table, *, key: str = "instance_id") -> str:
        """Write a table of rows as a part named by the hash of its keys (the same rows, the same name)."""
        ids = "\n".join(sorted(str(v) for v in table[key].to_pylist()))
        name = "part-" + hashlib.sha256(ids.encode("utf-8")).hexdigest()[:16]
        self.write_table(stage, name, table)
        return name

    def stage_files(self, stage: str) -> tuple[pafs.FileSystem, list[str]]:
        """The filesystem and full paths of a stage's finished shards, for `ray.data.read_parquet`."""
        return self._fs, [self._full(stage, n + _PARQUET) for n in sorted(self.shard_names(stage))]

    def shard_names(self, stage: str) -> set[str]:
        """Names of the finished shards of a stage (without `.parquet`): written and committed, what a rerun
        may skip."""
        written = {
            base[: -len(_PARQUET)]
            for base in self._list(self._rel(stage))
            if base.endswith(_PARQUET) and not base.startswith(".")
        }
        committed = {base.removesuffix(".json") for base in self._list(self._rel(_MANIFEST, stage))}
        return written & committed

    def has(self, stage: str, name: str) -> bool:
        """Whether the shard `name` of `stage` is finished (written and committed)."""
        return self.exists(self._commit_name(stage, name)) and self.exists(f"{self._rel(stage)}/{name}{_PARQUET}")

    def adopt_legacy(self, stages: tuple[str, ...] = LEGACY_STAGES) -> int:
        """Commit the shards of a run root written before commit records existed; returns how many.

        Only a root with no `_manifest/` at all is adopted: its writers published each shard atomically, so a
        whole Parquet file is a finished shard. A file whose Parquet footer does not read is left uncommitted
        (it is generated or predicted again). A root that has commit records is never touched: there, a shard
        without one was cut short.
        """
        if self._has_files(_MANIFEST):
            return 0
        adopted = 0
        for stage in stages:
            for base in self._list(self._rel(stage)):
                if not base.endswith(_PARQUET) or base.startswith("."):
                    continue
                data = self.read_bytes(f"{stage}/{base}")
                try:
                    rows = pq.read_metadata(pa.BufferReader(data)).num_rows
                except (pa.ArrowInvalid, OSError):
                    log.warning("not adopting %s: not a readable Parquet file", self.path(stage, base))
                    continue
                record = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                          "adopted": True}
                self.write_bytes(self._commit_name(stage, base[: -len(_PARQUET)]),
                                 json.dumps(record, sort_keys=True).encode("utf-8"))
                adopted += 1
        return adopted

    def probe(self) -> None:
        """Reach the store once, without the long patience: a wrong endpoint, bucket or key fails now, with
        what to fix, instead of after minutes of retries."""
        patience, self._patience_s = self._patience_s, 0.0
        try:
            self._list(self._rel(_MANIFEST))
        finally:
            self._patience_s = patience

    # -- small files ------------------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> None:
        """Write `obj` as indented, key-sorted JSON at `<root>/<name>`, atomically."""
        self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    def read_json(self, name: str) -> Any:
        text = self.read_text(name)
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise StoreError(
                f"{self.path(name)} is not valid JSON ({exc}); delete it or use a new run root"
            ) from exc

    def write_text(self, name: str, text: str) -> None:
        """Write UTF-8 text at `<root>/<name>`, atomically."""
        self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write bytes at `<root>/<name>`, atomically."""
        rel = self._rel(name)
        if self._kind == "local":
            self._local_atomic(rel, lambda f: f.write(data))
        else:
            self._s3_put(rel, data)

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def read_bytes(self, name: str) -> bytes:
        """The bytes at `<root>/<name>` (S3 through the same endpoint, credentials and retries as the run)."""
        rel = self._rel(name)

        def read() -> bytes:
            with self._fs.open_input_stream(f"{self._base}/{rel}") as f:
                return f.read()

        return self._call(f"read {self.path(name)}", read)

    def exists(self, name: str) -> bool:
        """Whether a file (not a folder) exists at `<root>/<name>`."""
        full = f"{self._base}/{self._rel(name)}"
        info = self._call(f"look up {self.path(name)}", self._fs.get_file_info, full)
        return info.type == pafs.FileType.File

    # -- internals --------------------------------------------------------------------------------------

    @property
    def _fs(self) -> pafs.FileSystem:
        """The pyarrow filesystem, built on first use (and again after unpickling)."""
        if self._fs_cache is None:
            self._fs_cache = self._make_fs()
        return self._fs_cache

    def _make_fs(self) -> pafs.FileSystem:
        if self._kind == "local":
            return pafs.LocalFileSystem()
        options: dict[str, Any] = {
            "connect_timeout": self._connect_timeout,
            # Our own retry loop (tenacity) decides; the SDK's default three tries would multiply it.
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        }
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        if self._endpoint is not None:
            options["endpoint_override"] = self._endpoint.host
            options["scheme"] = self._endpoint.scheme
            options.setdefault("region", "us-east-1")
        log.debug("run root %s: S3 endpoint %s", self._uri, self._endpoint.url if self._endpoint else "AWS")
        try:
            return pafs.S3FileSystem(**options)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot set up S3 access for {self._uri}: {exc}") from exc

    def _rel(self, *parts: str) -> str:
        """Join path parts under the root, refusing anything that would escape it."""
        pieces: list[str] = []
        for part in parts:
            if not isinstance(part, str) or not part:
                raise StoreError(f"empty or non-string path part {part!r} under run root {self._uri}")
            for piece in part.split("/"):
                if piece in ("", ".", ".."):
                    raise StoreError(
                        f"path {'/'.join(parts)!r} under run root {self._uri} must be relative, "
                        "without empty, '.' or '..' components"
                    )
                pieces.append(piece)
        return "/".join(pieces)

    def _commit_name(self, stage: str, name: str) -> str:
        return f"{_MANIFEST}/{self._rel(stage)}/{name}.json"

    def _full(self, *parts: str) -> str:
        return f"{self._base}/{self._rel(*parts)}"

    def _list(self, rel: str) -> list[str]:
        """Base names of the files directly inside `<root>/<rel>` (none if it does not exist)."""
        selector = pafs.FileSelector(f"{self._base}/{rel}", recursive=False, allow_not_found=True)
        infos = self._call(f"list {self.path(rel)}", self._fs.get_file_info, selector)
        if not infos and self._kind == "s3":
            # pyarrow lists a missing bucket as empty: say so, or a typo in the bucket looks like a fresh run.
            bucket = self._call(f"look up bucket of {self._uri}", self._fs.get_file_info, self._bucket)
            if bucket.type == pafs.FileType.NotFound:
                raise StoreError(
                    f"cannot list {self.path(rel)}: bucket {self._bucket!r} does not exist; "
                    "create it first or fix the run root"
                )
        return [info.base_name for info in infos if info.type == pafs.FileType.File]

    def _has_files(self, rel: str) -> bool:
        """Whether any file lies anywhere under `<root>/<rel>` (empty folders, which some S3 servers keep after
        their objects are deleted, do not count)."""
        selector = pafs.FileSelector(f"{self._base}/{rel}", recursive=True, allow_not_found=True)
        infos = self._call(f"list {self.path(rel)}", self._fs.get_file_info, selector)
        return any(info.type == pafs.FileType.File for info in infos)

    def _local_atomic(self, rel: str, write: Callable[[Any], object]) -> None:
        """Write to a temp file beside the target, fsync, then rename over it (atomic on POSIX)."""
        final = Path(self._base, rel)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{_TMP_SUFFIX}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            raise self._store_error(f"write {final}", exc) from exc
        finally:
            with contextlib.suppress(OSError):  # gone after the rename, or the folder never existed
                tmp.unlink(missing_ok=True)

    def _s3_put(self, rel: str, data: bytes | pa.Buffer) -> None:
        def put() -> None:
            with self._fs.open_output_stream(f"{self._base}/{rel}") as out:
                out.write(data)

        self._call(f"write {self.path(rel)}", put)

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one filesystem operation, retrying transient S3 errors, and turn failures into StoreError."""
        if self._kind != "s3":
            stop = stop_after_attempt(1)
        elif self._patience_s > 0:  # keep trying through an outage, but at least `attempts` times
            stop = stop_after_delay(self._patience_s) & stop_after_attempt(self._attempts)
        else:
            stop = stop_after_attempt(self._attempts)
        retrying = Retrying(
            stop=stop,
            wait=wait_exponential(multiplier=0.25, max=10.0 if self._patience_s > 0 else 2.0),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        try:
            return retrying(fn, *args, **kwargs)
        except OSError as exc:
            raise self._store_error(what, exc) from exc

    def _store_error(self, what: str, exc: OSError) -> StoreError:
        """A StoreError that names the run root and says what to check."""
        code = _aws_code(exc)
        message = str(exc) or type(exc).__name__
        if self._kind == "local":
            if isinstance(exc, PermissionError):
                hint = "check the folder's permissions or pick a run root you can write"
            elif isinstance(exc, FileNotFoundError):
                hint = "the file does not exist; is this the right run root, and did the stage finish?"
            else:
                hint = "check the path, free disk space and permissions"
        elif code == "NETWORK_CONNECTION" or "curlCode" in message:
            endpoint = (
                f"{self._endpoint.url} (from {self._endpoint.source})"
                if self._endpoint
                else f"AWS (no {' / '.join(ENDPOINT_ENV_VARS)} set)"
            )
            hint = (
                f"cannot reach the S3 endpoint {endpoint}; check that the server is running and that "
                f"{ENDPOINT_ENV_VARS[0]} or AWS_ENDPOINT_URL points at it (e.g. http://127.0.0.1:8333)"
            )
        elif code == "NO_SUCH_BUCKET":
            hint = f"bucket {self._bucket!r} does not exist; create it first or fix the run root"
        elif code in _AUTH_CODES or "HTTP status 403" in message:
            hint = (
                "access denied; check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                f"AWS_PROFILE) and that they may use bucket {self._bucket!r}"
            )
        elif isinstance(exc, FileNotFoundError):
            hint = "the object does not exist; is this the right run root, and did the stage finish?"
        else:
            hint = (
                f"check the S3 endpoint ({', '.join(ENDPOINT_ENV_VARS)}), the credentials and that "
                f"bucket {self._bucket!r} exists"
            )
        return StoreError(f"cannot {what}: {hint} [{message}]")


def default_patience() -> float:
    """Seconds to keep retrying transient S3 errors: $LONGEVAL_S3_PATIENCE_S, else 300."""
    value = os.environ.get(PATIENCE_ENV_VAR, "").strip()
    if not value:
        return DEFAULT_PATIENCE_S
    try:
        return max(0.0, float(value))
    except ValueError as exc:
        raise StoreError(f"{PATIENCE_ENV_VAR}={value!r} is not a number of seconds, e.g. 300") from exc


def read_uri(uri: str) -> bytes:
    """One user-supplied file, a local path or `s3://bucket/key`: the filesystem layer every path goes through.

    Raises:
        FileNotFoundError: nothing is there.
        StoreError: the store could not be reached or read (names the endpoint and what to check).
    """
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name or (uri.startswith("s3://") and parent in ("s3:", "s3:/")):
        raise StoreError(f"{uri!r} is not a file path; expected /path/file or s3://bucket/key")
    root = RunRoot(parent or ".")
    if not root.exists(name):
        raise FileNotFoundError(uri)
    return root.read_bytes(name)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and base path for a folder, local or `s3://`, set up as a run root's is (the
    S3 endpoint from LONGEVAL_S3_ENDPOINT / AWS_ENDPOINT_URL, the region, credentials from the environment)."""
    root = RunRoot(uri)
    return root._fs, root._base
