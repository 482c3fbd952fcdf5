"""Laying out a SYNC context in token space: haystack units with the task's facts inserted at seeded slots.

Both domains build their context from a small table of pre-encoded rows (a haystack sentence per node, a
vocabulary word, an edge sentence, a dictionary) and a sequence of row numbers; the token ids are one
`Ragged.take`, never a re-tokenization. Every row begins at a word boundary (a space or a newline), so the
concatenation is the tokenization of the joined text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from longeval.errors import LengthError
from longeval.tasks.base import GenContext
from longeval.text.pieces import Piece, Ragged, open_context
from longeval.text.render import Frame


@dataclass(frozen=True)
class Rows:
    """Texts and their token ids, addressed by row number."""

    texts: list[str]
    table: Ragged

    @classmethod
    def of(cls, texts: Sequence[str], ids: Sequence[np.ndarray]) -> Rows:
        return cls(list(texts), Ragged.of(list(ids)))

    @property
    def lengths(self) -> np.ndarray:
        return self.table.lengths

    def piece(self, sequence: np.ndarray) -> Piece:
        """The rows of `sequence`, joined."""
        return Piece("".join(self.texts[i] for i in sequence.tolist()), self.table.take(sequence))


@dataclass(frozen=True)
class Layout:
    """A context and where each inserted fact starts, in tokens."""

    context: Piece
    fact_starts: np.ndarray

    def depth(self, facts: Sequence[int]) -> float:
        """Mean position of the given facts as a percentage of the context (RULER's depth), -1 if none."""
        if not len(facts) or not len(self.context):
            return -1.0
        return round(100.0 * float(np.mean(self.fact_starts[list(facts)])) / len(self.context), 2)


def insert(rows: Rows, haystack: np.ndarray, facts: np.ndarray, slots: np.ndarray) -> Layout:
    """Insert `facts[k]` before haystack position `slots[k]` (slots sorted ascending)."""
    sequence = np.insert(haystack, slots, facts) if len(facts) else haystack
    where = np.asarray(slots, dtype=np.int64) + np.arange(len(facts))  # np.insert keeps the given order
    starts = np.concatenate([[0], np.cumsum(rows.lengths[sequence])])[where] if len(facts) else np.zeros(0)
    return Layout(rows.piece(sequence), starts.astype(np.int64))


def shared_budget(frames: Sequence[Frame], target_length: int, max_new_tokens: int, *, slack: int = 0) -> int:
    """Context tokens that every task of a domain can afford: the largest overhead among `frames`.

    The tasks share the head (it holds no task text), so the largest overhead is that of the longest tail;
    `slack` reserves a few more tokens where the longest tail is an estimate.
    """
    overhead = max(f.overhead for f in frames) + slack
    budget = target_length - max_new_tokens - overhead
    if budget <= 0:
        raise LengthError(
            f"target length {target_length} cannot hold the SYNC prompt template ({overhead} tokens) and the "
            f"output budget ({max_new_tokens} tokens); use a larger suite.lengths value"
        )
    return budget


def too_short(what: str, need: int, budget: int, target_length: int) -> LengthError:
    return LengthError(
        f"target length {target_length} leaves {budget} context tokens, but {what} alone take {need}; "
        "use a larger suite.lengths value (the paper uses 32K to 128K)"
    )


def fit(ctx: GenContext, frame: Frame, budget: int, build: Callable[[int], Layout]) -> Layout:
    """The layout of at most `budget` tokens once its first word follows the template (cf. `fit_context`).

    `build(b)` must be deterministic in `b`; removing or adding the leading space can change the count by
    a token, so we shrink and rebuild in the rare case it overflows.
    """
    target = budget
    for _ in range(4):
        layout = build(target)
        opened = open_context(ctx.encoder, frame, layout.context)
        if len(opened) <= budget:
            shift = len(opened) - len(layout.context)
            return Layout(opened, np.maximum(layout.fact_starts + shift, 0))
        target -= len(opened) - budget
    raise LengthError(f"could not fit a SYNC context into {budget} tokens")
