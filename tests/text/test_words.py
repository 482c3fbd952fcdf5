"""The word lists RULER draws keys and CWE words from, read as RULER reads them."""

from __future__ import annotations

from importlib import resources

import pytest

from longeval.text import words


def _rulers_reading(name: str) -> list[str]:
    """wonderwords.random_word._get_words_from_text_file, as RULER calls it: every line, right-stripped."""
    with resources.files("wonderwords").joinpath("assets", name).open(encoding="utf-8") as f:
        lines = f.readlines()
    return [word.rstrip() for word in lines]


@pytest.mark.parametrize(("name", "ours"), [("nounlist.txt", words.nouns), ("adjectivelist.txt", words.adjectives),
                                            ("verblist.txt", words.verbs)])
def test_lists_are_rulers_words_deduplicated_and_sorted(name: str, ours) -> None:
    assert ours() == tuple(sorted(set(_rulers_reading(name)) - {""}))


def test_words_with_a_space_are_kept() -> None:
    """RULER's NIAH keys include "instinctive-dust storm", its CWE lists "creme brulee"."""
    assert {"creme brulee", "dust storm", "contact lens"} <= set(words.nouns())
    assert "ad hoc" in words.adjectives() and "nasty" in words.adjectives()  # "nasty " loses its trailing space
    assert {"creme brulee", "ad hoc"} <= set(words.common_vocabulary())
    assert not any(w != w.strip() for w in words.common_vocabulary())
