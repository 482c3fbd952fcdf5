"""Contexts built in token space: unit streams, word cuts, the head strip, gap closing and ragged takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from longeval.text.pieces import (
    EMPTY,
    Piece,
    UnitStream,
    close_gap,
    concat,
    cut_words,
    drop_space,
    end_line,
    lead_with_space,
    open_context,
    piece,
    ragged_take,
    strip_head,
)
from longeval.text.render import PromptFormat, render_frame
from longeval.text.tokenizer import Encoder, load_encoder

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

_WORD = st.from_regex(r"[A-Za-z][a-z]{0,9}[.,;!?]?", fullmatch=True)
_UNIT = st.lists(_WORD, min_size=1, max_size=8).map(lambda ws: " " + " ".join(ws))
_UNITS = st.lists(_UNIT, min_size=1, max_size=8)
_TEXT = st.lists(st.from_regex(r"[A-Za-z0-9.,'!?\n-]{0,10}", fullmatch=True), max_size=25).map(" ".join)


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


def _ids(encoder: Encoder, text: str) -> list[int]:
    return [int(t) for t in encoder.encode(text)]


def _next_word_prefix(text: str, prefix: str) -> str:
    """The shortest prefix of `text` ending at a word boundary (a space, or the end) that is longer than `prefix`."""
    words = text.split(" ")
    return next(" ".join(words[:j]) for j in range(len(words) + 1) if len(" ".join(words[:j])) > len(prefix))


# -- UnitStream ---------------------------------------------------------------------------------------


def test_unit_stream_needs_units(encoder: Encoder) -> None:
    with pytest.raises(ValueError):
        UnitStream(encoder, [])


@SETTINGS
@given(units=_UNITS, n=st.integers(0, 40))
def test_tokens_before_counts_the_cyclic_stream(encoder: Encoder, units: list[str], n: int) -> None:
    stream = UnitStream(encoder, units)
    assert stream.tokens_before(n) == sum(len(encoder.encode(units[i % len(units)])) for i in range(n))


@SETTINGS
@given(units=_UNITS, budget=st.integers(0, 400))
def test_units_within_is_the_largest_prefix_that_fits(encoder: Encoder, units: list[str], budget: int) -> None:
    stream = UnitStream(encoder, units)
    n = stream.units_within(budget)
    assert stream.tokens_before(n) <= budget < stream.tokens_before(n + 1)


@SETTINGS
@given(units=_UNITS, start=st.integers(0, 30), size=st.integers(0, 30))
def test_slice_cycles_past_the_end(encoder: Encoder, units: list[str], start: int, size: int) -> None:
    stream = UnitStream(encoder, units)
    got = stream.slice(start, start + size)
    picked = [units[i % len(units)] for i in range(start, start + size)]
    assert got.text == "".join(picked)
    assert [int(t) for t in got.ids] == [t for u in picked for t in _ids(encoder, u)]
    # Units start at a space, so joining their encodings is the tokenization of the joined text.
    assert [int(t) for t in got.ids] == _ids(encoder, got.text)
    assert len(got) == stream.tokens_before(start + size) - stream.tokens_before(start)


def test_slice_over_several_cycles(encoder: Encoder) -> None:
    units = [" One.", " Two two.", " Three three three."]
    stream = UnitStream(encoder, units)
    assert len(stream) == 3
    got = stream.slice(2, 9)  # units 2,0,1,2,0,1,2
    assert got.text == " Three three three. One. Two two." * 2 + " Three three three."
    assert stream.slice(5, 5).text == "" and len(stream.slice(5, 5)) == 0
    assert stream.tokens_before(9) - stream.tokens_before(2) == len(got)


@SETTINGS
@given(units=_UNITS, budget=st.integers(0, 500))
def test_fill_is_never_over_budget_and_cuts_the_next_unit(encoder: Encoder, units: list[str], budget: int) -> None:
    stream = UnitStream(encoder, units)
    n, tail = stream.fill(budget)
    used = stream.tokens_before(n) + len(tail)
    assert used <= budget
    assert stream.tokens_before(n + 1) > budget  # as many whole units as fit
    following = units[n % len(units)]
    assert following.startswith(tail.text) and tail.text != following
    if tail.text:
        assert following[len(tail.text)] == " "
    # Nearly full: one more word of the cut unit would not fit.
    assert len(encoder.encode(_next_word_prefix(following, tail.text))) > budget - stream.tokens_before(n)


# -- cut_words ----------------------------------------------------------------------------------------


@SETTINGS
@given(text=_TEXT, budget=st.integers(-2, 60))
def test_cut_words_fits_and_cuts_at_a_word_boundary(encoder: Encoder, text: str, budget: int) -> None:
    cut = cut_words(encoder, text, budget)
    assert len(cut) <= max(budget, 0)
    assert text.startswith(cut.text)
    assert [int(t) for t in cut.ids] == _ids(encoder, cut.text)
    if cut.text != text and cut.text:
        assert text[len(cut.text)] == " "
    if budget > 0 and cut.text != text:
        # Maximal: the next longer word prefix does not fit.
        assert len(encoder.encode(_next_word_prefix(text, cut.text))) > budget
    if budget >= len(encoder.encode(text)):
        assert cut.text == text


def test_cut_words_examples(encoder: Encoder) -> None:
    text = "alpha beta gamma delta epsilon"
    assert cut_words(encoder, text, 0) is EMPTY
    assert cut_words(encoder, "", 10) is EMPTY
    assert cut_words(encoder, text, 1000).text == text
    two = cut_words(encoder, text, len(encoder.encode("alpha beta")))
    assert two.text == "alpha beta"


# -- strip_head ---------------------------------------------------------------------------------------


@SETTINGS
@given(lead=st.sampled_from([" ", "  ", "\n", " \n", "\n\n", "\n "]), body=_TEXT)
def test_strip_head_drops_leading_whitespace_and_keeps_tokenization(encoder: Encoder, lead: str, body: str) -> None:
    assume(body.strip())
    context = piece(encoder, lead + body)
    out = strip_head(encoder, context)
    assert out.text == (lead + body).lstrip()
    assert [int(t) for t in out.ids] == _ids(encoder, out.text)


def test_strip_head_leaves_unspaced_contexts_alone(encoder: Encoder) -> None:
    context = piece(encoder, "Already stripped. Fine.")
    assert strip_head(encoder, context) is context


def test_strip_head_on_a_built_context(encoder: Encoder) -> None:
    context = concat([piece(encoder, " The first sentence."), piece(encoder, " The second one.")])
    out = strip_head(encoder, context)
    assert out.text == "The first sentence. The second one."
    assert [int(t) for t in out.ids] == _ids(encoder, out.text)


@SETTINGS
@given(lead=st.sampled_from([" ", "  ", "   ", " \n"]), body=_TEXT)
def test_drop_space_drops_one_space_and_keeps_tokenization(encoder: Encoder, lead: str, body: str) -> None:
    assume(body.strip() and not body[0].isspace())
    out = drop_space(encoder, piece(encoder, lead + body))
    assert out.text == lead[1:] + body
    assert [int(t) for t in out.ids] == _ids(encoder, out.text)


def test_drop_space_on_a_built_context_keeps_a_second_space(encoder: Encoder) -> None:
    """RULER's `" ".join(["", needle, ...])`: the context starts with the join's space, which stays."""
    context = concat([piece(encoder, "  One of the special magic numbers."), piece(encoder, " The rest.")])
    out = drop_space(encoder, context)
    assert out.text == " One of the special magic numbers. The rest."
    assert [int(t) for t in out.ids] == _ids(encoder, out.text)
    unspaced = piece(encoder, "Already open.")
    assert drop_space(encoder, unspaced) is unspaced


@SETTINGS
@given(body=_TEXT)
def test_lead_with_space_adds_the_space_and_keeps_tokenization(encoder: Encoder, body: str) -> None:
    assume(body.strip() and not body[0].isspace())
    out = lead_with_space(encoder, piece(encoder, body))
    assert out.text == " " + body
    assert [int(t) for t in out.ids] == _ids(encoder, out.text)
    spaced = piece(encoder, " " + body)
    assert lead_with_space(encoder, spaced) is spaced


def test_open_context_follows_the_frame(encoder: Encoder) -> None:
    context = piece(encoder, " Alpha beta. Gamma.")
    spaced = render_frame(encoder, PromptFormat(chat_template=False), "Words. {context}\nQ", "")
    newline = render_frame(encoder, PromptFormat(chat_template=False), "Words.\n{context}\nQ", "")
    assert open_context(encoder, spaced, context).text == " Alpha beta. Gamma."
    assert open_context(encoder, newline, context).text == "Alpha beta. Gamma."
    for frame in (spaced, newline):
        opened = open_context(encoder, frame, context)
        whole = frame.head_ids.tolist() + opened.ids.tolist() + frame.tail_ids.tolist()
        assert whole == _ids(encoder, frame.head + opened.text + frame.tail)


# -- close_gap ----------------------------------------------------------------------------------------


@st.composite
def _gap_case(draw: st.DrawFn) -> tuple[np.ndarray, list[int], list[int], int, int]:
    lengths = np.array(draw(st.lists(st.integers(1, 20), min_size=2, max_size=40)))
    order = draw(st.permutations(range(len(lengths))))
    k = draw(st.integers(1, len(lengths) - 1))
    gap = draw(st.integers(0, 60))
    weight = draw(st.integers(1, 3))
    return lengths, list(order[:k]), list(order[k:]), gap, weight


@SETTINGS
@given(case=_gap_case())
def test_close_gap_never_overshoots_and_closes_what_it_can(case: tuple) -> None:
    lengths, chosen, spare, gap, weight = case
    new, left = close_gap(lengths, chosen, spare, gap, weight=weight)
    assert len(new) == len(chosen) and len(set(new)) == len(new)
    assert set(new) <= set(chosen) | set(spare)
    assert 0 <= left <= gap
    assert weight * (int(lengths[new].sum()) - int(lengths[chosen].sum())) == gap - left
    # Small inputs are inside the search window: no single swap could close more of the gap.
    rest = (set(chosen) | set(spare)) - set(new)
    assert not any(0 < weight * int(lengths[s] - lengths[c]) <= left for c in new for s in rest)


def test_close_gap_examples() -> None:
    lengths = np.array([1, 1, 1, 2, 2, 2, 5])
    chosen, left = close_gap(lengths, [0, 1, 2], [3, 4, 5], 2)
    assert left == 0 and int(lengths[chosen].sum()) == 5
    chosen, left = close_gap(lengths, [0, 1, 2], [3, 4, 5, 6], 3, weight=3)
    assert left == 0 and int(lengths[chosen].sum()) == 4
    assert close_gap(lengths, [0], [6], 2) == ([0], 2)  # the only swap would overshoot
    assert close_gap(lengths, [0], [], 5) == ([0], 5)


# -- ragged_take and concat ---------------------------------------------------------------------------


@SETTINGS
@given(
    rows=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=6), min_size=1, max_size=8),
    data=st.data(),
)
def test_ragged_take_equals_python_concatenation(rows: list[list[int]], data: st.DataObject) -> None:
    order = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=30))
    arrays = [np.asarray(r, dtype=np.int64) for r in rows]
    got = ragged_take(arrays, np.asarray(order, dtype=np.int64))
    assert got.dtype == np.int32
    assert got.tolist() == [t for i in order for t in rows[i]]


def test_concat_skips_empty_pieces(encoder: Encoder) -> None:
    assert concat([]) is EMPTY
    assert concat([EMPTY, Piece("", np.zeros(0, dtype=np.int32))]) is EMPTY
    a, b = piece(encoder, "Hello"), piece(encoder, " world")
    both = concat([a, EMPTY, b])
    assert both.text == "Hello world" and both.ids.tolist() == a.ids.tolist() + b.ids.tolist()


_LINE = st.lists(_WORD, min_size=1, max_size=6).map(lambda ws: " ".join(ws) + "\n")


@SETTINGS
@given(lines=st.lists(st.one_of(_LINE, st.sampled_from(["VAR ABC = VAR DEF \n", "VAR GHI = 12345\n"])),
                      min_size=1, max_size=8))
def test_line_streams_end_on_a_whole_line_tokenized_as_the_whole_text(encoder: Encoder, lines: list[str]) -> None:
    """Lines encoded as followed, concatenated, then end_line: the text and ids of "\n".join(lines)."""
    stream = UnitStream(encoder, lines, followed=True)
    context = end_line(encoder, stream.slice(0, 2 * len(lines)))
    expected = "\n".join(line[:-1] for line in lines + lines)
    assert context.text == expected
    assert list(context.ids) == list(encoder.encode(expected))
    assert end_line(encoder, context) is context  # nothing to drop
