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
not the run; the wait between tries grows up to 10 s (`LONGEVAL_S3_RETRY_WAIT_S`). Other failures become a
`StoreError` that names the endpoint and what to check.

Two S3 requests go through boto3 instead, set up from the same environment: the conditional PutObject
(`If-None-Match: *`) behind `Location.create`, which pyarrow cannot send, and the GetObject of a whole-file read
(`Location.read_bytes`), which pyarrow precedes with a HEAD for the size. Parquet reads stay with pyarrow; given
the file's size (a listing has it), `Location.parquet` opens one without that HEAD.

What differs between a local folder and S3 is its backend's (`Backend`): `longeval.store.local` (atomic temp-file
writes, hard links, no retries) and `longeval.store.s3` (the endpoint and patience from the environment, which errors
are transient, the boto3 requests, the hints); a `Location` holds one and does the rest the same way for both.
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.dataset as pads
from pyarrow import fs as pafs
from tenacity import Retrying, retry_if_exception, wait_exponential
from tenacity.stop import stop_base

from longeval.errors import DiskFullError, StoreError
from longeval.store.local import LocalBackend
from longeval.store.s3 import (
    S3Backend,
    S3Endpoint,
    default_patience,
    default_retry_wait,
    is_transient,
    s3_endpoint_from_env,
)

__all__ = [
    "Backend",
    "CopyKind",
    "Location",
    "disk_full",
    "exists",
    "filesystem",
    "fingerprint",
    "list_files",
    "open_input",
    "read_uri",
    "stat",
    "write_uri",
]

T = TypeVar("T")

CopyKind = Literal["link", "copy", "server-side copy", "stream"]
"""How `Location.copy` published a file: a hard link, a local byte copy, an S3 CopyObject, or a read and a write
(between a local folder and S3)."""


class Backend(Protocol):
    """What a local folder (`local.LocalBackend`) and an S3 prefix (`s3.S3Backend`) do each their own way; `Location`
    does the rest, the same for both, and hands itself (`at`) to every hook.

    `is_file`, `list` and `read` raise OSError and run inside `Location.call` (retried, failures named there); the
    others go through `at.call` or `at.error` themselves, with what each store's messages name.
    """

    kind: str
    """"local" or "s3"."""
    bucket: str
    """The bucket, "" for a local folder."""
    endpoint: S3Endpoint | None
    """The custom S3 endpoint, None for a local folder or AWS itself."""

    def make_fs(self, at: Location) -> pafs.FileSystem:
        """The pyarrow filesystem for `at`."""

    def stop(self, at: Location) -> stop_base:
        """When `Location.call` gives up retrying transient errors."""

    def is_file(self, at: Location, rel: str) -> bool:
        """Whether a file (not a folder) is at `rel`."""

    def list(self, at: Location, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """What `selector` selects."""

    def check_empty(self, at: Location, rel: str) -> None:
        """Raise StoreError when an empty listing of `rel` hides a mistake."""

    def read(self, at: Location, rel: str) -> bytes:
        """The whole file at `rel`."""

    def write(self, at: Location, rel: str, data: bytes | pa.Buffer) -> None:
        """Publish `data` at `rel` atomically."""

    def create(self, at: Location, rel: str, data: bytes) -> bool:
        """Publish `data` at `rel` only if nothing is there yet; True when this call created it."""

    def touch(self, at: Location, rel: str) -> None:
        """Set the file's modification time to now."""

    def same_store(self, other: object) -> bool:
        """Whether a file of a location with backend `other` can be copied in without its bytes passing here."""

    def copy_in(self, at: Location, to_rel: str, source: Location, rel: str) -> CopyKind:
        """Publish `source`'s file `rel` as `to_rel` (`same_store` said it can), atomically; how it went."""

    def hint(self, exc: OSError) -> str:
        """What to check after `exc`."""


# -- one location --------------------------------------------------------------------------------------------


class Location:
    """A local folder or file, `file:///abs/path` or `s3://bucket/prefix`, with its pyarrow filesystem.

    Paths below it are relative (`join` refuses anything that would escape it). Every operation goes through
    `call`, which retries transient S3 errors and turns failures into a `StoreError` saying what to check. What a
    local folder and S3 do differently is the backend's (`Backend`: `local.LocalBackend`, `s3.S3Backend`).

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
        self._fs_cache: pafs.FileSystem | None = None
        self._backend: Backend
        uri = uri.strip()
        # Not `pafs.FileSystem.from_uri`: for s3:// it builds a filesystem with default options and may ask the
        # network for the bucket's region (our endpoint and retries are set by the backend), and it refuses
        # relative paths.
        parts = urlsplit(uri)
        if len(parts.scheme) <= 1:  # a plain path (a one-letter "scheme" is a Windows drive)
            self._backend = LocalBackend()
            self.base = str(Path(uri).expanduser().resolve())
            self.uri = self.base
        elif parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise StoreError(f"run root {uri!r}: file:// URIs must be local, like file:///abs/path")
            self._backend = LocalBackend()
            self.base = str(Path(parts.path).resolve())
            self.uri = f"file://{self.base}"
        elif parts.scheme == "s3":
            bucket, prefix = parts.netloc, parts.path.strip("/")
            if not bucket:
                raise StoreError(f"run root {uri!r} names no bucket; expected s3://bucket/prefix")
            self._backend = S3Backend(bucket, s3_endpoint_from_env())
            self.base = f"{bucket}/{prefix}" if prefix else bucket
            self.uri = f"s3://{self.base}"
        else:
            raise StoreError(
                f"run root {uri!r} has unsupported scheme {parts.scheme!r}; "
                "use a local path, file:///abs/path or s3://bucket/prefix"
            )

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Ray pickles locations into workers: ship the URI and options, rebuild the filesystem there.
        return {**self.__dict__, "_fs_cache": None}

    @property
    def kind(self) -> str:
        """"local" or "s3"."""
        return self._backend.kind

    @property
    def bucket(self) -> str:
        """The S3 bucket, "" for a local folder."""
        return self._backend.bucket

    @property
    def endpoint(self) -> S3Endpoint | None:
        """The custom S3 endpoint, None for a local folder or AWS itself."""
        return self._backend.endpoint

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
            self._fs_cache = self._backend.make_fs(self)
        return self._fs_cache

    @property
    def fs_built(self) -> bool:
        """Whether `fs` is built yet: not before its first use, nor in a copy unpickled in another process."""
        return self._fs_cache is not None

    # -- operations (every `rel` already joined) --------------------------------------------------------

    def info(self, rel: str = "") -> pafs.FileInfo:
        """What is at `rel`: its type (File, Directory, NotFound), size and mtime."""
        return self.call(f"look up {self.path(rel)}", self.fs.get_file_info, self.full(rel))

    def exists(self, rel: str = "") -> bool:
        """Whether a file (not a folder) exists at `rel` (on S3 one HEAD: pyarrow follows a missing key with a
        listing, to tell a folder, and a lease's heartbeat asks after a missing claim every beat)."""
        return self.call(f"look up {self.path(rel)}", self._backend.is_file, self, rel)

    def files(self, rel: str = "") -> list[str]:
        """Base names of the files directly inside `rel` (none if it does not exist)."""
        return [info.base_name for info in self.listing(rel)]

    def listing(self, rel: str = "") -> list[pafs.FileInfo]:
        """The files directly inside `rel` with their sizes and modification times (none if it does not exist)."""
        selector = pafs.FileSelector(self.full(rel), recursive=False, allow_not_found=True)
        infos = self.call(f"list {self.path(rel)}", self._backend.list, self, selector)
        if not infos:
            self._backend.check_empty(self, rel)
        return [info for info in infos if info.type == pafs.FileType.File]

    def has_files(self, rel: str = "") -> bool:
        """Whether any file lies anywhere under `rel` (empty folders, which some S3 servers keep after their
        objects are deleted, do not count)."""
        selector = pafs.FileSelector(self.full(rel), recursive=True, allow_not_found=True)
        infos = self.call(f"list {self.path(rel)}", self._backend.list, self, selector)
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
        return self.call(f"read {self.path(rel)}", self._backend.read, self, rel)

    def read_if_exists(self, rel: str) -> bytes | None:
        """The whole file at `rel`, or None when there is none: one request where `exists` then `read_bytes`
        take two or three."""
        try:
            return self.read_bytes(rel)
        except StoreError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Publish `data` at `rel` atomically: readers see the whole file or the old one, never a torn one."""
        self._backend.write(self, rel, data)

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
        return self._backend.create(self, rel, data)

    def copy(self, rel: str, to: Location, to_rel: str) -> CopyKind:
        """Publish the file at `rel` as `to_rel` under `to`, atomically, without its bytes passing through here
        where the stores allow it: a hard link between local folders (a byte copy when linking fails, e.g.
        across devices), a server-side copy (S3 CopyObject, through pyarrow's `copy_file`) between S3 prefixes,
        else a read and an atomic write.

        Sharing a file by hard link is safe because nothing here changes a file in place: a write publishes a
        new file by rename and a delete drops one name, so the other names keep the old bytes.
        """
        if to._backend.same_store(self._backend):
            return to._backend.copy_in(to, to_rel, self, rel)
        to.write_bytes(to_rel, self.read_bytes(rel))
        return "stream"

    def touch(self, rel: str) -> None:
        """Set the file's modification time to now (S3 has no such call: the object is written again)."""
        self._backend.touch(self, rel)

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
        retrying = Retrying(
            stop=self._backend.stop(self),
            wait=wait_exponential(multiplier=0.25, max=default_retry_wait() if self.patience_s > 0 else 2.0),
            retry=retry_if_exception(is_transient),
            reraise=True,
        )
        try:
            return retrying(fn, *args, **kwargs)
        except OSError as exc:
            raise self.error(what, exc) from exc

    def error(self, what: str, exc: OSError) -> StoreError:
        """A StoreError that names the location and says what to check."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return disk_full(what, exc)
        message = str(exc) or type(exc).__name__
        return StoreError(f"cannot {what}: {self._backend.hint(exc)} [{message}]")


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
