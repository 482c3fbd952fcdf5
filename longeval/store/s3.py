"""A `Location`'s S3 backend: the endpoint and patience from the environment, which S3 errors are worth another
try, what to check when one is not, and the requests pyarrow cannot send as wanted.

Files go through `pyarrow.fs.S3FileSystem`, set up with our endpoint and no retries of its own (`Location.call`
retries transient errors). Three requests go through boto3 instead, set up from the same environment: the
conditional PutObject (`If-None-Match: *`) behind `Location.create`, which pyarrow cannot send; the GetObject of a
whole-file read, which pyarrow precedes with a HEAD for the size; and the HEAD of `Location.exists`, which pyarrow
follows with a listing when the key is missing.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
from pyarrow import fs as pafs
from tenacity import stop_after_attempt, stop_after_delay
from tenacity.stop import stop_base

from longeval.errors import StoreError

if TYPE_CHECKING:
    from longeval.store.location import CopyKind, Location

__all__ = [
    "DEFAULT_PATIENCE_S",
    "DEFAULT_RETRY_WAIT_S",
    "ENDPOINT_ENV_VARS",
    "PATIENCE_ENV_VAR",
    "RETRY_WAIT_ENV_VAR",
    "S3Backend",
    "S3Endpoint",
    "default_patience",
    "default_retry_wait",
    "is_transient",
    "s3_endpoint_from_env",
]

log = logging.getLogger(__name__)

#: Environment variables that name a custom S3 endpoint, first match wins.
ENDPOINT_ENV_VARS = ("LONGEVAL_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
DEFAULT_PATIENCE_S = 300.0
PATIENCE_ENV_VAR = "LONGEVAL_S3_PATIENCE_S"
DEFAULT_RETRY_WAIT_S = 10.0
"""The longest wait between two tries of a transient S3 error (the backoff doubles from 0.25 s up to it): an
outage costs at most this much beyond its own length."""
RETRY_WAIT_ENV_VAR = "LONGEVAL_S3_RETRY_WAIT_S"

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
    return _seconds_from_env(PATIENCE_ENV_VAR, DEFAULT_PATIENCE_S)


def default_retry_wait() -> float:
    """The longest wait between two tries: $LONGEVAL_S3_RETRY_WAIT_S, else 10 s (the fault tests shorten it, so
    a restarted server is seen at once)."""
    return _seconds_from_env(RETRY_WAIT_ENV_VAR, DEFAULT_RETRY_WAIT_S)


def _seconds_from_env(var: str, default: float) -> float:
    """A non-negative number of seconds from an environment variable, or `default` when it is unset or empty."""
    value = os.environ.get(var, "").strip()
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError as exc:
        raise StoreError(f"{var}={value!r} is not a number of seconds, e.g. {default:g}") from exc


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


def _os_error(exc: Any) -> OSError:
    """A boto3 ClientError as the OSError pyarrow would raise: missing keys as FileNotFoundError, 5xx and
    throttling as transient (`is_transient`), the AWS code kept for `S3Backend.hint`."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in ("NoSuchKey", "NotFound") or status == 404 and code != "NoSuchBucket":
        return FileNotFoundError(errno.ENOENT, f"{code or status}: {exc}")
    if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
        return ConnectionError(f"HTTP status {status}: {exc}")
    aws = {"NoSuchBucket": "NO_SUCH_BUCKET", "AccessDenied": "ACCESS_DENIED",
           "InvalidAccessKeyId": "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch": "SIGNATURE_DOES_NOT_MATCH"}
    return OSError(f"AWS Error {aws.get(code, code)} HTTP status {status}: {exc}")


# -- the backend -------------------------------------------------------------------------------------------


class S3Backend:
    """What a `Location` on `s3://bucket/prefix` does its own way (`location.Backend` lists the hooks).

    Args:
        bucket: the bucket, for keys and for the hints of errors.
        endpoint: the custom endpoint (`s3_endpoint_from_env`), None for AWS itself.
    """

    kind = "s3"

    def __init__(self, bucket: str, endpoint: S3Endpoint | None) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self._client_cache: Any = None
        self._client_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Ray pickles locations into workers: the boto3 client is built again there.
        state = self.__dict__.copy()
        state["_client_cache"] = state["_client_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _client_lock=threading.Lock())

    def make_fs(self, at: Location) -> pafs.FileSystem:
        options: dict[str, Any] = {
            "connect_timeout": at.connect_timeout,
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
        log.debug("run root %s: S3 endpoint %s", at.uri, self.endpoint.url if self.endpoint else "AWS")
        try:
            return pafs.S3FileSystem(**options)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot set up S3 access for {at.uri}: {exc}") from exc

    def stop(self, at: Location) -> stop_base:
        """Keep trying through an outage (`patience_s`), but at least `attempts` times."""
        if at.patience_s > 0:
            return stop_after_delay(at.patience_s) & stop_after_attempt(at.attempts)
        return stop_after_attempt(at.attempts)

    # -- operations -----------------------------------------------------------------------------------------

    def is_file(self, at: Location, rel: str) -> bool:
        """One HEAD for a key (pyarrow follows a missing key with a listing, to tell a folder, and a lease's
        heartbeat asks after a missing claim every beat); the prefix itself through pyarrow."""
        if not rel:
            return at.fs.get_file_info(at.full(rel)).type == pafs.FileType.File
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client(at).head_object(Bucket=self.bucket, Key=self._key(at, rel))
        except ClientError as exc:
            error = _os_error(exc)
            if isinstance(error, FileNotFoundError):
                return False
            raise error from exc
        except BotoCoreError as exc:
            raise ConnectionError(f"AWS Error NETWORK_CONNECTION: {exc}") from exc
        return True

    def list(self, at: Location, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return at.fs.get_file_info(selector)

    def check_empty(self, at: Location, rel: str) -> None:
        """pyarrow lists a missing bucket as empty: say so, or a typo in the bucket looks like a fresh run."""
        bucket = at.call(f"look up bucket of {at.uri}", at.fs.get_file_info, self.bucket)
        if bucket.type == pafs.FileType.NotFound:
            raise StoreError(
                f"cannot list {at.path(rel)}: bucket {self.bucket!r} does not exist; "
                "create it first or fix the run root"
            )

    def read(self, at: Location, rel: str) -> bytes:
        """One GetObject, no HEAD first."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client(at).get_object(Bucket=self.bucket, Key=self._key(at, rel))
            return response["Body"].read()
        except ClientError as exc:
            raise _os_error(exc) from exc
        except BotoCoreError as exc:  # endpoint unreachable, timeouts, a body cut short
            raise ConnectionError(f"AWS Error NETWORK_CONNECTION: {exc}") from exc

    def write(self, at: Location, rel: str, data: bytes | pa.Buffer) -> None:
        """One upload: the object appears only once complete."""
        at.put(rel, data)

    def create(self, at: Location, rel: str, data: bytes) -> bool:
        """A PutObject with `If-None-Match: *`, which the server refuses with 412 when the key exists (AWS,
        SeaweedFS >= 4). pyarrow has no conditional writes: this one request goes through boto3."""
        from botocore.exceptions import BotoCoreError, ClientError

        client, key = self._client(at), self._key(at, rel)

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

        return at.call(f"create {at.path(rel)}", put)

    def touch(self, at: Location, rel: str) -> None:
        """S3 has no call to set a modification time: the object is written again."""
        at.put(rel, at.read_bytes(rel))

    def same_store(self, other: object) -> bool:
        """Whether a copy from `other` can stay on the server: another prefix behind the same endpoint."""
        return isinstance(other, S3Backend) and other.endpoint == self.endpoint

    def copy_in(self, at: Location, to_rel: str, source: Location, rel: str) -> CopyKind:
        """One CopyObject request (pyarrow's `copy_file`); the object appears at `to_rel` only once complete (up to
        S3's 5 GB limit for a single copy, far above any shard)."""
        at.call(f"copy {source.path(rel)} to {at.path(to_rel)}", at.fs.copy_file, source.full(rel), at.full(to_rel))
        return "server-side copy"

    # -- errors -----------------------------------------------------------------------------------------------

    def hint(self, exc: OSError) -> str:
        """What to check after a failed S3 request: the endpoint, the bucket or the credentials."""
        code = _aws_code(exc)
        message = str(exc) or type(exc).__name__
        if code == "NETWORK_CONNECTION" or "curlCode" in message:
            endpoint = (
                f"{self.endpoint.url} (from {self.endpoint.source})"
                if self.endpoint
                else f"AWS (no {' / '.join(ENDPOINT_ENV_VARS)} set)"
            )
            return (
                f"cannot reach the S3 endpoint {endpoint}; check that the server is running and that "
                f"{ENDPOINT_ENV_VARS[0]} or AWS_ENDPOINT_URL points at it (e.g. http://127.0.0.1:8333)"
            )
        if code == "NO_SUCH_BUCKET":
            return f"bucket {self.bucket!r} does not exist; create it first or fix the run root"
        if code in _AUTH_CODES or "HTTP status 403" in message:
            return (
                "access denied; check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                f"AWS_PROFILE) and that they may use bucket {self.bucket!r}"
            )
        if isinstance(exc, FileNotFoundError):
            return "the object does not exist; is this the right run root, and did the stage finish?"
        return (
            f"check the S3 endpoint ({', '.join(ENDPOINT_ENV_VARS)}), the credentials and that "
            f"bucket {self.bucket!r} exists"
        )

    # -- boto3 ------------------------------------------------------------------------------------------------

    def _client(self, at: Location) -> Any:
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
                    config=BotoConfig(connect_timeout=at.connect_timeout, retries={"max_attempts": 1},
                                      max_pool_connections=32))
            return self._client_cache

    def _key(self, at: Location, rel: str) -> str:
        return at.full(rel).removeprefix(f"{self.bucket}/")
