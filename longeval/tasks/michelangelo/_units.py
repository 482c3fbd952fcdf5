"""Token-space building blocks shared by the Michelangelo generators.

Latent List and MRCR contexts are sequences of whole units (a line of code, a block of lines, a turn
of a conversation) that must never be cut. Every unit is encoded once per process; a context is a
choice of unit indices, sampled with numpy, whose ids are concatenated with `Ragged.take`. Units end
in a newline and start with a non-space character, so for byte-level BPE tokenizers the concatenated
ids are the tokenization of the whole text (we check it per unit and fall back when a tokenizer merges).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from longeval.text.pieces import EMPTY, Piece, Ragged, close_gap
from longeval.text.tokenizer import Encoder

Draw = Callable[[int], np.ndarray]
"""Draws `n` unit indices (the caller's sampling distribution, from its own generator)."""

CLOSE_GAP_SPARE = 256


def encode_units(encoder: Encoder, texts: Sequence[str], *, follower: str = "x") -> list[np.ndarray]:
    """Ids of each text as tokenized when more text follows it, encoded in one batch.

    A unit's trailing newline could merge with what follows in some tokenizers; encoding `text +
    follower` and dropping the follower's ids gives the ids as they appear inside a longer context.
    Where the follower merged into the text, the plain encoding is used instead.
    """
    if not texts:
        return []
    tail = encoder.encode(follower)
    both = encoder.encode_many([t + follower for t in texts], cache=False)
    out = []
    cut = len(tail)
    for text, ids in zip(texts, both, strict=True):
        if len(ids) >= cut and np.array_equal(ids[len(ids) - cut :], tail):
            out.append(np.ascontiguousarray(ids[: len(ids) - cut], dtype=np.int32))
        else:
            out.append(encoder.encode(text))
    return out


@dataclass(frozen=True)
class UnitPool:
    """Texts and their ids, encoded once per process; contexts are index arrays into it."""

    texts: tuple[str, ...]
    rows: Ragged

    @classmethod
    def build(cls, encoder: Encoder, texts: Sequence[str], *, follower: str = "x") -> UnitPool:
        """Encode every text once (in one batch), as followed by `follower`."""
        return cls(tuple(texts), Ragged.of(encode_units(encoder, texts, follower=follower)))

    @property
    def lengths(self) -> np.ndarray:
        return self.rows.lengths

    def __len__(self) -> int:
        return len(self.texts)

    def piece(self, order: np.ndarray) -> Piece:
        """Units `order[0], order[1], ...` joined, as one piece."""
        if len(order) == 0:
            return EMPTY
        return Piece("".join([self.texts[i] for i in order.tolist()]), self.rows.take(order))


def fill_units(lengths: np.ndarray, draw: Draw, budget: int) -> tuple[np.ndarray, int]:
    """Unit indices whose lengths sum to at most `budget`, as close to it as whole units allow.

    Units are drawn in order until the next one would overflow; the remaining gap is then closed by
    appending drawn units short enough to fit and by swapping the last units for longer spare ones.

    Returns:
        The chosen indices (in context order) and the tokens left unfilled.
    """
    if budget <= 0:
        return np.zeros(0, dtype=np.int64), max(budget, 0)
    mean = max(1.0, float(lengths.mean()))
    parts: list[np.ndarray] = []
    total = 0
    while True:
        n = int((budget - total) / mean * 1.05) + 16
        batch = draw(n).astype(np.int64)
        cum = total + np.cumsum(lengths[batch])
        fits = int(np.searchsorted(cum, budget, side="right"))
        parts.append(batch[:fits])
        if fits < n:
            total = int(cum[fits - 1]) if fits else total
            break
        total = int(cum[-1])
    chosen = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    gap = budget - total
    if gap <= 0:
        return chosen, gap
    spare = draw(CLOSE_GAP_SPARE).astype(np.int64).tolist()
    extra: list[int] = []
    rest: list[int] = []
    for s in spare:
        if int(lengths[s]) <= gap:
            extra.append(s)
            gap -= int(lengths[s])
        else:
            rest.append(s)
    head, tail = chosen[:-64].tolist(), chosen[-64:].tolist() + extra
    tail, gap = close_gap(lengths, tail, rest, gap)
    return np.asarray(head + tail, dtype=np.int64), gap


def positions_among(n_units: int, count: int, rng: np.random.Generator) -> list[int]:
    """Sorted insertion points (before unit p, 0..n_units) for `count` items, uniform over the context."""
    return sorted(int(p) for p in rng.integers(0, n_units + 1, size=count))


def interleave(pool: UnitPool, order: np.ndarray, items: Sequence[Piece], at: Sequence[int]) -> tuple[Piece, list[int]]:
    """The pool units of `order` with `items[i]` inserted before unit `at[i]` (`at` sorted).

    Returns:
        The context and the token offset where each item starts.
    """
    texts: list[str] = []
    ids: list[np.ndarray] = []
    offsets: list[int] = []
    tokens = 0
    start = 0
    for item, where in zip(items, at, strict=True):
        segment = pool.piece(order[start:where])
        texts.append(segment.text)
        ids.append(segment.ids)
        tokens += len(segment)
        offsets.append(tokens)
        texts.append(item.text)
        ids.append(item.ids)
        tokens += len(item)
        start = where
    segment = pool.piece(order[start:])
    texts.append(segment.text)
    ids.append(segment.ids)
    return Piece("".join(texts), np.concatenate(ids).astype(np.int32)), offsets


def depth_of(offsets: Sequence[int], total: int) -> float:
    """Mean relative position (0-100 %) of items that start at the given token offsets."""
    if not offsets or total <= 0:
        return -1.0
    return round(100.0 * float(np.mean(offsets)) / total, 2)
