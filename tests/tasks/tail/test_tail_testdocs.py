"""Test documents in the model's tokens: exact budgets, the gold whole and at its depth, at 8K, 16K and 32K."""

from __future__ import annotations

import numpy as np
import pytest

from longeval.errors import LengthError
from longeval.tasks.tail import Domain, EncodedDomain, build_test_document, encode_domain, segment_at_depth
from longeval.tasks.tail.testdocs import cut_head, cut_tail
from longeval.text.tokenizer import Encoder
from tests.tasks.tail.tail_helpers import domain_of

SLACK = 24
"""A window falls short of its budget by less than one word at its end (a long number is a few tokens)."""


@pytest.fixture(scope="module")
def domain() -> Domain:
    return domain_of("finance", 1500)


@pytest.fixture(scope="module")
def encoded(encoder: Encoder, domain: Domain) -> EncodedDomain:
    return encode_domain(encoder, domain.segments)


def test_the_domain_is_long_enough_for_32k(encoded: EncodedDomain) -> None:
    assert encoded.tokens > 40_000 and len(encoded.texts) > 40


@pytest.mark.parametrize("budget", [8192, 16384, 32768])
@pytest.mark.parametrize("depth", [0.05, 0.25, 0.5, 0.75, 0.95])
def test_budget_and_depth(encoder: Encoder, domain: Domain, encoded: EncodedDomain, budget: int, depth: float) -> None:
    gold = segment_at_depth(domain.word_counts, depth)  # as the builder picks it: room on both sides
    doc = build_test_document(encoder, encoded, gold, depth, budget)
    ids = doc.piece.ids
    assert budget - SLACK <= len(ids) <= budget
    assert abs(doc.depth - depth) < 0.003  # a few tokens out of thousands
    gold_ids = encoded.ids[gold]
    assert doc.gold_tokens == len(gold_ids)
    assert np.array_equal(ids[doc.gold_start : doc.gold_start + doc.gold_tokens], gold_ids)  # whole, untouched
    assert encoded.texts[gold] in doc.piece.text
    assert doc.piece.text.index(encoded.texts[gold]) == len(encoder.decode(ids[: doc.gold_start]))
    assert not doc.piece.text.startswith(" ")  # the default frame has no space before the document
    assert doc.first_segment < gold < doc.last_segment
    assert doc.depth == pytest.approx(doc.gold_start / (len(ids) - doc.gold_tokens))


def test_the_window_tokenizes_as_its_text(encoder: Encoder, encoded: EncodedDomain) -> None:
    doc = build_test_document(encoder, encoded, 20, 0.4, 8192)
    assert np.array_equal(encoder.encode(doc.piece.text), doc.piece.ids)


def test_same_depth_at_every_length(encoder: Encoder, domain: Domain, encoded: EncodedDomain) -> None:
    gold = segment_at_depth(domain.word_counts, 0.3)
    depths = [build_test_document(encoder, encoded, gold, 0.3, n).depth for n in (8192, 16384, 32768)]
    assert max(depths) - min(depths) < 0.003
    starts = [build_test_document(encoder, encoded, gold, 0.3, n).start_fraction for n in (8192, 32768)]
    assert starts[0] < starts[1] < 0.3  # the start fraction moves with the gold's share of the document


def test_ends_of_the_range(encoder: Encoder, encoded: EncodedDomain) -> None:
    first = build_test_document(encoder, encoded, 20, 0.0, 8192)
    assert first.gold_start == 0 and first.depth == 0.0 and first.first_segment == 20
    assert first.piece.text.startswith(encoded.texts[20][1:40])
    last = build_test_document(encoder, encoded, 20, 1.0, 8192)
    assert last.depth == 1.0 and last.last_segment == 20
    assert last.piece.text.endswith(encoded.texts[20][-40:])


def test_near_the_domain_start_the_window_shifts(encoder: Encoder, encoded: EncodedDomain) -> None:
    doc = build_test_document(encoder, encoded, 1, 0.9, 16384)
    assert doc.first_segment == 0 and doc.depth < 0.1  # only one segment exists before the gold
    assert len(doc.piece) <= 16384


def test_a_leading_space_is_kept_when_the_frame_wants_it(encoder: Encoder, encoded: EncodedDomain) -> None:
    doc = build_test_document(encoder, encoded, 10, 0.5, 8192, lead=" ")
    assert doc.piece.text.startswith(" ") and len(doc.piece) <= 8192


def test_too_short_a_domain_or_too_small_a_budget(encoder: Encoder, encoded: EncodedDomain) -> None:
    with pytest.raises(LengthError, match=r"domain 'finance' is \d+ tokens long, shorter than the 200000-token"):
        build_test_document(encoder, encoded, 5, 0.5, 200_000, name="finance")
    with pytest.raises(LengthError, match="gold segment 5 is"):
        build_test_document(encoder, encoded, 5, 0.5, 100, name="finance")
    with pytest.raises(ValueError):
        build_test_document(encoder, encoded, 999, 0.5, 8192)
    with pytest.raises(ValueError):
        build_test_document(encoder, encoded, 5, 5.0, 8192)


def test_cuts_stop_at_word_boundaries(encoder: Encoder) -> None:
    text = " alpha beta gamma delta epsilon zeta eta theta"
    head = cut_head(encoder, text, 4)
    assert text.startswith(head.text) and len(head) <= 4 and (text[len(head.text):][:1] == " ")
    tail = cut_tail(encoder, text, 4)
    assert text.endswith(tail.text) and tail.text.startswith(" ") and len(tail) <= 4
    assert cut_head(encoder, text, 0).text == "" and cut_tail(encoder, text, 100).text == text
