"""Reading the official LongBench v2 data file (Bai et al., 2025, §3).

longeval cannot download the data: the user points `suite.data.longbench_v2_path` at the released file
(`data.json` from the Hugging Face data set THUDM/LongBench-v2, 503 items), as a JSON list, JSON Lines or
Parquet, on local disk, as `file://` or as `s3://bucket/key`. Every item is checked once, when the file is
read, so a bad item fails at generation with its index, `_id` and field instead of deep inside a run.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from longeval.errors import ConfigError, DataFileError, StoreError
from longeval.store.location import list_files, read_uri, stat

DIFFICULTIES = ("easy", "hard")
LENGTHS = ("short", "medium", "long")
"""Length buckets by words: short < 32k, medium 32k–128k, long > 128k (§3.4)."""
LETTERS = ("A", "B", "C", "D")
DOMAINS = (
    "Single-Document QA",
    "Multi-Document QA",
    "Long In-context Learning",
    "Long-dialogue History Understanding",
    "Code Repository Understanding",
    "Long Structured Data Understanding",
)
"""The six task categories in the paper's order; the data's `domain` values."""

FIELDS = ("_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A", "choice_B", "choice_C",
          "choice_D", "answer", "context")

EXPECTED = (
    "the official LongBench v2 data (data.json from huggingface.co/datasets/THUDM/LongBench-v2) as a JSON list, "
    "JSON Lines or Parquet file of records with string fields _id, domain, sub_domain, difficulty (easy|hard), "
    "length (short|medium|long), question, choice_A, choice_B, choice_C, choice_D, answer (A|B|C|D) and context"
)
PATH_KEY = "suite.data.longbench_v2_path"


@dataclass(frozen=True)
class LongBenchV2Item:
    """One multiple-choice question with its document, as released."""

    item_id: str
    """The data's `_id`."""
    domain: str
    sub_domain: str
    difficulty: str
    """easy | hard"""
    length: str
    """short | medium | long: the document's length bucket in words, not our target length."""
    question: str
    choices: tuple[str, str, str, str]
    """choice_A … choice_D"""
    answer: str
    """The right letter, A–D."""
    context: str


@dataclass(frozen=True)
class LongBenchV2Data:
    """The parsed file: its items in file order, and where they came from."""

    path: str
    items: tuple[LongBenchV2Item, ...]

    def by_id(self, item_id: str) -> LongBenchV2Item | None:
        return next((item for item in self.items if item.item_id == item_id), None)


def data_error(path: str | None, why: str, *, key: str = PATH_KEY, example: str = "/path/to/data.json"
               ) -> DataFileError:
    """An error that names the file, the problem, the expected format and the setting to change."""
    return DataFileError(f"LongBench v2 file {path!r}: {why}. Expected {EXPECTED}; set {key}={example}")


DATA_SUFFIXES = (".json", ".jsonl", ".parquet")


def _directory_error(path: str, names: list[str], key: str) -> DataFileError:
    """A folder given where the data file belongs: name the data file inside it when there is one."""
    found = sorted(n for n in names if n.endswith(DATA_SUFFIXES))
    pick = "data.json" if "data.json" in found else (found[0] if found else "data.json")
    inside = f"; it holds {', '.join(found[:5])}" if found else ", and holds no .json, .jsonl or .parquet file"
    return data_error(path, f"is a directory, not a file{inside}", key=key, example=f"{path.rstrip('/')}/{pick}")


def load_longbench_v2(path: str | None, *, key: str = PATH_KEY) -> LongBenchV2Data:
    """Read and check the whole file; `key` is the config setting named in errors."""
    if not path:
        raise DataFileError(
            f"LongBench v2 needs its data file and {key} is not set. longeval cannot download it: get data.json "
            f"from huggingface.co/datasets/THUDM/LongBench-v2 and set {key}=/path/to/data.json. Expected {EXPECTED}"
        )
    raw = _read_bytes(path, key)
    records = _parse(path, raw, key)
    if not records:
        raise data_error(path, "the file holds no items", key=key)
    items = tuple(_item(path, i, record, key) for i, record in enumerate(records))
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if item.item_id in seen:
            raise data_error(path, f"item {i} repeats _id {item.item_id!r} of item {seen[item.item_id]}", key=key)
        seen[item.item_id] = i
    return LongBenchV2Data(path=path, items=items)


def _read_bytes(path: str, key: str) -> bytes:
    if "://" not in path:
        file = Path(path).expanduser()
        if file.is_dir():
            raise _directory_error(path, [p.name for p in file.iterdir() if p.is_file()], key)
        if not file.is_file():
            raise data_error(path, "file not found", key=key)
        return file.read_bytes()
    try:  # s3:// through the run's filesystem layer: the same endpoint, credentials and retries
        if stat(path).type == pafs.FileType.Directory:  # a folder, or an S3 prefix with objects under it
            raise _directory_error(path, list_files(path), key)
        return read_uri(path)
    except FileNotFoundError as exc:
        raise data_error(path, "file not found", key=key) from exc
    except (StoreError, OSError, ValueError) as exc:
        raise data_error(path, f"cannot read it ({type(exc).__name__}: {exc})", key=key) from exc


def _parse(path: str, raw: bytes, key: str) -> list[Any]:
    """Parquet by its magic bytes, a JSON list by its opening bracket, else JSON Lines."""
    if raw[:4] == b"PAR1":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(io.BytesIO(raw)).to_pylist()
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise data_error(path, f"not a readable Parquet file ({exc})", key=key) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise data_error(path, f"not UTF-8 text ({exc})", key=key) from exc
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except ValueError as exc:
            raise data_error(path, f"not valid JSON ({exc})", key=key) from exc
        return records
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise data_error(path, f"line {number} is not a JSON record ({exc})", key=key) from exc
    return records


def _item(path: str, index: int, record: Any, key: str) -> LongBenchV2Item:
    if not isinstance(record, dict):
        raise data_error(path, f"item {index} has type {type(record).__name__}, expected a JSON object", key=key)
    where = f"item {index} (_id {record.get('_id')!r})"
    for name in FIELDS:
        if name not in record or record[name] is None:
            raise data_error(path, f"{where} has no field {name!r}", key=key)
        if not isinstance(record[name], str):
            raise data_error(path, f"{where}: field {name!r} has type {type(record[name]).__name__}, expected a string",
                             key=key)
    allowed = {"difficulty": DIFFICULTIES, "length": LENGTHS, "answer": LETTERS}
    for name, values in allowed.items():
        if record[name] not in values:
            raise data_error(path, f"{where}: field {name!r} is {record[name]!r}, not one of {'|'.join(values)}",
                             key=key)
    return LongBenchV2Item(
        item_id=record["_id"], domain=record["domain"], sub_domain=record["sub_domain"],
        difficulty=record["difficulty"], length=record["length"], question=record["question"],
        choices=(record["choice_A"], record["choice_B"], record["choice_C"], record["choice_D"]),
        answer=record["answer"], context=record["context"],
    )


def select(
    data: LongBenchV2Data, *, domains: Sequence[str] = (), difficulties: Sequence[str] = (),
    lengths: Sequence[str] = (),
) -> tuple[LongBenchV2Item, ...]:
    """The items that pass every filter, in file order; an empty filter passes everything.

    A filter value that cannot match (a misspelt domain, a difficulty that does not exist) is a ConfigError
    rather than an empty selection, which would look like a data problem later.
    """
    _check_values("difficulties", difficulties, DIFFICULTIES)
    _check_values("lengths", lengths, LENGTHS)
    present = sorted({item.domain for item in data.items})
    _check_values("domains", domains, tuple(present))
    return tuple(
        item for item in data.items
        if (not domains or item.domain in domains)
        and (not difficulties or item.difficulty in difficulties)
        and (not lengths or item.length in lengths)
    )


def _check_values(name: str, given: Sequence[str], known: Sequence[str]) -> None:
    if isinstance(given, str):
        raise ConfigError(f"suite.params.longbench_v2.{name} must be a list, e.g. [{given!r}], not a string")
    unknown = [v for v in given if v not in known]
    if unknown:
        raise ConfigError(
            f"suite.params.longbench_v2.{name}: {', '.join(map(repr, unknown))} not known; "
            f"use values from: {', '.join(known)}"
        )
