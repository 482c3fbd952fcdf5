"""Generated instance shards, cached by content and reused across runs and models.

Generation is pure: a shard's rows depend only on the task, its resolved parameters, the length, the seed and
shard range, the tokenizer (vocabulary and chat template), the prompt format, the output budget, the data behind
it and the generator's version (with the task's prompt-template fingerprint). The cache key is a hash of exactly
those, so two runs (or two models sharing a tokenizer) that would generate the same shard read it instead;
anything that changes the rows changes the key.

Files named by a task's parameters (a TAIL dataset, an MRCR writings pool) enter the key by content: their bytes
for a file, names, sizes and modification times for a folder. A task that reads from `s3://` is not cached,
since fingerprinting remote data would cost what generation costs.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from longeval import __version__
from longeval.plan import ShardSpec
from longeval.records import INSTANCE_SCHEMA, content_id
from longeval.store import RunRoot
from longeval.tasks import get_task
from longeval.tasks.base import output_budget

log = logging.getLogger(__name__)

STAGE = "instances"


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

    def load(self, key: str | None) -> pa.Table | None:
        if key is None or not self.root.has(STAGE, key):
            return None
        try:
            return self.root.read_shard(STAGE, key, INSTANCE_SCHEMA)
        except Exception as exc:  # a damaged cache entry is regenerated, never fatal
            log.warning("instance cache entry %s unreadable (%s); generating it again", key, exc)
            return None

    def save(self, key: str | None, table: pa.Table) -> None:
        if key is not None:
            self.root.write_table(STAGE, key, table)


def cache_uri(store_root: str, configured: str | None) -> str:
    """Where the cache lives: `store.instance_cache`, else `<store.root>/_cache` (shared by every run there)."""
    return configured or f"{store_root.rstrip('/')}/_cache"
