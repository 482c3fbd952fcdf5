"""The one file layer for local paths, `file://` and `s3://` URIs: the run store, the tasks' data loaders, the
builders and the fingerprints all reach files through it, so a data file on S3 behaves like a run root there.

A URI is parsed once into a `Location`: a plain path or `file:///abs/path` is local (`pyarrow.fs.LocalFileSystem`),
`s3://bucket/prefix` goes through `pyarrow.fs.S3FileSystem`. The endpoint comes from `LONGEVAL_S3_ENDPOINT`,
`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` (for SeaweedFS, MinIO, Ceph...), the region from `AWS_REGION` /
`AWS_DEFAULT_REGION`, credentials from the AWS SDK's usual chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
`AWS_PROFILE`, instance roles). Credentials are never passed to pyarrow explicitly, so they are neither logged
nor pickled when a location goes to a Ray worker.

Transient S3 errors (connection refused, timeouts, 5xx, throttling) are retried with exponential backoff for up
to `patience_s` seconds (default 300, `LONGEVAL_S3_PATIENCE_S`), so a store that restarts mid-run costs a pause,
not the run. Other failures become a `StoreError` that names the endpoint and what to check.

Two S3 requests go through boto3 instead, set up from the same environment: the conditional PutObject
(`If-None-Match: *`) behind `Location.create`, which pyarrow cannot send, and the GetObject of a whole-file read
(`Location.read_bytes`), which pyarrow precedes with a HEAD for the size. Parquet reads stay with pyarrow; given
the file's size (a listing has it), `Location.parquet` opens one without that HEAD.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as pads
from pyarrow import fs as pafs
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from longeval.errors import DiskFullError, StoreError

__all__ = [
    "DEFAULT_PATIENCE_S",
    "ENDPOINT_ENV_VARS",
    "CopyKind",
    "PATIENCE_ENV_VAR",
    "Location",
    "S3Endpoint",
    "default_patience",
    "exists",
    "filesystem",
    "fingerprint",
    "is_transient",
    "list_files",
    "open_input",
    "read_uri",
    "s3_endpoint_from_env",
    "stat",
    "write_uri",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Environment variables that name a custom S3 endpoint, first match wins.
ENDPOINT_ENV_VARS = ("LONGEVAL_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
DEFAULT_PATIENCE_S = 300.0
PATIENCE_ENV_VAR = "LONGEVAL_S3_PATIENCE_S"
TMP_SUFFIX = ".tmp"
"""A local atomic write's temp file is `.<name>.<random>.tmp` beside its target (dot-named: listings skip it)."""
CopyKind = Literal["link", "copy", "server-side copy", "stream"]
"""How `Location.copy` published a file: a hard link, a local byte copy, an S3 CopyObject, or a read and a write
(between a local folder and S3)."""

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


# -- configuration from the environment --------------------------------------------------------------------


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


def default_patience() -> float:
    """Seconds to keep retrying transient S3 errors: $LONGEVAL_S3_PATIENCE_S, else 300."""
    value = os.environ.get(PATIENCE_ENV_VAR, "").strip()
    if not value:
        return DEFAULT_PATIENCE_S
    try:
        return max(0.0, float(value))
    except ValueError as exc:
        raise StoreError(f"{PATIENCE_ENV_VAR}={value!r} is not a number of seconds, e.g. 300") from exc


# -- transient errors --------------------------------------------------------------------------------------


def _aws_code(exc: BaseException) -> str:
    """The AWS error code inside a pyarrow OSError message ('' if none)."""
    match = _AWS_CODE.search(str(exc))
    return match.group(1) if match else ""


def is_transient(exc: BaseException) -> bool:
    """Whether an S3 error is worth another try: the server was away, overloaded or restarting (a 5xx)."""
    if not isinstance(exc, OSError) or isinstance(exc, FileNotFoundError | PermissionError):
        return False
    if _aws_code(exc) in _TRANSIENT_CODES:
        return True
    status = _HTTP_STATUS.search(str(exc))
    return bool(status and status.group(1).startswith("5"))


# -- one location --------------------------------------------------------------------------------------------


class Location:
    """A local folder or file, `file:///abs/path` or `s3://bucket/prefix`, with its pyarrow filesystem.

    Paths below it are relative (`join` refuses anything that would escape it). Every operation goes through
    `call`, which retries transient S3 errors and turns failures into a `StoreError` saying what to check.

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
        self.attempts = max(1, attempts)
        self.patience_s = default_patience() if patience_s is None else max(0.0, patience_s)
        self.connect_timeout = connect_timeout
        self.endpoint: S3Endpoint | None = None
        self.bucket = ""
        self._fs_cache: pafs.FileSystem | None = None
        self._client_cache: Any = None
        self._client_lock = threading.Lock()
        uri = uri.strip()
        # Not `pafs.FileSystem.from_uri`: for s3:// it builds a filesystem with default options and may ask the
        # network for the bucket's region (our endpoint and retries are set below), and it refuses relative paths.
        parts = urlsplit(uri)
        if len(parts.scheme) <= 1:  # a plain path (a one-letter "scheme" is a Windows drive)
            self.kind = "local"
            self.base = str(Path(uri).expanduser().resolve())
            self.uri = self.base
        elif parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise StoreError(f"run root {uri!r}: file:// URIs must be local, like file:///abs/path")
            self.kind = "local"
            self.base = str(Path(parts.path).resolve())
            self.uri = f"file://{self.base}"
        elif parts.scheme == "s3":
            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise StoreError(f"run root {uri!r} names no bucket; expected s3://bucket/prefix")
            self.kind = "s3"
            self.bucket = bucket
            self.base = f"{bucket}/{prefix}" if prefix else bucket
            self.uri = f"s3://{self.base}"
            self.endpoint = s3_endpoint_from_env()
        else:
            raise StoreError(
                f"run root {uri!r} has unsupported scheme {parts.scheme!r}; "
                "use a local path, file:///abs/path or s3://bucket/prefix"
            )

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Ray pickles locations into workers: ship the URI and options, rebuild the filesystem there.
        state = self.__dict__.copy()
        state["_fs_cache"] = state["_client_cache"] = state["_client_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client_lock=threading.Lock())

    # -- paths --------------------------------------------------------------------------------------------

    def join(self, *parts: str) -> str:
        """Join path parts under the location, refusing anything that would escape it."""
        pieces: list[str] = []
        for part in parts:
            if not isinstance(part, str) or not part:
                raise StoreError(f"empty or non-string path part {part!r} under run root {self.uri}")
            for piece in part.split("/"):
                if piece in ("", ".", ".."):
                    raise StoreError(
                        f"path {'/'.join(parts)!r} under run root {self.uri} must be relative, "
                        "without empty, '.' or '..' components"
                    )
                pieces.append(piece)
        return "/".join(pieces)

    def full(self, rel: str = "") -> str:
        """The filesystem path of `rel` (already joined) for pyarrow: `/abs/path/rel` or `bucket/prefix/rel`."""
        return f"{self.base}/{rel}" if rel else self.base

    def path(self, rel: str = "") -> str:
        """The URI of `rel` (already joined), for messages and logs."""
        return f"{self.uri}/{rel}" if rel else self.uri

    # -- the filesystem -----------------------------------------------------------------------------------

    @property
    def fs(self) -> pafs.FileSystem:
        """The pyarrow filesystem, built on first use (and again after unpickling)."""
        if self._fs_cache is None:
            self._fs_cache = self._make_fs()
        return self._fs_cache

    def _make_fs(self) -> pafs.FileSystem:
        if self.kind == "local":
            return pafs.LocalFileSystem()
        options: dict[str, Any] = {
            "connect_timeout": self.connect_timeout,
            # Our own retry loop (tenacity) decides; the SDK's default three tries would multiply it.
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
            "allow_delayed_open": True,
        }
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            options["region"] = region
        if self.endpoint is not None:
            options["endpoint_override"] = self.endpoint.host
            options["scheme"] = self.endpoint.scheme
            options.setdefault("region", "us-east-1")
        log.debug("run root %s: S3 endpoint %s", self.uri, self.endpoint.url if self.endpoint else "AWS")
        try:
            return pafs.S3FileSystem(**options)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot set up S3 access for {self.uri}: {exc}") from exc

    # -- operations (every `rel` already joined) --------------------------------------------------------

    def info(self, rel: str = "") -> pafs.FileInfo:
        """What is at `rel`: its type (File, Directory, NotFound), size and mtime."""
        return self.call(f"look up {self.path(rel)}", self.fs.get_file_info, self.full(rel))

    def exists(self, rel: str = "") -> bool:
        """Whether a file (not a folder) exists at `rel` (on S3 one HEAD: pyarrow follows a missing key with a
        listing, to tell a folder, and a lease's heartbeat asks after a missing claim every beat)."""
        if self.kind == "s3" and rel:
            return self.call(f"look up {self.path(rel)}", self._s3_head, rel)
        return self.info(rel).type == pafs.FileType.File

    def _s3_head(self, rel: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client().head_object(Bucket=self.bucket, Key=self._key(rel))
        except ClientError as exc:
            error = _os_error(exc)
            if isinstance(error, FileNotFoundError):
                return False
            raise error from exc
        except BotoCoreError as exc:
            raise ConnectionError(f"AWS Error NETWORK_CONNECTION: {exc}") from exc
        return True

    def files(self, rel: str = "") -> list[str]:
        """Base names of the files directly inside `rel` (none if it does not exist)."""
        return [info.base_name for info in self.listing(rel)]

    def listing(self, rel: str = "") -> list[pafs.FileInfo]:
        """The files directly inside `rel` with their sizes and modification times (none if it does not exist)."""
        selector = pafs.FileSelector(self.full(rel), recursive=False, allow_not_found=True)
        infos = self.call(f"list {self.path(rel)}", self._list, selector)
        if not infos and self.kind == "s3":
            # pyarrow lists a missing bucket as empty: say so, or a typo in the bucket looks like a fresh run.
            bucket = self.call(f"look up bucket of {self.uri}", self.fs.get_file_info, self.bucket)
            if bucket.type == pafs.FileType.NotFound:
                raise StoreError(
                    f"cannot list {self.path(rel)}: bucket {self.bucket!r} does not exist; "
                    "create it first or fix the run root"
                )
        return [info for info in infos if info.type == pafs.FileType.File]

    def _list(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """List with `allow_not_found`, surviving pyarrow's local race: when a folder is created between its
        failed listing and the existence check after it, pyarrow raises FileNotFoundError although the folder
        is there (seen with racing lease claims). Asking again lists it."""
        try:
            return self.fs.get_file_info(selector)
        except FileNotFoundError:
            if self.kind != "local":
                raise
            return self.fs.get_file_info(selector)

    def has_files(self, rel: str = "") -> bool:
        """Whether any file lies anywhere under `rel` (empty folders, which some S3 servers keep after their
        objects are deleted, do not count)."""
        selector = pafs.FileSelector(self.full(rel), recursive=True, allow_not_found=True)
        infos = self.call(f"list {self.path(rel)}", self._list, selector)
        return any(info.type == pafs.FileType.File for info in infos)

    def open_input(self, rel: str = "") -> pa.NativeFile:
        """`rel` opened for random-access reading (Parquet footers, ranges); the open is retried, reads are not."""
        return self.call(f"open {self.path(rel)}", self.fs.open_input_file, self.full(rel))

    def parquet(self, rel: str, *, size: int | None = None, page_checksums: bool = True,
                whole_below: int = 0) -> pads.ParquetFileFragment:
        """`rel` as a Parquet fragment: its footer read on first use and kept, then only the ranges asked for
        (pre-buffered: one request per row group's columns where they lie close), pages checked against their
        checksums. `size`: the file's bytes, when a listing said (on S3 this spares the HEAD request an open
        makes). A file of at most `whole_below` bytes (its size known) is read now, whole, in one request, and
        read from memory: pyarrow would read its last 64 KiB for the footer and then its pages again, up to twice
        its bytes in three requests (for a reader that wants most of the file anyway)."""
        options = pads.ParquetFragmentScanOptions(pre_buffer=True, page_checksum_verification=page_checksums)
        parquet = pads.ParquetFileFormat(default_fragment_scan_options=options)
        if size is not None and size <= whole_below:
            return parquet.make_fragment(pa.py_buffer(self.read_bytes(rel)))
        return parquet.make_fragment(self.full(rel), filesystem=self.fs, file_size=size)

    def read_bytes(self, rel: str = "") -> bytes:
        """The whole file at `rel`, the read retried as one operation (on S3 one GetObject, no HEAD first)."""
        if self.kind == "s3":
            return self.call(f"read {self.path(rel)}", self._s3_get, rel)

        def read() -> bytes:
            with self.fs.open_input_stream(self.full(rel)) as f:
                return f.read()

        return self.call(f"read {self.path(rel)}", read)

    def read_if_exists(self, rel: str) -> bytes | None:
        """The whole file at `rel`, or None when there is none: one request where `exists` then `read_bytes`
        take two or three."""
        try:
            return self.read_bytes(rel)
        except StoreError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise

    def _s3_get(self, rel: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client().get_object(Bucket=self.bucket, Key=self._key(rel))
            return response["Body"].read()
        except ClientError as exc:
            raise _os_error(exc) from exc
        except BotoCoreError as exc:  # endpoint unreachable, timeouts, a body cut short
            raise ConnectionError(f"AWS Error NETWORK_CONNECTION: {exc}") from exc

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Publish `data` at `rel` atomically: readers see the whole file or the old one, never a torn one."""
        if self.kind == "local":
            self._local_atomic(rel, data)
        else:
            self.put(rel, data)

    def put(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Upload `data` to `rel` as one stream; on S3 the object appears only once complete."""

        def put() -> None:
            with self.fs.open_output_stream(self.full(rel)) as out:
                out.write(data)

        self.call(f"write {self.path(rel)}", put)

    def create(self, rel: str, data: bytes) -> bool:
        """Publish `data` at `rel` only if nothing is there yet; True when this call created it.

        The one atomic "first writer wins" this layer offers, for leases: locally a complete temp file hard-linked
        to the target (`link` fails if the name exists, and readers never see a partial file); on S3 a PutObject
        with `If-None-Match: *`, which the server refuses with 412 when the key exists (AWS, SeaweedFS >= 4).
        A retried S3 request whose first try landed answers False: callers read the file back to tell.
        """
        if self.kind == "local":
            return self._local_create(rel, data)
        return self._s3_create(rel, data)

    def _local_create(self, rel: str, data: bytes) -> bool:
        def link(tmp: Path, final: Path) -> bool:
            try:
                os.link(tmp, final)
            except FileExistsError:
                return False
            return True

        return self._publish_temp(rel, data, "create", link)

    def _client(self) -> Any:
        """The boto3 S3 client for what pyarrow cannot send in one request, set up from the same environment
        (endpoint, region, credentials chain) as the pyarrow filesystem; built once (clients are thread-safe)."""
        with self._client_lock:
            if self._client_cache is None:
                import boto3
                from botocore.config import Config as BotoConfig

                region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
                self._client_cache = boto3.session.Session().client(  # a session of its own: thread-safe
                    "s3", endpoint_url=self.endpoint.url if self.endpoint else None,
                    region_name=region or ("us-east-1" if self.endpoint else None),
                    config=BotoConfig(connect_timeout=self.connect_timeout, retries={"max_attempts": 1},
                                      max_pool_connections=32))
            return self._client_cache

    def _key(self, rel: str) -> str:
        return self.full(rel).removeprefix(f"{self.bucket}/")

    def _s3_create(self, rel: str, data: bytes) -> bool:
        # pyarrow has no conditional writes: this one request goes through boto3.
        from botocore.exceptions import BotoCoreError, ClientError

        client, key = self._client(), self._key(rel)

        def put() -> bool:
            try:
                client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code == "PreconditionFailed" or status == 412:
                    return False  # the key exists
                if code == "ConditionalRequestConflict" or status == 409:
                    return False  # AWS: a concurrent conditional write to the key won
                if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
                    raise ConnectionError(f"HTTP status {status}: {exc}") from exc
                raise OSError(f"{code or status}: {exc}") from exc
            except BotoCoreError as exc:  # endpoint unreachable, timeouts
                raise ConnectionError(f"AWS Error NETWORK_CONNECTION: {exc}") from exc
            return True

        return self.call(f"create {self.path(rel)}", put)

    def _local_atomic(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Write to a temp file beside the target, fsync, then rename over it (atomic on POSIX)."""
        self._publish_temp(rel, data, "write", os.replace)

    def _publish_temp(self, rel: str, data: bytes | pa.Buffer, what: str,
                      publish: Callable[[Path, Path], T]) -> T:
        """Write `data` whole to a temp file beside `rel`, fsync it, then `publish(tmp, final)`: readers never see
        a partial file, and the temp file is gone afterwards whatever happened."""
        final = Path(self.base, rel)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return publish(tmp, final)
        except OSError as exc:
            raise self.error(f"{what} {final}", exc) from exc
        finally:
            with contextlib.suppress(OSError):  # gone after a rename, or the folder never existed
                tmp.unlink(missing_ok=True)

    def copy(self, rel: str, to: Location, to_rel: str) -> CopyKind:
        """Publish the file at `rel` as `to_rel` under `to`, atomically, without its bytes passing through here
        where the stores allow it: a hard link between local folders (a byte copy when linking fails, e.g.
        across devices), a server-side copy (S3 CopyObject, through pyarrow's `copy_file`) between S3 prefixes,
        else a read and an atomic write.

        Sharing a file by hard link is safe because nothing here changes a file in place: a write publishes a
        new file by rename and a delete drops one name, so the other names keep the old bytes.
        """
        if self.kind == "local" and to.kind == "local":
            return to._local_link(Path(self.full(rel)), to_rel)
        if self.kind == "s3" and to.kind == "s3" and self.endpoint == to.endpoint:
            # One CopyObject request; the object appears at `to_rel` only once complete (up to S3's 5 GB limit
            # for a single copy, far above any shard).
            to.call(f"copy {self.path(rel)} to {to.path(to_rel)}", to.fs.copy_file, self.full(rel), to.full(to_rel))
            return "server-side copy"
        to.write_bytes(to_rel, self.read_bytes(rel))
        return "stream"

    def _local_link(self, source: Path, rel: str) -> CopyKind:
        """Hard-link `source` to a temp name beside the target, then rename it over the target (atomic); copy the
        bytes instead when the filesystem refuses the link."""
        final = Path(self.base, rel)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
        how: CopyKind = "link"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, tmp)
            except FileNotFoundError:
                raise
            except OSError as exc:  # another device (EXDEV), no links on this filesystem, a protected source
                log.debug("cannot hard-link %s to %s (%s); copying its bytes", source, final, exc)
                with open(source, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                    dst.flush()
                    os.fsync(dst.fileno())
                how = "copy"
            os.replace(tmp, final)
        except OSError as exc:
            raise self.error(f"copy {source} to {final}", exc) from exc
        finally:
            with contextlib.suppress(OSError):  # gone after the rename (or still there: `final` was the same file)
                tmp.unlink(missing_ok=True)
        return how

    def touch(self, rel: str) -> None:
        """Set the file's modification time to now (S3 has no such call: the object is written again)."""
        if self.kind == "local":
            self.call(f"touch {self.path(rel)}", os.utime, self.full(rel))
        else:
            self.put(rel, self.read_bytes(rel))

    def delete(self, rel: str, *, missing_ok: bool = False) -> None:
        """Delete the file at `rel`; with `missing_ok`, a file already gone (another process removed it) is fine."""

        def delete() -> None:
            try:
                self.fs.delete_file(self.full(rel))
            except FileNotFoundError:
                if not missing_ok:
                    raise

        self.call(f"delete {self.path(rel)}", delete)

    # -- retries and errors -------------------------------------------------------------------------------

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one filesystem operation, retrying transient S3 errors, and turn failures into StoreError."""
        if self.kind != "s3":
            stop = stop_after_attempt(1)
        elif self.patience_s > 0:  # keep trying through an outage, but at least `attempts` times
            stop = stop_after_delay(self.patience_s) & stop_after_attempt(self.attempts)
        else:
            stop = stop_after_attempt(self.attempts)
        retrying = Retrying(
            stop=stop,
            wait=wait_exponential(multiplier=0.25, max=10.0 if self.patience_s > 0 else 2.0),
            retry=retry_if_exception(is_transient),
            reraise=True,
        )
        try:
            return retrying(fn, *args, **kwargs)
        except OSError as exc:
            raise self.error(what, exc) from exc

    def error(self, what: str, exc: OSError) -> StoreError:
        """A StoreError that names the location and says what to check."""
        code = _aws_code(exc)
        message = str(exc) or type(exc).__name__
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return disk_full(what, exc)
        if self.kind == "local":
            if isinstance(exc, PermissionError):
                hint = "check the folder's permissions or pick a run root you can write"
            elif isinstance(exc, FileNotFoundError):
                hint = "the file does not exist; is this the right run root, and did the stage finish?"
            else:
                hint = "check the path, free disk space and permissions"
        elif code == "NETWORK_CONNECTION" or "curlCode" in message:
            endpoint = (
                f"{self.endpoint.url} (from {self.endpoint.source})"
                if self.endpoint
                else f"AWS (no {' / '.join(ENDPOINT_ENV_VARS)} set)"
            )
            hint = (
                f"cannot reach the S3 endpoint {endpoint}; check that the server is running and that "
                f"{ENDPOINT_ENV_VARS[0]} or AWS_ENDPOINT_URL points at it (e.g. http://127.0.0.1:8333)"
            )
        elif code == "NO_SUCH_BUCKET":
            hint = f"bucket {self.bucket!r} does not exist; create it first or fix the run root"
        elif code in _AUTH_CODES or "HTTP status 403" in message:
            hint = (
                "access denied; check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                f"AWS_PROFILE) and that they may use bucket {self.bucket!r}"
            )
        elif isinstance(exc, FileNotFoundError):
            hint = "the object does not exist; is this the right run root, and did the stage finish?"
        else:
            hint = (
                f"check the S3 endpoint ({', '.join(ENDPOINT_ENV_VARS)}), the credentials and that "
                f"bucket {self.bucket!r} exists"
            )
        return StoreError(f"cannot {what}: {hint} [{message}]")


def _os_error(exc: Any) -> OSError:
    """A boto3 ClientError as the OSError pyarrow would raise: missing keys as FileNotFoundError, 5xx and
    throttling as transient (`is_transient`), the AWS code kept for `Location.error`'s hints."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in ("NoSuchKey", "NotFound") or status == 404 and code != "NoSuchBucket":
        return FileNotFoundError(errno.ENOENT, f"{code or status}: {exc}")
    if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
        return ConnectionError(f"HTTP status {status}: {exc}")
    aws = {"NoSuchBucket": "NO_SUCH_BUCKET", "AccessDenied": "ACCESS_DENIED",
           "InvalidAccessKeyId": "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch": "SIGNATURE_DOES_NOT_MATCH"}
    return OSError(f"AWS Error {aws.get(code, code)} HTTP status {status}: {exc}")


# -- one URI at a time ---------------------------------------------------------------------------------------


def disk_full(what: str, exc: OSError) -> DiskFullError:
    """The one line for a full disk: what could not be written, and how to go on."""
    why = exc.strerror or ("Disk quota exceeded" if exc.errno == errno.EDQUOT else "No space left on device")
    return DiskFullError(f"cannot {what}: {why}; free space on that filesystem (or set store.root / "
                         "store.instance_cache to a disk with room) and rerun the same command: finished shards and "
                         "predictions are kept")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and base path for a folder or file, local or `s3://`, set up as a run root's is
    (the S3 endpoint from LONGEVAL_S3_ENDPOINT / AWS_ENDPOINT_URL, the region, credentials from the
    environment)."""
    location = Location(uri)
    return location.fs, location.base


def read_uri(uri: str) -> bytes:
    """One user-supplied file, a local path or `s3://bucket/key`.

    Raises:
        FileNotFoundError: nothing is there.
        StoreError: the store could not be reached or read (names the endpoint and what to check).
    """
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name or (uri.startswith("s3://") and parent in ("s3:", "s3:/")):
        raise StoreError(f"{uri!r} is not a file path; expected /path/file or s3://bucket/key")
    folder = Location(parent or ".")
    rel = folder.join(name)
    if not folder.exists(rel):
        raise FileNotFoundError(uri)
    return folder.read_bytes(rel)


def write_uri(uri: str, data: bytes | pa.Buffer) -> None:
    """Write one file, a local path or `s3://bucket/key`, atomically (a temp file renamed, or one upload)."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    folder = Location(parent or ".")
    folder.write_bytes(folder.join(name), data)


def stat(uri: str) -> pafs.FileInfo:
    """What is at `uri`: a `pyarrow.fs.FileInfo` (type File, Directory or NotFound, size, mtime)."""
    return Location(uri).info()


def exists(uri: str) -> bool:
    """Whether a file (not a folder) is at `uri`."""
    return Location(uri).exists()


def list_files(uri: str, *, recursive: bool = False) -> list[str]:
    """The files under the folder `uri` (directly inside it unless `recursive`), as sorted paths relative to
    it; none when the folder does not exist."""
    location = Location(uri)
    selector = pafs.FileSelector(location.full(), recursive=recursive, allow_not_found=True)
    infos = location.call(f"list {location.uri}", location.fs.get_file_info, selector)
    prefix = location.full().rstrip("/") + "/"
    return sorted(info.path.removeprefix(prefix) for info in infos if info.type == pafs.FileType.File)


def open_input(uri: str) -> pa.NativeFile:
    """The file at `uri` opened for random-access reading; use it as a context manager."""
    return Location(uri).open_input()


def fingerprint(path: str | None) -> bytes:
    """One file's identity: a local file's sha256; a remote one's (`s3://...`) size and ETag, read with a HEAD
    request (a content hash, streamed, when the store gives no ETag); b"-" when there is no file."""
    if not path:
        return b"-"
    if "://" not in path or path.startswith("file://"):
        file = Path(path.removeprefix("file://")).expanduser()
        return hashlib.sha256(file.read_bytes()).digest() if file.is_file() else b"-"
    fs, key = filesystem(path)
    info = fs.get_file_info(key)
    if info.type != pafs.FileType.File:
        return b"-"
    with fs.open_input_file(key) as f:
        meta = f.metadata() or {}
        etag = meta.get("ETag") or meta.get(b"ETag")
        if etag:
            tag = etag if isinstance(etag, bytes) else str(etag).encode()
            return hashlib.sha256(f"remote:{info.size}:".encode() + tag).digest()
        digest = hashlib.sha256()
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return hashlib.sha256(f"remote:{info.size}:".encode() + digest.digest()).digest()
