"""TAIL scoring and metrics (§3.5, §4.3): accuracy by length and depth, the heatmap, Avg, wAvg and the ratio.

`score_tail` maps the output to an option deterministically (`choice.parse_choice`) and scores 1 for the right
letter. Its error types: "wrong" (a letter, not the right one) and "unmapped" (no rule maps the output: what an
optional LLM judge would look at; the reference sends every output to GPT-4o-mini instead).

Metrics take score rows (mappings) with `score`, `target_length` and the question's depth (in percent: the
instance meta's `depth`, the target, preferred over the row's realised `depth`). One model per call; values are
percentages rounded to two decimals, as in Table 2:

- per length: the mean over every question at that length (the line chart);
- Avg: the plain mean over lengths; wAvg(inc) / wAvg(dec): the mean weighted by the length itself / by the lengths
  in reverse order (Table 2's figures follow exactly from these weights, e.g. GPT-4o 84.29 / 92.84);
- long/short ratio: accuracy at the longest length over accuracy at the shortest (Table 2's "128k/8k (%)");
- heatmap: accuracy per (depth, length) cell, depths as rows and lengths as columns (Figure 5).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longeval.scoring.judgement import Judgement
from longeval.tasks.tail.choice import parse_choice
from longeval.tasks.tail.prompts import LETTERS

WRONG = "wrong"
UNMAPPED = "unmapped"
ERROR_TYPES = (WRONG, UNMAPPED)


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, Mapping) else {}
    return {}


def _gold(references: Sequence[str] | None, meta: Mapping[str, Any]) -> str:
    try:
        refs = [] if references is None or isinstance(references, str) else list(references)
    except TypeError:
        refs = []
    if refs:
        return str(refs[0]).strip().upper()
    if isinstance(references, str) and references.strip():
        return references.strip().upper()
    return str(meta.get("answer", "")).strip().upper()


def score_tail(output: str, references: Sequence[str], meta: Mapping[str, Any]) -> Judgement:
    """1.0 for the right option, else 0.0 with "wrong" or "unmapped"; `parsed_answer` is the letter or ""."""
    info = _mapping(meta)
    options = info.get("options")
    options = [str(o) for o in options] if isinstance(options, list | tuple) else []
    prefix = info.get("answer_prefix") if isinstance(info.get("answer_prefix"), str) else ""
    text = output if isinstance(output, str) else ""
    letter = parse_choice(f"{prefix}{text}" if prefix else text, options)
    gold = _gold(references, info)
    if not letter:
        return Judgement(score=0.0, parsed_answer="", error_type=UNMAPPED)
    if gold in LETTERS and letter == gold:
        return Judgement(score=1.0, parsed_answer=letter, error_type="")
    return Judgement(score=0.0, parsed_answer=letter, error_type=WRONG)


# ---------------------------------------------------------------------------------------------------- metrics


def _length(row: Mapping[str, Any]) -> int | None:
    value = row.get("target_length")
    if value is None:
        value = _mapping(row.get("meta")).get("target_length")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _depth(row: Mapping[str, Any]) -> float | None:
    """The target depth in percent: the meta's `depth` if the row carries meta, else the row's `depth`."""
    value = _mapping(row.get("meta")).get("depth", row.get("depth"))
    try:
        depth = float(value)
    except (TypeError, ValueError):
        return None
    return round(depth, 2) if math.isfinite(depth) else None


def _score(row: Mapping[str, Any]) -> float:
    try:
        value = float(row.get("score") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


@dataclass(frozen=True)
class Cell:
    """Accuracy of one (length, depth) cell."""

    target_length: int
    depth: float
    n: int
    accuracy: float
    """Percent, two decimals."""


def accuracy_grid(rows: Iterable[Mapping[str, Any]]) -> list[Cell]:
    """Accuracy per (target_length, depth), sorted by length then depth; rows without either are skipped."""
    cells: dict[tuple[int, float], list[float]] = defaultdict(list)
    for row in rows:
        length, depth = _length(row), _depth(row)
        if length is not None and depth is not None:
            cells[(length, depth)].append(_score(row))
    return [Cell(length, depth, len(scores), round(100.0 * sum(scores) / len(scores), 2))
            for (length, depth), scores in sorted(cells.items())]


def length_accuracy(rows: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Accuracy in percent (unrounded) per target length, over every row at that length."""
    by_length: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        length = _length(row)
        if length is not None:
            by_length[length].append(_score(row))
    return {length: 100.0 * sum(s) / len(s) for length, s in sorted(by_length.items())}


@dataclass(frozen=True)
class LengthSummary:
    """Table 2's columns for one model."""

    lengths: tuple[int, ...]
    accuracy: tuple[float, ...]
    """Per length, percent, two decimals."""
    avg: float | None
    length_wavg_inc: float | None
    """TAIL's wAvg(inc): lengths weighted by their size. Not RULER's `wavg_inc` (weights by rank, 1..L)."""
    length_wavg_dec: float | None
    ratio: float | None
    """Accuracy at the longest length / at the shortest, in percent (None when the shortest is 0)."""


def summarise_lengths(per_length: Mapping[int, float]) -> LengthSummary:
    """Avg, wAvg(inc), wAvg(dec) and the long/short ratio from per-length accuracies (percent)."""
    lengths = tuple(sorted(per_length))
    values = [float(per_length[n]) for n in lengths]
    if not lengths:
        return LengthSummary((), (), None, None, None, None)
    total = float(sum(lengths))
    inc = sum(w * v for w, v in zip(lengths, values, strict=True)) / total
    dec = sum(w * v for w, v in zip(reversed(lengths), values, strict=True)) / total
    ratio = round(100.0 * values[-1] / values[0], 2) if values[0] else None
    return LengthSummary(lengths=lengths, accuracy=tuple(round(v, 2) for v in values),
                         avg=round(sum(values) / len(values), 2), length_wavg_inc=round(inc, 2),
                         length_wavg_dec=round(dec, 2),
                         ratio=ratio)


def length_summary(rows: Iterable[Mapping[str, Any]]) -> LengthSummary:
    """`summarise_lengths` over one model's score rows."""
    return summarise_lengths(length_accuracy(rows))


@dataclass(frozen=True)
class Heatmap:
    """Figure 5's matrix: `values[i][j]` is the accuracy (percent) at `depths[i]` and `lengths[j]`, None if empty."""

    depths: tuple[float, ...]
    lengths: tuple[int, ...]
    values: tuple[tuple[float | None, ...], ...]
    counts: tuple[tuple[int, ...], ...]


def heatmap(rows: Iterable[Mapping[str, Any]], *, depths: Sequence[float] | None = None,
            lengths: Sequence[int] | None = None) -> Heatmap:
    """The depth × length accuracy matrix; `depths` (percent) and `lengths` fix the axes, else those present."""
    cells = {(c.target_length, c.depth): c for c in accuracy_grid(rows)}
    ys = tuple(round(float(d), 2) for d in depths) if depths is not None else tuple(sorted({d for _, d in cells}))
    xs = tuple(int(n) for n in lengths) if lengths is not None else tuple(sorted({n for n, _ in cells}))
    values = tuple(tuple(cells[(n, d)].accuracy if (n, d) in cells else None for n in xs) for d in ys)
    counts = tuple(tuple(cells[(n, d)].n if (n, d) in cells else 0 for n in xs) for d in ys)
    return Heatmap(depths=ys, lengths=xs, values=values, counts=counts)
