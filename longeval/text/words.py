"""Word lists for keys and distractors: the wonderwords lists RULER draws from, read as RULER reads them.

RULER takes every line with trailing whitespace stripped (wonderwords' `_get_words_from_text_file`), so a few
entries hold a space: nouns such as "creme brulee" and "dust storm", the adjective "ad hoc". They are words
like the others: a CWE entry "12. creme brulee", a NIAH key "instinctive-dust storm".
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

import numpy as np

from longeval.text.tokenizer import Encoder


@lru_cache(maxsize=4)
def _word_file(name: str) -> tuple[str, ...]:
    text = resources.files("wonderwords").joinpath("assets", name).read_text(encoding="utf-8")
    return tuple(sorted({w.rstrip() for w in text.splitlines() if w.rstrip()}))


def nouns() -> tuple[str, ...]:
    return _word_file("nounlist.txt")


def adjectives() -> tuple[str, ...]:
    return _word_file("adjectivelist.txt")


def verbs() -> tuple[str, ...]:
    return _word_file("verblist.txt")


@lru_cache(maxsize=1)
def common_vocabulary() -> tuple[str, ...]:
    """Nouns, adjectives and verbs, deduplicated and sorted (CWE's word pool)."""
    return tuple(sorted(set(nouns()) | set(adjectives()) | set(verbs())))


def encode_compounds(encoder: Encoder, items: Sequence[str]) -> list[np.ndarray]:
    """Ids of ' adjective-noun' for many compounds, from the cached ids of ' adjective' and '-noun'.

    '-' is a pre-tokenizer boundary, so the parts concatenate to the whole encoding; a few are checked,
    and a tokenizer that merges across the hyphen gets whole encodings instead.
    """
    encoder.encode_many([" " + a for a in adjectives()] + ["-" + n for n in nouns()])  # warm, once cached
    pairs = [item.split("-", 1) for item in items]
    out = [np.concatenate([encoder.encode(" " + a), encoder.encode("-" + n)]) for a, n in pairs]
    for i in range(min(3, len(out))):
        if not np.array_equal(out[i], encoder.encode(" " + items[i])):
            return encoder.encode_many([" " + item for item in items], cache=False)
    return out
