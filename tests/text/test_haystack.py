"""The haystack helpers every family may use (`longeval.text.haystack`): depths cycled over instances, and pieces
placed at depths between lines or sentences, with ids that are the text's tokenization. RULER's NIAH is built with
them and checked against RULER's generator in tests/tasks/ruler/test_ruler_reference.py; these check the helpers
as a new family sees them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longeval.text import EssayHaystack, UnitStream, depth_for, insert_between_lines, insert_between_sentences, piece
from longeval.text.corpus import load_essays
from longeval.text.tokenizer import Encoder, load_encoder

ESSAY = ("The first essay starts here. It has a second sentence! Does it ask a question? Mr. Smith thinks so. "
         "Then it ends.\n\nAnother essay follows it. It is short. The end.")
FACT = " The apple is in the kitchen."


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="module")
def essays(encoder: Encoder, tmp_path_factory: pytest.TempPathFactory) -> EssayHaystack:
    folder = tmp_path_factory.mktemp("essays")
    (folder / "a.txt").write_text(ESSAY, encoding="utf-8")
    return EssayHaystack.of(encoder, load_essays(str(folder)))


def test_depths_are_cycled_over_instances() -> None:
    depths = (0.0, 50.0, 100.0)
    assert [depth_for(i, depths) for i in range(7)] == [0.0, 50.0, 100.0, 0.0, 50.0, 100.0, 0.0]


def test_sentence_starts_are_the_corpus_sentences_and_repeat_with_it(essays: EssayHaystack) -> None:
    units = essays.stream.units
    assert units[0] == " The first essay starts here." and " Mr. Smith thinks so." in units  # Punkt's sentences
    period = len(units)
    starts = essays.sentence_units(2 * period).tolist()
    assert starts == list(range(2 * period))  # every unit of this corpus is a whole sentence, and it wraps
    assert essays.begins_sentence(period) and essays.wraps


@pytest.mark.parametrize("depth", [0.0, 25.0, 50.0, 100.0])
def test_a_piece_goes_between_lines_at_its_depth(encoder: Encoder, depth: float) -> None:
    stream = UnitStream(encoder, [f"line {i}\n" for i in range(10)], followed=True)
    fact = piece(encoder, "FACT\n", follower="line")
    context = insert_between_lines(stream, 200, [(depth, fact)])
    lines = context.text.splitlines()
    n = len(lines) - 1  # the lines that fit, besides the fact
    assert lines.index("FACT") == int(n * depth / 100)
    assert np.array_equal(context.ids, encoder.encode_followed(context.text, "line"))


@pytest.mark.parametrize("depth", [0.0, 40.0, 100.0])
def test_a_piece_goes_between_sentences_at_its_depth_as_the_prompt_tokenizes(
        encoder: Encoder, essays: EssayHaystack, depth: float) -> None:
    budget = 60
    context = insert_between_sentences(essays, budget, [(depth, piece(encoder, FACT))], follower="\n\nQuestion")
    n, cut = essays.stream.fill(budget)  # the filler: n whole units and a word cut of the next
    held = len(essays.sentence_units(n)) + (1 if cut.text and essays.begins_sentence(n) else 0)
    before = context.text.split(FACT)[0]
    assert _sentences_in(before, [u.strip() for u in essays.stream.units]) == int(held * depth / 100)
    assert len(context) <= budget + len(piece(encoder, FACT)) + 1  # filler, the piece and at most a join space
    if depth == 100.0:
        assert context.text.endswith(FACT + " ")  # RULER's " ".join leaves a space after a last piece
    assert np.array_equal(context.ids, encoder.encode_followed(context.text, "\n\nQuestion"))  # as the prompt has it


def _sentences_in(text: str, sentences: list[str]) -> int:
    """How many sentences `text` holds, in corpus order (cycled); a cut one at its end counts as one."""
    count, rest = 0, text.strip()
    while rest:
        sentence = sentences[count % len(sentences)]
        assert rest.startswith(sentence) or sentence.startswith(rest), (rest[:60], sentence)
        rest = rest[len(sentence) :].strip()
        count += 1
    return count
