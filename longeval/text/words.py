"""Word lists for keys and distractors: the wonderwords lists RULER draws from."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=4)
def _word_file(name: str) -> tuple[str, ...]:
    text = resources.files("wonderwords").joinpath("assets", name).read_text(encoding="utf-8")
    return tuple(sorted({w.strip() for w in text.splitlines() if w.strip() and " " not in w.strip()}))


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
