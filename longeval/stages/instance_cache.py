"""Generated instance shards, cached by content and reused across runs and models.

Generation is pure: a shard's rows depend only on the task, its resolved parameters, the length, the seed and
shard range, the tokenizer (vocabulary and chat template), the prompt format, the output budget, the data behind
it and the generator's version (with the task's prompt-template fingerprint). The cache key is a hash of exactly
those, so two runs (or two models sharing a tokenizer) that would generate the same shard read it instead;
anything that changes the rows changes the key.

Files named by a task's parameters (a TAIL dataset, an MRCR writings pool) enter the key by content: their bytes
for a file, names, sizes and modification times for a folder. A task that reads from `s3://` is not cached,
since fingerprinting remote data would cost what generation costs.

Entries move as files, never decoded and encoded again (`RunRoot.copy_shard`): a miss writes the run root's shard
once and copies it into the cache, a hit copies the cached file into the run root, each with its commit record.
Locally a copy is a hard link (the cache then costs directory entries, not a second copy of the bytes), on S3 a
server-side copy. `prune` removes entries by age and total size (`longeval cache prune`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from longeval import __version__
from longeval.errors import ConfigError, StoreError
from longeval.planning.plan import ShardSpec
from longeval.records import content_id
from longeval.store.commits import CopiedShard
from longeval.store.listings import StoredShard
from longeval.store.run_root import RunRoot
from longeval.tasks import get_task
from longeval.tasks.base import output_budget

log = logging.getLogger(__name__)

STAGE = "instances"
DAMAGED = f"_damaged/{STAGE}"
"""Where damaged entries were set aside (`RunRoot.read_shard`, `RunRoot.copy_shard`); pruned like entries."""


def shard_key(ctx: Any, spec: ShardSpec) -> str | None:
    """The content key of a shard, or None when it reads data we do not fingerprint (s3://)."""
    task = get_task(spec.task, ctx.task_overrides)
    params = asdict(task.params) if hasattr(task.params, "__dataclass_fields__") else dict(vars(task.params))
    files = {}
    for name, value in sorted(params.items()):
        if isinstance(value, str) and value.startswith("s3://"):
            return None
        if isinstance(value, str) and value and "/" in value and Path(value).expanduser().exists():
            files[name] = path_fingerprint(Path(value).expanduser())
    data = asdict(ctx.data)
    if any(isinstance(v, str) and v.startswith("s3://") for v in data.values()):
        return None
    return content_id(
        "instances", __version__, task.generator_version, spec.task, params, files, spec.target_length, spec.seed,
        spec.shard_index, spec.start, spec.stop, ctx.encoder.fingerprint, ctx.fmt.identity(), ctx.data_id,
        output_budget(task, ctx.fmt, spec.target_length), *((spec.population,) if spec.shuffled else ()),
    )


def path_fingerprint(path: Path) -> str:
    """A file's bytes, or a folder's file names, sizes and modification times."""
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.read_bytes())
        return h.hexdigest()[:16]
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        h.update(f"{file.relative_to(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


class InstanceCache:
    """Instance shards by content key under a folder or `s3://` prefix (committed like a run root's shards)."""

    def __init__(self, uri: str) -> None:
        self.root = RunRoot(uri)

    @property
    def uri(self) -> str:
        return self.root.uri

    def fetch(self, key: str | None, to: RunRoot, name: str) -> CopiedShard | None:
        """Publish the entry `key` as the instance shard `name` of the run root `to`, by copying its file; None
        on a miss.

        A damaged entry (its bytes no longer match its commit record) is set aside and counts as a miss with a
        warning, as does one that vanished mid-copy (a concurrent prune): the shard is generated again, never
        a failed run.
        """
        if key is None or not self.root.has(STAGE, key):
            return None
        try:
            copied = self.root.copy_shard(STAGE, key, to, name)
        except StoreError as exc:
            log.warning("instance cache entry %s unusable (%s); generating it again", key, exc)
            return None
        try:
            self.root.touch(STAGE, key)  # for least recently used pruning
        except StoreError as exc:  # a read-only shared cache still serves hits
            log.info("could not mark instance cache entry %s as used (%s)", key, exc)
        return copied

    def put(self, key: str | None, root: RunRoot, name: str) -> None:
        """Add the instance shard `name` that `root` has just written, under `key`, by copying its file (no
        check: this process wrote it a moment ago)."""
        if key is not None:
            root.copy_shard(STAGE, name, self.root, key, check=False)

    def entries(self) -> list[CacheEntry]:
        """Every entry, finished or not, and every damaged one set aside, oldest first."""
        local = self.root.local_path()
        found = []
        for stage in (STAGE, DAMAGED):
            for shard in self.root.stored_shards(stage):
                linked = False
                if local is not None and shard.data is not None:
                    with contextlib.suppress(FileNotFoundError):  # other hard links (run roots) keep the bytes
                        linked = os.stat(shard.data.path).st_nlink > 1
                found.append(CacheEntry(stage, shard, linked=linked))
        return sorted(found, key=lambda e: e.shard.mtime_ns)

    def remove(self, entry: CacheEntry) -> None:
        """Delete an entry, commit record first (`RunRoot.remove_shard`)."""
        self.root.remove_shard(entry.stage, entry.shard.name)


@dataclass(frozen=True)
class CacheEntry:
    """One cached shard (or a damaged one set aside) as it lies in the cache."""

    stage: str
    """`instances`, or `_damaged/instances` for an entry set aside."""
    shard: StoredShard
    linked: bool = False
    """A local entry whose data file has other hard links (run roots): removing it frees no disk."""

    @property
    def name(self) -> str:
        return self.shard.name

    @property
    def size(self) -> int:
        return self.shard.size

    @property
    def useful(self) -> bool:
        """A finished entry a run can read (an uncommitted or damaged one is dead weight)."""
        return self.stage == STAGE and self.shard.committed


@dataclass(frozen=True)
class PruneResult:
    """What `prune` removed (or would remove, in a dry run), in the order it chose them, and what it kept."""

    removed: list[CacheEntry]
    kept: list[CacheEntry]
    dry_run: bool

    @property
    def removed_bytes(self) -> int:
        return sum(e.size for e in self.removed)

    @property
    def kept_bytes(self) -> int:
        return sum(e.size for e in self.kept)

    @property
    def freed_bytes(self) -> int:
        """Disk space freed: the removed entries' bytes, except those of entries still linked from a run root."""
        return sum(e.size for e in self.removed if not e.linked)


def prune(
    uri: str, *, older_than_s: float | None = None, max_bytes: int | None = None, dry_run: bool = False,
    now: float | None = None,
) -> PruneResult:
    """Remove cache entries not written or used for `older_than_s` seconds, then the least recently used until
    the rest holds at most `max_bytes` (as listed: a hard-linked file counts in full). Uncommitted and damaged
    entries go first. An entry's time is its last write or hit (`InstanceCache.fetch` marks hits).

    Each entry loses its commit record before its data, so a crash mid-prune never leaves a committed entry
    without data, and a run hitting an entry being removed generates it again.
    """
    if older_than_s is None and max_bytes is None:
        raise ConfigError("prune needs an age or a size: give --older-than AGE (e.g. 30d) or --max-size SIZE "
                          "(e.g. 50GB), or both")
    cache = InstanceCache(uri)
    entries = sorted(cache.entries(), key=lambda e: (e.useful, e.shard.mtime_ns))
    cutoff_ns = None if older_than_s is None else int(((time.time() if now is None else now) - older_than_s) * 1e9)
    removed: list[CacheEntry] = []
    kept: list[CacheEntry] = []
    for entry in entries:
        (removed if cutoff_ns is not None and entry.shard.mtime_ns < cutoff_ns else kept).append(entry)
    if max_bytes is not None:
        total = sum(e.size for e in kept)
        while kept and total > max_bytes:
            total -= kept[0].size
            removed.append(kept.pop(0))
    if not dry_run:
        for entry in removed:
            cache.remove(entry)
    if removed:
        log.info("%s %d instance cache entries under %s", "would remove" if dry_run else "removed", len(removed), uri)
    return PruneResult(removed=removed, kept=kept, dry_run=dry_run)


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_age(text: str) -> float:
    """Seconds in an age such as `30d`, `12h`, `90m`, `45s` or `2w`."""
    if text.strip().startswith("-"):
        raise ConfigError(f"--older-than {text!r} is negative: it is how long an entry has gone unused, so give a "
                          f"positive age, e.g. --older-than {text.strip().lstrip('-') or '30d'}")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if match is None:
        raise ConfigError(f"--older-than {text!r} is not an age; give a number and a unit (s, m, h, d, w), "
                          "e.g. --older-than 30d or --older-than 12h")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def parse_size(text: str) -> int:
    """Bytes in a size such as `50GB`, `500MB`, `1.5TB` (powers of 1000), `2GiB` (powers of 1024) or `1000000`."""
    if text.strip().startswith("-"):
        raise ConfigError(f"--max-size {text!r} is negative: it is the most the cache may hold, so give a size of "
                          "0 or more, e.g. --max-size 50GB (0 empties the cache)")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise ConfigError(f"--max-size {text!r} is not a size; give a number and a unit (B, KB, MB, GB, TB, or "
                          "KiB, MiB, GiB, TiB), e.g. --max-size 50GB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def check_cache_location(store_root: str, configured: str | None) -> None:
    """Refuse a local cache under a folder that does not exist: a mistyped `store.root` or `store.instance_cache`
    would otherwise prune nothing and report `removed 0 entries` as if all were well. (An existing root without a
    `_cache` yet is fine: no run there cached anything.)"""
    key, value = ("store.instance_cache", configured) if configured else ("store.root", store_root)
    folder = RunRoot(value).local_path()
    if folder is not None and not folder.is_dir():
        what = "no such folder" if not folder.exists() else "not a folder"
        raise ConfigError(f"{key}={value}: {what} ({folder.resolve()}), so there is no instance cache to prune; "
                          f"check the path (the {'cache folder' if configured else 'folder your runs write under'})")


def cache_uri(store_root: str, configured: str | None) -> str:
    """Where the cache lives: `store.instance_cache`, else `<store.root>/_cache` (shared by every run there)."""
    return configured or f"{store_root.rstrip('/')}/_cache"
