"""The names of instance shards on disk: built and parsed here, nowhere else.

A generated shard is `<family>.<task>.L<target_length>.s<seed>.<shard_index:05d>` (`plan.ShardSpec`); the
follow-up instances of two-call tasks (`longeval.stages.followup`) are written beside it as `<that name>f<tag>`, the tag
a short content hash of their ids. Run roots hold these names, so the format never changes.

The predictions stage holds parts (`part-<hash>`, one per commit of a replica's writer) until the infer stage
merges them (`longeval.store.compact`) into one file per generated instance shard: `<its name>.p<tag>`, the tag a
short content hash of its rows. Predictions of instances in no shard go to `orphans.p<tag>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from longeval.errors import StoreError

PART_PREFIX = "part-"
"""Names of uncompacted prediction parts start with this (`RunRoot.write_part`)."""
ORPHANS = "orphans"
"""The compacted predictions of instances that no committed instance shard holds."""
_COMPACTED = re.compile(r"(?P<prefix>.+)\.p(?P<tag>[0-9a-f]+)")


def compacted_name(prefix: str, tag: str) -> str:
    """The name of the compacted predictions of the instance shard `prefix` (or of `ORPHANS`)."""
    return f"{prefix}.p{tag}"


def compacted_prefix(name: str) -> str | None:
    """The instance shard (or `ORPHANS`) a compacted predictions file belongs to; None for a part."""
    if name.startswith(PART_PREFIX):
        return None
    match = _COMPACTED.fullmatch(name)
    return match["prefix"] if match else None

_NAME = re.compile(
    r"(?P<family>[^./]+)\.(?P<task>[^./]+)\.L(?P<target_length>\d+)\.s(?P<seed>-?\d+)"
    r"\.(?P<shard_index>\d{5}|[1-9]\d{5,})(?:f(?P<followup>[0-9a-f]+))?"
)


@dataclass(frozen=True)
class ShardName:
    """One instance shard's name; `followup` is the tag of a follow-up shard ("" for a generated one)."""

    family: str
    task: str
    target_length: int
    seed: int
    shard_index: int
    followup: str = ""

    @property
    def prefix(self) -> str:
        """The generated shard's name: what its follow-up shards' names start with."""
        return f"{self.family}.{self.task}.L{self.target_length}.s{self.seed}.{self.shard_index:05d}"

    @property
    def text(self) -> str:
        return f"{self.prefix}f{self.followup}" if self.followup else self.prefix

    def __str__(self) -> str:
        return self.text

    @classmethod
    def of(cls, row: dict) -> ShardName:
        """The generated shard an instance row belongs to (a row of the instances stage, or its metadata)."""
        return cls(row["family"], row["task"], int(row["target_length"]), int(row["seed"]), int(row["shard_index"]))

    @classmethod
    def parse(cls, name: str) -> ShardName:
        """The parts of a shard name (without `.parquet`).

        Raises:
            StoreError: `name` is not an instance shard's name.
        """
        match = _NAME.fullmatch(name)
        if match is None:
            raise StoreError(f"{name!r} is not an instance shard name "
                             "(<family>.<task>.L<length>.s<seed>.<index:05d>, optionally f<tag>)")
        return cls(match["family"], match["task"], int(match["target_length"]), int(match["seed"]),
                   int(match["shard_index"]), match["followup"] or "")
