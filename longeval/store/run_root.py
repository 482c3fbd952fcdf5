"""A run root: the folder (or `s3://` prefix) of one evaluation run, its Parquet shards and their commit records.

Every stage writes its output as Parquet shards under `<root>/<stage>/<name>.parquet`. A shard is committed in
two steps: the data is written atomically (a local temp file renamed into place; on S3 a single object upload,
which only becomes visible when complete), then a small commit record `<root>/_manifest/<stage>/<name>.json`
(rows, bytes, sha256) is written. Only shards with a commit record exist for readers, so a shard cut short by a
crash, or half-written by a store without atomic publish, is never read. Resume is therefore just "skip the
names in `shard_names(stage)`": a crash loses at most the shards in flight.

Files are reached through `longeval.store.location` (URI parsing, the S3 endpoint and credentials, listing, retries of
transient S3 errors for up to `patience_s` seconds); `probe()` checks a store once, quickly, so a mistyped
endpoint fails at once instead.

`RunRoot` is the one object callers hold; its jobs are parts of their own: `commits` (writing shards and their
commit records), `listings` (which shards are finished, and the listings a root remembers), `stage_reads` (whole
stages and shards' columns, and what is kept of them), `row_group_reads` (a replica's reads of parts of a shard);
`shard_format` is the Parquet layout they share. What stays here is the root's identity and its small files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longeval.errors import StoreError
from longeval.store.commits import ShardCommits
from longeval.store.listings import RememberedListings
from longeval.store.location import Location
from longeval.store.row_group_reads import RowGroupReads
from longeval.store.shard_format import MANIFEST
from longeval.store.stage_reads import StageReads

__all__ = ["RunRoot"]


class RunRoot(ShardCommits, StageReads, RowGroupReads, RememberedListings):
    """The folder (or S3 prefix) that holds everything one evaluation run writes.

    `uri` and the retry settings are those of `longeval.store.location.Location`, which every file access goes through.

    `remember_listings`: list each stage folder once and keep the names, updated by this object's own writes and
    deletes (on S3 a listing is a request per 1,000 keys, and a driver asks for a stage's shards a dozen times
    in one command). Only for a process that is the stage's one writer, or whose readers want one snapshot:
    while other processes write a stage (generation actors, engine replicas), the caller says so with
    `written_elsewhere(stage)`, and that stage is listed afresh on every call until the block ends.

    Its methods come from its parts (`ShardCommits`, `StageReads`, `RowGroupReads`, `RememberedListings`), which
    share its state; this class holds the location, the root's identity and its small files.
    """

    def __init__(
        self, uri: str, *, attempts: int = 3, connect_timeout: float = 5.0, patience_s: float | None = None,
        remember_listings: bool = False,
    ) -> None:
        # A Location pickles without its filesystem, so a RunRoot shipped to a Ray worker rebuilds it there.
        self._loc = Location(uri, attempts=attempts, connect_timeout=connect_timeout, patience_s=patience_s)
        self._start_listings(remember_listings)
        self._start_reads()

    def __getstate__(self) -> dict[str, Any]:
        # Another process sees other writes: it starts with no remembered listings, nor what was kept with them.
        fresh = object.__new__(type(self))
        fresh._start_listings(remember=False)
        fresh._start_reads()
        return {**self.__dict__, **fresh.__dict__}

    # -- identity ---------------------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The normalised run root: an absolute path, `file:///...` or `s3://bucket/prefix`."""
        return self._loc.uri

    @property
    def location(self) -> Location:
        """The location every file access of the root goes through (its paths: `location.join(stage, file)`)."""
        return self._loc

    def path(self, *parts: str) -> str:
        """Where `parts` live under the root, as a URI-ish string for messages and logs."""
        return self._loc.path(self._rel(*parts) if parts else "")

    def local_path(self) -> Path | None:
        """The root as a local `Path`, or None when it is remote."""
        return Path(self._loc.base) if self._loc.kind == "local" else None

    @property
    def remote(self) -> bool:
        """Whether the root is on S3, where a request costs what megabytes of transfer do."""
        return self._loc.kind == "s3"

    def __repr__(self) -> str:
        return f"RunRoot({self.uri!r})"

    def probe(self) -> None:
        """Reach the store once, without the long patience: a wrong endpoint, bucket or key fails now, with
        what to fix, instead of after minutes of retries."""
        patience, self._loc.patience_s = self._loc.patience_s, 0.0
        try:
            self._loc.files(self._rel(MANIFEST))
        finally:
            self._loc.patience_s = patience

    # -- small files ------------------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> None:
        """Write `obj` as indented, key-sorted JSON at `<root>/<name>`, atomically."""
        self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    def read_json(self, name: str) -> Any:
        return self._parse_json(name, self.read_text(name))

    def json_if_exists(self, name: str) -> Any:
        """`read_json`, or None when there is no file: one request (none again on a root that remembers
        listings, `read_if_exists`)."""
        raw = self.read_if_exists(name)
        return None if raw is None else self._parse_json(name, raw.decode("utf-8"))

    def _parse_json(self, name: str, text: str) -> Any:
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
        self._loc.write_bytes(self._rel(name), data)
        self._wrote(self._rel(name))

    def create_bytes(self, name: str, data: bytes) -> bool:
        """Write bytes at `<root>/<name>` only if nothing is there; True when this call created the file
        (`Location.create`: the store's atomic first-writer-wins, for the run root's lease)."""
        created = self._loc.create(self._rel(name), data)
        if created:
            self._wrote(self._rel(name))
        return created

    def files(self, folder: str) -> list[str]:
        """Base names of the files directly inside `<root>/<folder>` (none when it does not exist), listed afresh
        whatever `remember_listings` says: for folders other processes write (the lease's claims)."""
        return self._loc.files(self._rel(folder))

    def delete(self, name: str) -> None:
        """Delete the file at `<root>/<name>`; a file already gone is fine."""
        self._loc.delete(self._rel(name), missing_ok=True)
        self._removed(self._rel(name))

    def read_if_exists(self, name: str) -> bytes | None:
        """The bytes at `<root>/<name>`, None when there is no file: one request where `exists` and `read_bytes`
        take two. A root that remembers listings reads each such file once (a command's one snapshot of the root:
        a report asks for config.yaml in every check), until it writes or deletes it itself."""
        rel = self._rel(name)
        if self._listed is not None and rel in self._small:
            return self._small[rel]
        data = self._loc.read_if_exists(rel)
        if self._listed is not None:
            self._small[rel] = data
        return data

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def read_bytes(self, name: str) -> bytes:
        """The bytes at `<root>/<name>` (S3 through the same endpoint, credentials and retries as the run)."""
        return self._loc.read_bytes(self._rel(name))

    def exists(self, name: str) -> bool:
        """Whether a file (not a folder) exists at `<root>/<name>`."""
        return self._loc.exists(self._rel(name))

    # -- internals --------------------------------------------------------------------------------------

    def _rel(self, *parts: str) -> str:
        """Join path parts under the root, refusing anything that would escape it."""
        return self._loc.join(*parts)

    def _commit_name(self, stage: str, name: str) -> str:
        return f"{MANIFEST}/{self._rel(stage)}/{name}.json"
