"""The built TAIL benchmark on disk (format version 1): what the builder writes and the evaluation reads.

A folder (local, `file://` or `s3://`) with three files:

- `manifest.json`: `{"format": "longeval-tail", "version": 1, "generator_model": ..., "seed": ..., ...}` plus
  whatever the builder records (segment size, depths, prompt fingerprint, domains and their sources);
- `questions.parquet`: one row per accepted question: question_id, domain, gold_segment, depth (fraction),
  question, options (six strings), answer (A–F), gold_text, generator_model, provenance (JSON);
- `segments.parquet`: the domains' composed documents as (domain, index, text), index 0 … n-1 per domain.

Questions hold only the gold segment's index: the test documents are cut from `segments` at evaluation time, in
the evaluated model's tokens, at every target length (§3.3), so one build serves every model and length. The
reader checks everything once and names the file, row, `question_id` and field of the first problem.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from longeval.errors import DataFileError, StoreError
from longeval.records import content_id
from longeval.store.location import filesystem
from longeval.tasks.tail import prompts
from longeval.tasks.tail.documents import SEGMENT_WORDS, Domain
from longeval.tasks.tail.prompts import LETTERS
from longeval.tasks.tail.qa import Question, Slot, provenance

FORMAT = "longeval-tail"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
QUESTIONS_FILE = "questions.parquet"
SEGMENTS_FILE = "segments.parquet"
DATASET_KEY = "suite.params.tail.dataset"
QUESTION_FIELDS = ("question_id", "domain", "gold_segment", "depth", "question", "options", "answer", "gold_text",
                   "generator_model", "provenance")
SEGMENT_FIELDS = ("domain", "index", "text")
EXPECTED = (
    f"a folder written by the TAIL builder with {MANIFEST_FILE} (format {FORMAT!r}, version {FORMAT_VERSION}, "
    f"generator_model, seed), {QUESTIONS_FILE} (columns {', '.join(QUESTION_FIELDS)}; options = six strings, "
    f"answer = A-F, depth in [0, 1]) and {SEGMENTS_FILE} (columns {', '.join(SEGMENT_FIELDS)})"
)


@dataclass(frozen=True)
class TailQuestion:
    """One accepted question: a row of questions.parquet."""

    question_id: str
    domain: str
    gold_segment: int
    depth: float
    """The target depth, a fraction in [0, 1]: where the gold segment is placed in every test document."""
    question: str
    options: tuple[str, ...]
    answer: str
    gold_text: str
    generator_model: str
    provenance: str = "{}"
    """JSON: every attempt of Algorithm 1 that led here (see `qa.provenance`)."""

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["options"] = list(self.options)
        return row


@dataclass(frozen=True)
class Manifest:
    """manifest.json: the format version, how the benchmark was built, and anything else the builder adds."""

    version: int
    generator_model: str
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, "format": FORMAT, "version": self.version, "generator_model": self.generator_model,
                "seed": self.seed}


@dataclass(frozen=True)
class TailDataset:
    """A parsed benchmark: its questions in file order, each domain's segments, and a hash of the three files."""

    path: str
    manifest: Manifest
    questions: tuple[TailQuestion, ...]
    segments: dict[str, tuple[str, ...]]
    fingerprint: str

    @property
    def depths(self) -> tuple[float, ...]:
        return tuple(sorted({q.depth for q in self.questions}))


def question_id(domain_fingerprint: str, segment: int, depth: float, question: Question) -> str:
    """A content id: the same question on the same text gets the same id in every build."""
    return content_id("tail", domain_fingerprint, int(segment), float(depth), question.question,
                      list(question.options), question.answer)


def accepted_question(slot: Slot, domain: Domain, *, generator_model: str,
                      question: Question | None = None) -> TailQuestion:
    """The row of an ACCEPTED slot (ValueError otherwise): its question, gold segment and provenance.

    `question` replaces the accepted one, e.g. with its options shuffled (`qa.shuffle_options`); the provenance
    then records it as `final_question` next to the attempts that produced the original.
    """
    if slot.question is None:
        raise ValueError(f"slot at depth {slot.depth} of {slot.domain!r} has no accepted question ({slot.stage})")
    final = question or slot.question
    record = provenance(slot)
    if final != slot.question:
        record = json.dumps({**json.loads(record), "final_question": asdict(final)}, ensure_ascii=False,
                            sort_keys=True)
    return TailQuestion(
        question_id=question_id(domain.fingerprint, slot.segment, slot.depth, final), domain=domain.name,
        gold_segment=slot.segment, depth=slot.depth, question=final.question, options=tuple(final.options),
        answer=final.answer, gold_text=domain.segments[slot.segment], generator_model=generator_model,
        provenance=record,
    )


def make_manifest(*, generator_model: str, seed: int, domains: Sequence[Domain] = (), **extra: Any) -> Manifest:
    """A manifest recording the prompts, the segment size and each domain's sources and fingerprint."""
    info = {
        "segment_words": SEGMENT_WORDS,
        "prompts_version": prompts.PROMPTS_VERSION,
        "prompt_fingerprint": prompts.fingerprint(),
        "domains": {d.name: {"fingerprint": d.fingerprint, "sources": list(d.sources), "segments": len(d.segments)}
                    for d in domains},
    }
    return Manifest(version=FORMAT_VERSION, generator_model=generator_model, seed=int(seed), extra={**info, **extra})


# ---------------------------------------------------------------------------------------------------- writing


def write_tail_dataset(path: str, questions: Sequence[TailQuestion], segments: Mapping[str, Sequence[str]],
                       manifest: Manifest) -> None:
    """Write the three files under `path` (created if missing), segments first and the manifest last."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, base = _filesystem(path)
    fs.create_dir(base, recursive=True)
    seg_rows = [{"domain": d, "index": i, "text": t} for d, texts in segments.items() for i, t in enumerate(texts)]
    seg_schema = pa.schema([("domain", pa.string()), ("index", pa.int64()), ("text", pa.string())])
    q_schema = pa.schema([("question_id", pa.string()), ("domain", pa.string()), ("gold_segment", pa.int64()),
                          ("depth", pa.float64()), ("question", pa.string()), ("options", pa.list_(pa.string())),
                          ("answer", pa.string()), ("gold_text", pa.string()), ("generator_model", pa.string()),
                          ("provenance", pa.string())])
    for name, rows, schema in ((SEGMENTS_FILE, seg_rows, seg_schema),
                               (QUESTIONS_FILE, [q.to_row() for q in questions], q_schema)):
        with fs.open_output_stream(f"{base}/{name}") as sink:
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink)
    with fs.open_output_stream(f"{base}/{MANIFEST_FILE}") as sink:
        sink.write(json.dumps(manifest.to_dict(), indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8"))


# ---------------------------------------------------------------------------------------------------- reading


def dataset_error(path: str, why: str, *, key: str = DATASET_KEY) -> DataFileError:
    """An error naming the folder, the problem, the expected layout and the setting."""
    return DataFileError(f"TAIL dataset {path!r}: {why}. Expected {EXPECTED}; set {key}=/path/to/folder")


def load_tail_dataset(path: str | None, *, key: str = DATASET_KEY) -> TailDataset:
    """Read and check a built benchmark; `key` is the setting named in errors."""
    if not path:
        raise DataFileError(
            f"TAIL needs a built benchmark and {key} is not set. Build one from your documents "
            f"(<root>/<domain>/*.txt|md|pdf) with the TAIL builder, then set {key}=/path/to/folder. Expected {EXPECTED}"
        )
    fs, base = _filesystem(path, key=key)
    raw = {name: _read(fs, base, path, name, key) for name in (MANIFEST_FILE, QUESTIONS_FILE, SEGMENTS_FILE)}
    manifest = _manifest(path, raw[MANIFEST_FILE], key)
    segments = _segments(path, _rows(path, SEGMENTS_FILE, raw[SEGMENTS_FILE], key), key)
    questions = _questions(path, _rows(path, QUESTIONS_FILE, raw[QUESTIONS_FILE], key), segments, key)
    digest = hashlib.sha256()
    for name in (MANIFEST_FILE, QUESTIONS_FILE, SEGMENTS_FILE):
        digest.update(hashlib.sha256(raw[name]).digest())
    return TailDataset(path=path, manifest=manifest, questions=questions, segments=segments,
                       fingerprint=digest.hexdigest()[:16])


def _filesystem(path: str, *, key: str = DATASET_KEY):
    try:
        fs, base = filesystem(path)  # s3:// with the run's endpoint and credentials, like every other path
        return fs, base.rstrip("/")
    except (OSError, ValueError, StoreError) as exc:  # bad URIs and S3 set-up problems
        raise dataset_error(path, f"cannot open it ({type(exc).__name__}: {exc})", key=key) from exc


def _read(fs, base: str, path: str, name: str, key: str) -> bytes:
    import pyarrow.fs as pafs

    try:
        folder = fs.get_file_info(base)
        if folder.type == pafs.FileType.NotFound:
            raise dataset_error(path, "folder not found", key=key)
        if folder.type != pafs.FileType.Directory:
            raise dataset_error(path, "is a file, not a folder", key=key)
        if fs.get_file_info(f"{base}/{name}").type != pafs.FileType.File:
            raise dataset_error(path, f"has no {name}", key=key)
        with fs.open_input_stream(f"{base}/{name}") as stream:
            return stream.read()
    except OSError as exc:
        raise dataset_error(path, f"cannot read {name} ({exc})", key=key) from exc


def _manifest(path: str, raw: bytes, key: str) -> Manifest:
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise dataset_error(path, f"{MANIFEST_FILE} is not valid JSON ({exc})", key=key) from exc
    if not isinstance(data, dict):
        raise dataset_error(path, f"{MANIFEST_FILE} holds a {type(data).__name__}, expected a JSON object", key=key)
    if data.get("format", FORMAT) != FORMAT:
        raise dataset_error(path, f"{MANIFEST_FILE} has format {data.get('format')!r}, not {FORMAT!r}", key=key)
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise dataset_error(path, f"{MANIFEST_FILE} has no valid 'version' (got {version!r})", key=key)
    if version > FORMAT_VERSION:
        raise dataset_error(path, f"{MANIFEST_FILE} is format version {version}, newer than this longeval reads "
                                  f"({FORMAT_VERSION}); upgrade longeval", key=key)
    generator, seed = data.get("generator_model"), data.get("seed")
    if not isinstance(generator, str) or not generator:
        raise dataset_error(path, f"{MANIFEST_FILE} has no 'generator_model' string", key=key)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise dataset_error(path, f"{MANIFEST_FILE} has no integer 'seed' (got {seed!r})", key=key)
    extra = {k: v for k, v in data.items() if k not in ("format", "version", "generator_model", "seed")}
    return Manifest(version=version, generator_model=generator, seed=seed, extra=extra)


def _rows(path: str, name: str, raw: bytes, key: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(io.BytesIO(raw)).to_pylist()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise dataset_error(path, f"{name} is not a readable Parquet file ({exc})", key=key) from exc


def _require(path: str, name: str, where: str, row: dict[str, Any], fields: Sequence[str], key: str) -> None:
    for f in fields:
        if row.get(f) is None:
            raise dataset_error(path, f"{name} {where} has no {f!r}", key=key)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _segments(path: str, rows: list[dict[str, Any]], key: str) -> dict[str, tuple[str, ...]]:
    by_domain: dict[str, dict[int, str]] = {}
    for number, row in enumerate(rows):
        where = f"row {number}"
        _require(path, SEGMENTS_FILE, where, row, SEGMENT_FIELDS, key)
        domain, index, text = row["domain"], row["index"], row["text"]
        if not isinstance(domain, str) or not domain or not _is_int(index) or index < 0 or not isinstance(text, str):
            raise dataset_error(path, f"{SEGMENTS_FILE} {where}: expected a domain name, an index >= 0 and a text, "
                                      f"got ({domain!r}, {index!r}, {type(text).__name__})", key=key)
        texts = by_domain.setdefault(domain, {})
        if index in texts:
            raise dataset_error(path, f"{SEGMENTS_FILE} {where} repeats segment {index} of domain {domain!r}", key=key)
        texts[index] = text
    if not by_domain:
        raise dataset_error(path, f"{SEGMENTS_FILE} holds no segments", key=key)
    out: dict[str, tuple[str, ...]] = {}
    for domain, texts in sorted(by_domain.items()):
        missing = sorted(set(range(len(texts))) - set(texts))
        if missing:
            raise dataset_error(path, f"{SEGMENTS_FILE}: domain {domain!r} lacks segment {missing[0]} "
                                      f"(indices must run 0 … n-1)", key=key)
        out[domain] = tuple(texts[i] for i in range(len(texts)))
    return out


def _questions(path: str, rows: list[dict[str, Any]], segments: Mapping[str, tuple[str, ...]],
               key: str) -> tuple[TailQuestion, ...]:
    if not rows:
        raise dataset_error(path, f"{QUESTIONS_FILE} holds no questions", key=key)
    seen: dict[str, int] = {}
    out = []
    for number, row in enumerate(rows):
        where = f"row {number} (question_id {row.get('question_id')!r})"
        _require(path, QUESTIONS_FILE, where, row, QUESTION_FIELDS, key)
        for name in ("question_id", "domain", "question", "answer", "gold_text", "generator_model", "provenance"):
            if not isinstance(row[name], str):
                raise dataset_error(path, f"{QUESTIONS_FILE} {where}: {name!r} has type {type(row[name]).__name__}, "
                                          "expected a string", key=key)
        options, answer, depth = row["options"], row["answer"], row["depth"]
        if not isinstance(options, list) or len(options) != len(LETTERS) or not all(
                isinstance(o, str) and o.strip() for o in options):
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: 'options' must be six non-empty strings", key=key)
        if answer not in LETTERS:
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: 'answer' is {answer!r}, not one of A-F", key=key)
        if isinstance(depth, bool) or not isinstance(depth, int | float) or not 0.0 <= float(depth) <= 1.0:
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: 'depth' is {depth!r}, not a fraction in [0, 1]",
                                key=key)
        domain, gold = row["domain"], row["gold_segment"]
        if domain not in segments:
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: domain {domain!r} has no segments in "
                                      f"{SEGMENTS_FILE} (domains there: {', '.join(sorted(segments))})", key=key)
        if not _is_int(gold) or not 0 <= gold < len(segments[domain]):
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: 'gold_segment' {gold!r} is not a segment of "
                                      f"{domain!r} (0 … {len(segments[domain]) - 1})", key=key)
        if row["gold_text"] != segments[domain][gold]:
            raise dataset_error(path, f"{QUESTIONS_FILE} {where}: 'gold_text' differs from segment {gold} of "
                                      f"{domain!r} in {SEGMENTS_FILE}; the two files come from different builds",
                                key=key)
        if row["question_id"] in seen:
            raise dataset_error(path, f"{QUESTIONS_FILE} {where} repeats the question_id of row "
                                      f"{seen[row['question_id']]}", key=key)
        seen[row["question_id"]] = number
        out.append(TailQuestion(
            question_id=row["question_id"], domain=domain, gold_segment=gold, depth=float(depth),
            question=row["question"], options=tuple(options), answer=answer, gold_text=row["gold_text"],
            generator_model=row["generator_model"], provenance=row["provenance"],
        ))
    return tuple(out)
