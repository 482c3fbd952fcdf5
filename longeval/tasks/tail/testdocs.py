"""Test documents of any length with the gold paragraph at a fixed depth (TAIL §3.3, Figure 3).

A test document is a window of the domain's composed document around the gold segment, in the evaluated model's
tokens. Depth follows the needle-in-a-haystack convention: the gold segment sits whole, and a fraction `depth`
of the other text in the window comes before it (0 = first, 1 = last). So the depth is the same at 8K and at
128K, which is what lets the paper compare lengths with the questions held fixed.

Segments are encoded once per domain, each with its leading space, so a window is a concatenation of ids (see
`longeval.text.pieces`); only the two ends are cut, at word boundaries: the text before the gold keeps the end of
its first segment, the text after keeps the start of its last. The window never exceeds the budget and falls
short of it by less than one word; the realised depth differs from the target by a few tokens' worth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longeval.errors import LengthError
from longeval.text.pieces import EMPTY, Piece, concat, cut_words, lead_with_space, strip_head
from longeval.text.tokenizer import Encoder


@dataclass(frozen=True)
class EncodedDomain:
    """A domain's segments, each as " " + text, with their token ids: encoded once, windowed many times."""

    texts: tuple[str, ...]
    ids: tuple[np.ndarray, ...]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(i) for i in self.ids], dtype=np.int64)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def encode_domain(encoder: Encoder, segments: Sequence[str]) -> EncodedDomain:
    """Encode each segment with a leading space (the word boundary it has inside the composed document)."""
    texts = tuple(" " + s for s in segments)
    ids = tuple(encoder.encode_many(list(texts), cache=False))  # one-off texts must not fill the encoder's cache
    return EncodedDomain(texts=texts, ids=ids)


@dataclass(frozen=True)
class TailDocument:
    """A test document and where its gold segment ended up."""

    piece: Piece
    depth: float
    """Realised depth in [0, 1]: tokens before the gold / tokens of the document other than the gold."""
    gold_start: int
    """Token offset of the gold segment in `piece.ids`."""
    gold_tokens: int
    first_segment: int
    """Index of the first segment in the window (possibly cut at its start)."""
    last_segment: int
    """Index of the last segment in the window (possibly cut at its end)."""

    @property
    def start_fraction(self) -> float:
        """Where the gold starts, as a fraction of the whole document (the other common reading of "depth")."""
        return self.gold_start / len(self.piece) if len(self.piece) else 0.0


def _encode(encoder: Encoder, text: str) -> np.ndarray:
    return encoder.encode_many([text], cache=False)[0]


def cut_head(encoder: Encoder, text: str, budget: int) -> Piece:
    """The longest prefix of `text` ending at a word boundary with at most `budget` tokens (RULER's
    `cut_words`), or nothing when that prefix is only whitespace."""
    best = cut_words(encoder, text, budget) if text.strip() else EMPTY
    return best if best.text.strip() else EMPTY


def cut_tail(encoder: Encoder, text: str, budget: int) -> Piece:
    """The longest suffix of `text` starting at a word boundary (with its leading space) with at most `budget`
    tokens."""
    if budget <= 0 or not text.strip():
        return EMPTY
    ids = _encode(encoder, text)
    if len(ids) <= budget:
        return Piece(text, ids)
    words = text.split(" ")
    lo, hi, best = 0, len(words), EMPTY  # words[lo:] do not fit, words[hi:] do
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = " " + " ".join(words[mid:])
        ids = _encode(encoder, candidate)
        if len(ids) <= budget:
            hi, best = mid, Piece(candidate, ids)
        else:
            lo = mid
    return best if best.text.strip() else EMPTY


def build_test_document(
    encoder: Encoder, domain: EncodedDomain, gold: int, depth: float, budget: int, *, lead: str = "",
    name: str = "",
) -> TailDocument:
    """The window of `budget` tokens around segment `gold` with a fraction `depth` of the other text before it.

    `lead` is the frame's `context_lead`: " " keeps the document's leading space, "" drops it (re-encoding only
    the first word). Near either end of the domain the window shifts, so the realised depth moves towards what
    the domain allows. Raises LengthError when the gold segment alone is over budget, or the domain is shorter
    than the budget (`name` is the domain, for the message).
    """
    lengths = domain.lengths
    if not 0 <= gold < len(lengths):
        raise ValueError(f"gold segment {gold} is not in the domain's {len(lengths)} segments")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth {depth} is not a fraction in [0, 1]")
    gold_tokens = int(lengths[gold])
    total = int(lengths.sum())
    if gold_tokens > budget:
        raise LengthError(f"TAIL domain {name!r}: gold segment {gold} is {gold_tokens} tokens, more than the {budget} "
                          "tokens left for the document; use a larger suite.lengths value")
    if total < budget:
        raise LengthError(f"TAIL domain {name!r} is {total} tokens long, shorter than the {budget}-token document this "
                          "length needs; add documents to the domain and rebuild, or lower suite.lengths")
    target = budget
    for _ in range(4):  # re-encoding the first word can add a token or two: shrink and rebuild
        doc = _window(encoder, domain, gold, depth, target, lead)
        if len(doc.piece) <= budget:
            return doc
        target -= len(doc.piece) - budget
    raise LengthError(f"TAIL domain {name!r}: could not fit a document into {budget} tokens")


def _window(encoder: Encoder, domain: EncodedDomain, gold: int, depth: float, budget: int, lead: str) -> TailDocument:
    lengths = domain.lengths
    gold_tokens = int(lengths[gold])
    rest = budget - gold_tokens
    room_before, room_after = int(lengths[:gold].sum()), int(lengths[gold + 1 :].sum())
    want = min(max(int(round(depth * rest)), rest - room_after), room_before)

    before: list[Piece] = []  # whole segments walking back from the gold, then the end of one more
    used, index = 0, gold - 1
    while index >= 0 and used + int(lengths[index]) <= want:
        before.append(Piece(domain.texts[index], domain.ids[index]))
        used += int(lengths[index])
        index -= 1
    if index >= 0 and want > used:
        cut = cut_tail(encoder, domain.texts[index], want - used)
        if cut.text:
            before.append(cut)
            used += len(cut)
            index -= 1
    first = index + 1

    after: list[Piece] = []  # whole segments after the gold, then the start of one more
    room, spent, index = rest - used, 0, gold + 1
    while index < len(lengths) and spent + int(lengths[index]) <= room:
        after.append(Piece(domain.texts[index], domain.ids[index]))
        spent += int(lengths[index])
        index += 1
    if index < len(lengths) and room > spent:
        cut = cut_head(encoder, domain.texts[index], room - spent)
        if cut.text:
            after.append(cut)
            spent += len(cut)
            index += 1
    last = index - 1

    raw = concat([*reversed(before), Piece(domain.texts[gold], domain.ids[gold]), *after])
    opened = lead_with_space(encoder, raw) if lead == " " else strip_head(encoder, raw)
    shift = len(opened) - len(raw)  # the first word's re-encoding: in the text before the gold, or in the gold
    gold_start = used + shift if used else 0
    gold_len = gold_tokens if used else gold_tokens + shift
    others = len(opened) - gold_len
    realised = gold_start / others if others > 0 else depth
    return TailDocument(piece=opened, depth=realised, gold_start=gold_start, gold_tokens=gold_len,
                        first_segment=first, last_segment=last)
