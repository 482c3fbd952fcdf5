"""The one way tasks, builders and fingerprints reach a user's files, local or `s3://`.

Every path goes through the run store's filesystem set-up (`longeval.store`: the S3 endpoint from
LONGEVAL_S3_ENDPOINT / AWS_ENDPOINT_URL, the region, credentials from the environment, retries of transient
errors), so a data file on S3 behaves like a run root there. Tasks import this module, never the store.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.fs as pafs

from longeval.store import filesystem, read_uri

__all__ = ["filesystem", "fingerprint", "read_uri"]


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
