"""RULER §3.4, Question answering: SQuAD (qa_1) and HotpotQA (qa_2) with distractor documents.

The gold paragraph(s) are the needles and paragraphs sampled from the same data set are the haystack,
each shown as `Document {i}:`. As in RULER, SQuAD distractors come first from the gold paragraph's own
article (hard distractors), and every paragraph listed with a HotpotQA question counts as gold. The
data cannot be downloaded here: the user names local files in the upstream formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from longeval.errors import DataFileError, LengthError
from longeval.tasks.base import Draft, GenContext, context_budget, draft
from longeval.tasks.ruler.templates import fill
from longeval.text.pieces import Piece, concat, cut_words

FORMATS = {
    "squad": ("suite.data.squad_path", "SQuAD v2.0 JSON (dev-v2.0.json: {'data': [{'paragraphs': [{'context', "
              "'qas': [{'question', 'answers': [{'text'}], 'is_impossible'}]}]}]})"),
    "hotpotqa": ("suite.data.hotpotqa_path", "HotpotQA JSON (hotpot_dev_distractor_v1.json: a list of "
                 "{'question', 'answer', 'context': [[title, [sentences]]]})"),
}


@dataclass(frozen=True)
class QaParams:
    dataset: Literal["squad", "hotpotqa"] = "squad"


@dataclass(frozen=True)
class QaData:
    docs: tuple[str, ...]
    questions: tuple[dict, ...]  # {query, outputs, context: [doc idx], more_context: [doc idx]}


def _bad(dataset: str, path: str | None, why: str) -> DataFileError:
    key, fmt = FORMATS[dataset]
    return DataFileError(f"{dataset} file {path!r}: {why}. Expected {fmt}; set {key}=/path/to/file")


def load_qa(dataset: str, path: str | None) -> QaData:
    """Read SQuAD v2 or HotpotQA dev JSON the way RULER's reader does."""
    if not path:
        raise _bad(dataset, path, "no file given")
    file = Path(path).expanduser()
    if not file.is_file():
        raise _bad(dataset, path, "file not found")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
        return _parse_squad(raw) if dataset == "squad" else _parse_hotpotqa(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _bad(dataset, path, f"not in the expected format ({type(exc).__name__}: {exc})") from exc


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _parse_squad(raw: dict) -> QaData:
    docs = sorted({p["context"] for article in raw["data"] for p in article["paragraphs"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = []
    for article in raw["data"]:
        siblings = [index[p["context"]] for p in article["paragraphs"]]
        for p in article["paragraphs"]:
            gold = index[p["context"]]
            for qa in p["qas"]:
                if qa.get("is_impossible") or not qa["answers"]:
                    continue
                questions.append({
                    "query": _text(qa["question"], "a question"),
                    "outputs": [_text(a["text"], "an answer") for a in qa["answers"]],
                    "context": [gold], "more_context": [i for i in siblings if i != gold],
                })
    if not questions:
        raise ValueError("no answerable questions")
    return QaData(tuple(docs), tuple(questions))


def _parse_hotpotqa(raw: list) -> QaData:
    def doc(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc(_text(t, "a title"), [_text(x, "a sentence") for x in s]) for item in raw
                   for t, s in item["context"]})
    index = {d: i for i, d in enumerate(docs)}
    questions = [
        {"query": _text(item["question"], "a question"), "outputs": [_text(item["answer"], "an answer")],
         "context": [index[doc(t, s)] for t, s in item["context"]], "more_context": []}
        for item in raw
    ]
    if any(not q["context"] for q in questions):
        raise ValueError("a question has no context paragraphs")
    if not questions:
        raise ValueError("no questions")
    return QaData(tuple(docs), tuple(questions))


def generate(
    ctx: GenContext, params: QaParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    path = ctx.data.squad_path if params.dataset == "squad" else ctx.data.hotpotqa_path
    data: QaData = ctx.cached(("qa", params.dataset, path), lambda: load_qa(params.dataset, path))
    order = ctx.cached(("qa-order", params.dataset, path), lambda: np.random.default_rng(0).permutation(
        len(data.questions)))
    q = data.questions[int(order[index % len(order)])]
    user, prefix = fill("qa", query=q["query"])
    frame = ctx.frame(user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)

    gold = list(dict.fromkeys(q["context"]))
    more = [i for i in q["more_context"] if i not in gold]
    more = [more[i] for i in rng.permutation(len(more))]
    taken = set(gold) | set(more)
    rest = [i for i in rng.permutation(len(data.docs)) if int(i) not in taken]
    candidates = gold + more + [int(i) for i in rest]

    encoder = ctx.encoder
    bodies = ctx.cached(("qa-bodies", params.dataset, path), dict)

    def body(i: int) -> np.ndarray:
        if i not in bodies:
            bodies[i] = encoder.encode(data.docs[i])
        return bodies[i]

    def header(position: int) -> str:
        return f"Document {position}:\n" if position == 1 else f"\n\nDocument {position}:\n"

    # Add documents while they fit; headers are numbered by final position, so count them by position.
    used, chosen = 0, []
    for doc_index in candidates:
        cost = encoder.count(header(len(chosen) + 1)) + len(body(doc_index))
        if used + cost > budget:
            break
        chosen.append(doc_index)
        used += cost
    if len(chosen) < len(gold):
        raise LengthError(
            f"{params.dataset} at {target_length}: the gold paragraphs do not fit in {budget} tokens; "
            "use a larger suite.lengths value"
        )
    if len(chosen) == len(candidates):
        raise LengthError(
            f"{params.dataset} at {target_length}: the data set's {len(data.docs)} paragraphs fill only {used} "
            f"of {budget} context tokens; use a shorter length or a larger data file"
        )
    shuffled = [chosen[i] for i in rng.permutation(len(chosen))]
    parts: list[Piece] = []
    for position, doc_index in enumerate(shuffled, start=1):
        parts.append(Piece(header(position), encoder.encode(header(position))))
        parts.append(Piece(data.docs[doc_index], body(doc_index)))
    # A final distractor, cut at a word boundary, fills what is left (RULER stops a document short).
    spare = candidates[len(chosen)]
    head = header(len(shuffled) + 1)
    left = budget - used - encoder.count(head)
    cut = cut_words(encoder, data.docs[spare], left)
    if cut.text:
        parts += [Piece(head, encoder.encode(head)), cut]
    context = concat(parts)
    gold_pos = min(shuffled.index(g) for g in gold)
    return draft(
        frame, context, list(q["outputs"]),
        depth=round(100.0 * gold_pos / max(1, len(shuffled) - 1), 2),
        complexity=f"docs{len(shuffled)}",
        meta={"query": q["query"], "gold_positions": sorted(shuffled.index(g) + 1 for g in gold)},
    )
