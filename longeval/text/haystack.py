"""Haystacks a family fills its context with, and placing its pieces in them at given depths.

The depth convention every family shares: a depth is a percent of the context (0 = its start, 100 = its end),
and a piece at depth d goes before unit int(U * d / 100) of the U units (sentences, lines) the context holds:
between two units, never inside one. A family cycles its depths over instances, `depth_for(index, depths)`, so
every depth gets the same share of a length's instances; the instance's `Draft.depth` is the depth asked for
(the depth in `depths` of the piece the question is about, the first queried one where there are several), not
where the piece landed after rounding to a unit boundary.

RULER's essay and noise haystacks are built with these (`longeval.tasks.ruler.niah`), so a family using them lays
its pieces out as RULER's generator does (scripts/data/synthetic/niah.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from longeval.text.corpus import SENTENCE_END, Corpus
from longeval.text.pieces import EMPTY, Piece, UnitStream, concat
from longeval.text.tokenizer import Encoder

__all__ = ["EssayHaystack", "Placed", "depth_for", "insert_between_lines", "insert_between_sentences"]

Placed = Sequence[tuple[float, Piece]]
"""Pieces with the depth (percent) each goes at, in any order."""


def depth_for(index: int, depths: Sequence[float]) -> float:
    """The depth of instance `index`: `depths` cycled by index, so each depth gets an equal share of a length's
    instances (RULER's 40 depths, Lost in the Middle's five positions)."""
    return depths[index % len(depths)]


@dataclass(frozen=True)
class EssayHaystack:
    """The essay haystack as a unit stream (`text.corpus.load_essays`' units: sentences, each with its leading
    space, long ones cut in word chunks), and which units begin a sentence: pieces go only there."""

    stream: UnitStream
    starts: np.ndarray
    """Whether each unit of the corpus begins a sentence (a long sentence's later chunks do not)."""
    wraps: bool
    """Whether the text's last unit ends a sentence, so its first begins one again when the stream repeats."""

    @classmethod
    def of(cls, encoder: Encoder, corpus: Corpus) -> EssayHaystack:
        """The corpus's units (`text.corpus.load_essays(essay_dir)`) encoded once: a few seconds for the default
        corpus, so a generator takes it from `GenContext.essay_haystack()`, which keeps it for the process."""
        return cls(UnitStream(encoder, corpus.sentences), np.array(corpus.starts, dtype=bool),
                   bool(SENTENCE_END.search(corpus.sentences[-1] + " ")))

    def sentence_units(self, n: int) -> np.ndarray:
        """The units, of the first n of the cyclic stream, that begin a sentence."""
        flags = np.resize(self.starts, n)
        flags[len(self.starts) :: len(self.starts)] = self.wraps
        return np.flatnonzero(flags)

    def begins_sentence(self, unit: int) -> bool:
        """Whether unit `unit` of the cyclic stream begins a sentence."""
        period = len(self.starts)
        return self.wraps if unit >= period and unit % period == 0 else bool(self.starts[unit % period])


def insert_between_lines(stream: UnitStream, budget: int, placed: Placed) -> Piece:
    """Fill `budget` tokens with whole lines of `stream` and put each piece at the line boundary of its depth:
    before line int(n * depth / 100) of the n lines that fit (RULER's noise haystack). The pieces' own tokens
    are not in `budget`: subtract them first. Lines end in "\\n" (a stream built with `followed=True`); drop the
    context's last newline with `pieces.end_line`, as RULER's "\\n".join does."""
    n = stream.units_within(budget)
    parts: list[Piece] = []
    start = 0
    for depth, item in sorted(placed, key=lambda pair: pair[0]):
        at = int(n * depth / 100)
        parts.append(stream.slice(start, at))
        parts.append(item)
        start = at
    parts.append(stream.slice(start, n))
    return concat(parts)


def insert_between_sentences(haystack: EssayHaystack, budget: int, placed: Placed, follower: str) -> Piece:
    """Fill `budget` tokens with essay text cut at a word, and put the pieces between its sentences as RULER does.

    A piece at depth d goes before sentence int(S * (d / 100)) of the S sentences (the cut one at the end counts
    as one). RULER: `sents = sent_tokenize(text)`, positions `[0] + sorted(int(len(sents) * (depth / 100))) +
    [len(sents)]`, and `" ".join` of the sentence runs between them and the pieces. Units carry a leading space,
    so the result is that text with one space in front (`fit_context` fixes it to how the context follows the
    template); an empty run keeps its join space, and a piece after the last sentence is followed by one. That
    space ends the context, so it is encoded as the prompt has it, against `follower`: what the prompt has after
    the context (`frame.tail`). Pieces start with a space (" One of the ..."); their tokens, and one per piece
    for the join spaces, are not in `budget`: subtract them first.
    """
    stream, encoder = haystack.stream, haystack.stream.encoder
    n, tail = stream.fill(budget)
    bounds = haystack.sentence_units(n).tolist()
    if tail.text and haystack.begins_sentence(n):
        bounds.append(n)  # the cut sentence at the end is one of its own
    end = n + 1 if tail.text else n  # position n stands for the cut
    count = len(bounds)
    ordered = sorted(placed, key=lambda pair: pair[0])
    cuts = [0] + sorted(int(count * (depth / 100)) for depth, _ in ordered) + [count]
    at = [bounds[k] if k < count else end for k in cuts]

    def run(a: int, b: int) -> Piece:
        return concat([stream.slice(a, min(b, n)), tail if a <= n < b else EMPTY])

    parts: list[Piece] = []
    for i, (_, item) in enumerate(ordered):
        parts.append(run(at[i], at[i + 1]))
        lead = " " if cuts[i] == cuts[i + 1] else ""  # an empty run: " ".join leaves its space
        trail = " " if i == len(ordered) - 1 and cuts[i + 1] == count else ""
        if lead or trail:
            text = lead + item.text + trail
            item = Piece(text, encoder.encode_followed(text, follower) if trail else encoder.encode(text))
        parts.append(item)
    parts.append(run(at[-2], at[-1]))
    return concat(parts)
