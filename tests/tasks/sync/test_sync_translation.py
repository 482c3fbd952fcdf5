"""SYNC translation domain, without a tokenizer: languages, dictionaries and the letter-coverage optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longeval.errors import ConfigError
from longeval.tasks.sync.translation import (
    Languages,
    TranslationParams,
    best_coverage,
    coverage_of,
    instance_languages,
    letter_masks,
    make_languages,
    multi_hop_pairs,
    random_words,
    single_hop_pairs,
)

PARAMS = TranslationParams()


def _brute_force(languages: Languages) -> int:
    """The optimum by definition: every triple of LL0 dictionary words, every translation's first letter."""
    best = 0
    for triple in itertools.combinations(languages.chains, 3):
        letters = {word[0] for chain in triple for word in chain[1:]}
        best = max(best, len(letters))
    return best


@pytest.mark.parametrize("n", [3, 5, 7])
def test_languages_have_the_papers_shape(n: int) -> None:
    languages = make_languages(n, PARAMS, np.random.default_rng(n))
    assert languages.num_languages == n
    every = [w for vocab in languages.vocabularies for w in vocab]
    assert all(len(vocab) == 250 for vocab in languages.vocabularies)
    assert len(set(every)) == len(every)  # disjoint vocabularies: a word names its language
    assert all(3 <= len(w) <= 7 and w.isascii() and w.isalpha() and w.islower() for w in every)
    assert {len(w) for w in every} == {3, 4, 5, 6, 7}
    assert len(languages.chains) == 50
    for lang in range(n):
        column = [chain[lang] for chain in languages.chains]
        assert len(set(column)) == 50 and set(column) <= set(languages.vocabularies[lang])
    for source in range(n - 1):
        dictionary = languages.dictionary(source)
        assert len(dictionary) == 50 and len(dict(dictionary)) == 50  # word to word, no duplicates
        assert all(languages.translate([a], source + 1) == [b] for a, b in dictionary)


def test_multi_hop_translation_composes_the_dictionaries() -> None:
    languages = make_languages(5, PARAMS, np.random.default_rng(0))
    tables = [dict(languages.dictionary(i)) for i in range(4)]
    for chain in languages.chains:
        word = chain[1]
        for hop in range(1, 4):
            word = tables[hop][word]
        assert languages.translate([chain[1]], 4) == [word]


def test_query_pairs() -> None:
    assert single_hop_pairs(3) == [(0, 1), (1, 2)]
    assert multi_hop_pairs(3) == [(0, 2)]
    assert all(t - s >= 2 for s, t in multi_hop_pairs(7)) and len(multi_hop_pairs(7)) == 15


def test_random_words_are_distinct() -> None:
    words = random_words(2000, (3, 3), np.random.default_rng(1))
    assert len(set(words)) == 2000 and all(len(w) == 3 for w in words)


def test_language_sets_are_fixed_per_slot_and_distinct() -> None:
    sets = [instance_languages(PARAMS, i, np.random.default_rng(i)) for i in range(150)]
    assert [s.num_languages for s in sets[:3]] == [3, 5, 7]
    assert instance_languages(PARAMS, 4, np.random.default_rng(1234)) == sets[4]
    assert len({s.vocabularies for s in sets}) == 150
    own = TranslationParams(dataset_seed=None)
    assert instance_languages(own, 4, np.random.default_rng(8)) == instance_languages(own, 4, np.random.default_rng(8))
    assert instance_languages(own, 4, np.random.default_rng(8)) != instance_languages(own, 4, np.random.default_rng(9))


@pytest.mark.parametrize("n", [3, 5, 7])
def test_letter_coverage_optimum_matches_brute_force(n: int) -> None:
    for seed in range(3):
        languages = make_languages(n, PARAMS, np.random.default_rng([seed, n]))
        optimum, triple = best_coverage(letter_masks(languages))
        assert optimum == _brute_force(languages)
        assert len(set(triple)) == 3
        assert coverage_of(languages, [languages.chains[k][0] for k in triple]) == optimum


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**26 - 1), min_size=3, max_size=12))
def test_best_coverage_on_any_masks(masks: list[int]) -> None:
    array = np.array(masks, dtype=np.uint32)
    optimum, (i, j, k) = best_coverage(array)
    brute = max((a | b | c).bit_count() for a, b, c in itertools.combinations(masks, 3))
    assert optimum == brute == (masks[i] | masks[j] | masks[k]).bit_count() and i < j < k
    first = next(t for t in itertools.combinations(range(len(masks)), 3)
                 if (masks[t[0]] | masks[t[1]] | masks[t[2]]).bit_count() == brute)
    assert (i, j, k) == first


def test_coverage_counts_only_translations_of_ll0_words() -> None:
    languages = make_languages(3, PARAMS, np.random.default_rng(4))
    chain = languages.chains[0]
    assert coverage_of(languages, [chain[0]]) == len({chain[1][0], chain[2][0]})
    assert coverage_of(languages, [chain[1]]) == 0  # an LL1 word is not an LL0 word
    assert coverage_of(languages, ["notaword"]) == 0


@pytest.mark.parametrize("bad", [dict(num_languages=(2,)), dict(word_length=(5, 3)), dict(dictionary_size=2),
                                 dict(phrase_length=(0, 5)), dict(phrase_length=(2, 60)),
                                 dict(vocabulary_size=10_000, word_length=(1, 2))])
def test_bad_parameters_say_what_is_wrong(bad: dict) -> None:
    with pytest.raises(ConfigError, match="sync translation"):
        TranslationParams(**bad)
