"""Typed records at every stage boundary, and their Arrow schemas.

Stages exchange Arrow tables (Ray Data blocks, Parquet shards); inside a stage we work with these
dataclasses. `from_row` / `to_row` are the only places that know the column layout.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def content_id(*parts: Any) -> str:
    """A stable id from content: the same inputs give the same id on any machine and run."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class Instance:
    """One prompt to send, with everything its scorer needs."""

    instance_id: str
    family: str
    task: str
    context_id: str
    target_length: int
    input_tokens: int
    depth: float
    complexity: str
    prompt: str
    prompt_token_ids: list[int]
    answer_prefix: str
    max_new_tokens: int
    references: list[str]
    metric: str
    meta: str  # task-specific JSON for the scorer and for analysis
    seed: int
    shard_index: int
    index: int
    generator_version: str
    tokenizer_id: str

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Instance:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["prompt_token_ids"] = [int(t) for t in values["prompt_token_ids"]]
        values["references"] = [str(r) for r in values["references"]]
        return cls(**values)


INSTANCE_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("family", pa.string()),
        ("task", pa.string()),
        ("context_id", pa.string()),
        ("target_length", pa.int64()),
        ("input_tokens", pa.int64()),
        ("depth", pa.float64()),
        ("complexity", pa.string()),
        ("prompt", pa.large_string()),
        ("prompt_token_ids", pa.large_list(pa.int32())),
        ("answer_prefix", pa.string()),
        ("max_new_tokens", pa.int64()),
        ("references", pa.list_(pa.string())),
        ("metric", pa.string()),
        ("meta", pa.string()),
        ("seed", pa.int64()),
        ("shard_index", pa.int64()),
        ("index", pa.int64()),
        ("generator_version", pa.string()),
        ("tokenizer_id", pa.string()),
    ]
)


class ErrorKind(StrEnum):
    """Why a prediction failed: the head of its `error` string, `"<kind>: <detail>"` ("" when it did not fail).

    Run roots hold these strings, so `format` writes exactly what earlier versions wrote and `of` reads any of them.
    """

    PROMPT_TOO_LONG = "prompt_too_long"
    """Never sent: the prompt and its output budget exceed the engine's max_model_len. Final, scored 0."""
    ENGINE_ERROR = "engine_error"
    """The engine or API failed on it. Not final: the next run retries it."""

    def format(self, detail: str) -> str:  # replaces str.format, which means nothing for a kind
        """The `error` string of a prediction that failed this way."""
        return f"{self.value}: {detail}"

    @classmethod
    def of(cls, error: str) -> ErrorKind | None:
        """The kind of an `error` string: None for "" (no failure) and for a head this version does not know."""
        head = error.partition(":")[0]
        return cls(head) if head in cls._value2member_map_ else None

    def matches(self, errors: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        """`ErrorKind.of(e) is self` over an `error` column (null where the error is null)."""
        return pc.match_substring_regex(errors, f"^{re.escape(self.value)}(:|$)")


@dataclass(frozen=True)
class Prediction:
    """What the engine returned for one instance. A failure is data (`error`), never a dropped row."""

    instance_id: str
    model_id: str
    output: str
    output_tokens: int
    finish_reason: str
    cached_prompt_tokens: int
    latency_s: float
    error: str = ""  # "" when fine; else `ErrorKind.format`: "prompt_too_long: ...", "engine_error: ..."
    replica: str = ""
    """Which engine made it: pool, replica and restart (`pool0/r1#1`); "" for rows never sent."""
    node: str = ""
    """The Ray node the engine ran on."""
    engine_step: int | None = None
    """The step of its engine (counted over the engine's life) in which it finished: with `replica`, which
    batch ran it. None for rows never sent and for API models."""
    attempt: str | None = None
    """A fresh id per prediction row, stamped when it is written (`prediction_table`): a prediction redone after
    scoring differs from the one scored even with the same output. None in run roots written before it."""

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Prediction:
        values = {f.name: row.get(f.name) for f in fields(cls)}
        for name in ("replica", "node"):  # null in run roots written before they were recorded
            values[name] = values[name] or ""
        return cls(**values)


PREDICTION_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("model_id", pa.string()),
        ("output", pa.large_string()),
        ("output_tokens", pa.int64()),
        ("finish_reason", pa.string()),
        ("cached_prompt_tokens", pa.int64()),
        ("latency_s", pa.float64()),
        ("error", pa.string()),
        ("replica", pa.string()),
        ("node", pa.string()),
        ("engine_step", pa.int64()),
        ("attempt", pa.string()),
    ]
)


@dataclass(frozen=True)
class Score:
    """One scored instance. Group columns (task, length, depth, complexity) are copied in so summaries are
    group-bys."""

    instance_id: str
    model_id: str
    family: str
    task: str
    target_length: int
    depth: float
    metric: str
    score: float  # 0..1
    parsed_answer: str
    error_type: str  # "" | "null" (empty output) | "prompt_too_long" | "engine_error"
    extra: dict[str, float] = field(default_factory=dict)
    complexity: str = ""  # the instance's configuration label (SYNC "nodes=15", Michelangelo "ops=5", ...)
    prediction_fingerprint: str | None = None
    """The fingerprint of the prediction it scored (`longeval.run.consistency`): a report checks it against the
    instance's latest prediction. None in scores written before it was recorded."""

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["extra"] = json.dumps(self.extra, sort_keys=True)
        return row


SCORE_SCHEMA = pa.schema(
    [
        ("instance_id", pa.string()),
        ("model_id", pa.string()),
        ("family", pa.string()),
        ("task", pa.string()),
        ("target_length", pa.int64()),
        ("depth", pa.float64()),
        ("metric", pa.string()),
        ("score", pa.float64()),
        ("parsed_answer", pa.string()),
        ("error_type", pa.string()),
        ("extra", pa.string()),
        ("complexity", pa.string()),
        ("prediction_fingerprint", pa.string()),
    ]
)


def prediction_table(rows: list[dict[str, Any]] | dict[str, list[Any]]) -> pa.Table:
    """Prediction rows (dicts, or columns) as a `PREDICTION_SCHEMA` table, every row stamped with a fresh `attempt`:
    every writer of predictions builds its table here."""
    if isinstance(rows, dict):
        n = len(rows["instance_id"])
        return pa.Table.from_pydict({**rows, "attempt": _attempts(n)}, schema=PREDICTION_SCHEMA)
    return pa.Table.from_pylist([{**row, "attempt": a} for row, a in zip(rows, _attempts(len(rows)), strict=True)],
                                schema=PREDICTION_SCHEMA)


def _attempts(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def latest_predictions(preds: pa.Table, given_away: Collection[tuple[str, str]] = ()) -> pa.Table:
    """One prediction per instance: a final one if any (an engine error is replaced by its retry), the latest of
    those.

    `given_away`: (replica, instance id) pairs of prompts the driver took from a replica it declared lost and
    gave to another. Such a replica may still commit them (its host was cut off, not dead, and its upload landed
    when the link came back): that row gives way to any other final row of the instance."""
    seen: dict[str, int] = {}
    rank: dict[str, int] = {}  # 0 an engine error, 1 a final row given away, 2 a final row
    replicas = preds["replica"].to_pylist() if given_away else [None] * preds.num_rows  # a read may leave it out
    for i, (iid, err, replica) in enumerate(zip(preds["instance_id"].to_pylist(), preds["error"].to_pylist(),
                                                replicas, strict=True)):
        this = 0 if ErrorKind.of(err) is ErrorKind.ENGINE_ERROR else 1 if (replica, iid) in given_away else 2
        if iid not in seen or (this and this >= rank[iid]):
            seen[iid], rank[iid] = i, this
    return preds.take(pa.array(sorted(seen.values()), pa.int64()))
