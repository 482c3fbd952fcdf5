"""Contexts built in token space from pieces encoded once.

Tokenizing a 128K-token context costs about 0.4 s and RULER searches the haystack size with repeated
tokenization. We instead encode every unit of text (a sentence, a needle, a numbered word) once, pick
how many units fit from their pre-counted lengths, and concatenate their token ids. Units begin at a
word boundary (a leading space, or after a newline), where byte-level BPE pre-tokenizers split anyway,
so the concatenation is the tokenization the model would see; only the first word of a context is
re-encoded (it loses its leading space). The token ids are what the engine receives, so
`input_tokens` is exact by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longeval.text.render import Frame
from longeval.text.tokenizer import Encoder


@dataclass(frozen=True)
class Piece:
    """A span of text and its token ids."""

    text: str
    ids: np.ndarray

    def __len__(self) -> int:
        return int(len(self.ids))


EMPTY = Piece("", np.zeros(0, dtype=np.int32))


def piece(encoder: Encoder, text: str, *, follower: str | None = None) -> Piece:
    """`text` with its ids, encoded once (start it with a space, or after a newline, so it joins others as the
    whole text would tokenize).

    `follower`: what comes after it in the prompt, for a piece ending in a space or newline, which tokenize
    differently when more text follows: the next piece's text, or for the context's last piece the template's
    tail (`frame.tail`), so its ids are those of the whole prompt (`Encoder.encode_followed`)."""
    return Piece(text, encoder.encode(text) if follower is None else encoder.encode_followed(text, follower))


def concat(pieces: Sequence[Piece]) -> Piece:
    """Join pieces in token space: their texts and their ids, no tokenization."""
    pieces = [p for p in pieces if p.text]
    if not pieces:
        return EMPTY
    return Piece("".join(p.text for p in pieces), np.concatenate([p.ids for p in pieces]).astype(np.int32))


def strip_head(encoder: Encoder, context: Piece) -> Piece:
    """Drop a context's leading space, re-encoding only its first word."""
    if not context.text[:1].isspace():
        return context
    stripped = context.text.lstrip()
    lead = context.text[: len(context.text) - len(stripped)]
    word = stripped.split(" ", 1)[0].split("\n", 1)[0]
    spaced = encoder.encode(lead + word)
    if len(spaced) <= len(context.ids) and np.array_equal(context.ids[: len(spaced)], spaced):
        return Piece(stripped, np.concatenate([encoder.encode(word), context.ids[len(spaced) :]]).astype(np.int32))
    return Piece(stripped, encoder.encode(stripped))  # rare: the first word merged across the boundary


def drop_space(encoder: Encoder, context: Piece) -> Piece:
    """Drop exactly one leading space (a second one stays), re-encoding only what precedes the first word's end:
    for text laid out as `" ".join(parts)` whose first part may be empty (RULER's essay haystack, depth 0)."""
    if not context.text.startswith(" "):
        return context
    rest = context.text[1:]
    word = rest[: len(rest) - len(rest.lstrip(" "))] + rest.lstrip(" ").split(" ", 1)[0].split("\n", 1)[0]
    spaced = encoder.encode(" " + word)
    if len(spaced) <= len(context.ids) and np.array_equal(context.ids[: len(spaced)], spaced):
        return Piece(rest, np.concatenate([encoder.encode(word), context.ids[len(spaced) :]]).astype(np.int32))
    return Piece(rest, encoder.encode(rest))  # rare: the first word merged across the boundary


def lead_with_space(encoder: Encoder, context: Piece) -> Piece:
    """Make a context start with a space (when the template's space before it moved into the context)."""
    if context.text.startswith(" ") or not context.text:
        return context
    word = context.text.split(" ", 1)[0].split("\n", 1)[0]
    bare = encoder.encode(word)
    if np.array_equal(context.ids[: len(bare)], bare):
        return Piece(" " + context.text, np.concatenate([encoder.encode(" " + word), context.ids[len(bare) :]]))
    return Piece(" " + context.text, encoder.encode(" " + context.text))


def open_context(encoder: Encoder, frame: Frame, context: Piece) -> Piece:
    """Fix the context's first word to how it follows the template: with or without its leading space."""
    return lead_with_space(encoder, context) if frame.context_lead == " " else strip_head(encoder, context)


def cut_words(encoder: Encoder, text: str, budget: int) -> Piece:
    """The longest prefix of `text`, cut at a word boundary, that encodes to at most `budget` tokens."""
    if budget <= 0 or not text:
        return EMPTY
    full = encoder.encode(text)
    if len(full) <= budget:
        return Piece(text, full)
    words = text.split(" ")
    lo, hi = 0, len(words)  # invariant: prefix of lo words fits; hi words do not
    best = EMPTY
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = " ".join(words[:mid])
        ids = encoder.encode(candidate)
        if len(ids) <= budget:
            lo, best = mid, Piece(candidate, ids)
        else:
            hi = mid
    return best


class UnitStream:
    """A cyclic sequence of text units, each encoded once; slices are numpy views, not tokenization.

    The haystacks of RULER (essays, repeated noise sentences) are streams: a context of N tokens is
    the first units of the stream, repeated as often as needed, plus a word-level cut of the next unit.
    """

    def __init__(self, encoder: Encoder, units: Sequence[str], *, followed: bool = False) -> None:
        """`followed=True` encodes each unit as followed by more text (units that end in a newline: lines)."""
        if not units:
            raise ValueError("a unit stream needs at least one unit")
        encoded = [encoder.encode_followed(u) for u in units] if followed else encoder.encode_many(list(units))
        self.encoder = encoder
        self.units = list(units)
        self.lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
        self.flat_ids = np.concatenate(encoded).astype(np.int32)
        self.tok_starts = np.concatenate([[0], np.cumsum(self.lengths)])
        self.text = "".join(self.units)
        self.char_starts = np.concatenate([[0], np.cumsum([len(u) for u in self.units])])
        self.cycle_tokens = int(self.tok_starts[-1])

    def __len__(self) -> int:
        return len(self.units)

    def tokens_before(self, n: int) -> int:
        """Tokens in the first `n` units of the cyclic stream."""
        cycles, rest = divmod(n, len(self.units))
        return int(cycles * self.cycle_tokens + self.tok_starts[rest])

    def units_within(self, budget: int) -> int:
        """The largest n with tokens_before(n) <= budget."""
        cycles, rest = divmod(max(budget, 0), self.cycle_tokens)
        return int(cycles * len(self.units) + np.searchsorted(self.tok_starts, rest, side="right") - 1)

    def slice(self, start: int, stop: int) -> Piece:
        """Units [start, stop) of the cyclic stream, joined."""
        texts, ids = [], []
        n = len(self.units)
        while start < stop:
            offset, u0 = divmod(start, n)
            u1 = min(n, u0 + (stop - start))
            texts.append(self.text[self.char_starts[u0] : self.char_starts[u1]])
            ids.append(self.flat_ids[self.tok_starts[u0] : self.tok_starts[u1]])
            start += u1 - u0
        if not ids:
            return EMPTY
        return Piece("".join(texts), np.concatenate(ids))

    def fill(self, budget: int) -> tuple[int, Piece]:
        """Whole units that fit in `budget` tokens, and a word-level cut of the next unit for the rest."""
        n = self.units_within(budget)
        rest = budget - self.tokens_before(n)
        return n, cut_words(self.encoder, self.units[n % len(self.units)], rest)


def end_line(encoder: Encoder, context: Piece) -> Piece:
    """Drop the final newline of a context of newline-terminated lines (RULER joins its lines with "\n").

    Only the last line is re-encoded: lines are encoded as followed by more text, so its ids are the tail of
    the context's ids; if a tokenizer merged across the last boundary, the whole text is encoded instead.
    """
    if not context.text.endswith("\n"):
        return context
    start = context.text.rfind("\n", 0, len(context.text) - 1) + 1
    last = context.text[start:]
    followed = encoder.encode_followed(last)
    head = len(context.ids) - len(followed)
    text = context.text[:-1]
    if head >= 0 and np.array_equal(context.ids[head:], followed):
        return Piece(text, np.concatenate([context.ids[:head], encoder.encode(last[:-1])]).astype(np.int32))
    return Piece(text, encoder.encode(text))


def assemble(frame: Frame, context: Piece) -> tuple[str, np.ndarray]:
    """The full prompt text and ids: head + context + tail."""
    ids = np.concatenate([frame.head_ids, context.ids, frame.tail_ids]).astype(np.int32)
    return frame.head + context.text + frame.tail, ids


def close_gap(
    lengths: np.ndarray, chosen: list[int], spare: list[int], gap: int, *, weight: int = 1
) -> tuple[list[int], int]:
    """Swap chosen items for longer spare ones until the token gap is (nearly) closed.

    Used where the context is made of whole items (distractor needles, numbered words) so no item may
    be cut: a swap changes the total by `weight * (len(spare) - len(chosen))`.
    """
    chosen, spare = list(chosen), list(spare)
    while gap > 0 and spare and chosen:
        best: tuple[int, int, int] | None = None
        for pos in range(max(0, len(chosen) - 64), len(chosen)):
            for s_pos, s in enumerate(spare[:256]):
                delta = weight * int(lengths[s] - lengths[chosen[pos]])
                if 0 < delta <= gap and (best is None or delta > best[0]):
                    best = (delta, pos, s_pos)
        if best is None:
            break
        delta, pos, s_pos = best
        chosen[pos], spare[s_pos] = spare[s_pos], chosen[pos]
        gap -= delta
    return chosen, gap


@dataclass(frozen=True)
class Ragged:
    """Many short id sequences in one flat array: row i is flat[starts[i] : starts[i] + lengths[i]]."""

    flat: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[np.ndarray]) -> Ragged:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(rows) else lengths
        flat = np.concatenate(rows).astype(np.int32) if len(rows) else np.zeros(0, np.int32)
        return cls(flat, starts, lengths)

    def take(self, order: np.ndarray) -> np.ndarray:
        """rows[order[0]] + rows[order[1]] + ... as one array, without a Python loop over `order`."""
        order = np.asarray(order, dtype=np.int64)
        lengths = self.lengths[order]
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int32)
        ends = np.cumsum(lengths)
        shift = np.repeat(self.starts[order] - (ends - lengths), lengths)
        return self.flat[np.arange(total, dtype=np.int64) + shift]


def ragged_take(rows: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Concatenate `rows[order[0]], rows[order[1]], ...` without a Python loop over `order`."""
    return Ragged.of(rows).take(order)
