"""TAIL's RAG filter with the real all-MiniLM-L6-v2 embedder: a question whose answer another segment also
states is shown that segment, and a generator that answers it from there gets the question rejected."""

from __future__ import annotations

import pytest

from longeval.builders.embed import Embedder
from longeval.tasks.tail import Stage, next_step, prompt_for, retrieval_query, retrieve
from longeval.tasks.tail.qa import RAG_ANSWERABLE, Question, Slot

FILLER = [
    "The quarterly meeting reviewed the cafeteria menu and the new parking rules for visitors.",
    "Rainfall in the northern valley was above average, and the river reached its spring height early.",
    "The orchestra rehearsed a new symphony and announced three concerts for the autumn season.",
    "A volunteer group repainted the old library and catalogued donated books about local history.",
]
GOLD = "The lighthouse keeper recorded that the Harwick lighthouse lamp was replaced with an LED array in 1998."
COPY = "Town records note the Harwick lighthouse got its LED lamp array in 1998, replacing the old bulb."


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


def test_the_segment_that_repeats_the_fact_is_retrieved_and_the_question_rejected(embedder):
    segments = [FILLER[0], COPY, FILLER[1], FILLER[2], GOLD, FILLER[3]]
    question = Question("In which year did the Harwick lighthouse get an LED lamp array?",
                        ("1988", "1992", "1998", "2004", "2008", "2012"), "C")
    vectors = embedder.encode(segments)
    shown = retrieve(embedder.encode([retrieval_query(question)])[0], vectors, exclude={4}, k=2)
    assert shown[0] == 1  # the repeated fact, not the filler
    slot = Slot(domain="towns", depth=0.6, segment=4, stage=Stage.RAG, candidate=question, generation="{...}")
    prompt = prompt_for(slot, segments, retrieved=shown)
    assert COPY in prompt and GOLD not in prompt  # the generator sees the other segments, never the gold
    after = next_step(slot, "The records say 1998.\nAnswer: C", retrieved=shown)
    assert after.stage is Stage.GENERATE and after.attempt == 2  # rejected: a new question on the same segment
    assert after.history[-1].reason == RAG_ANSWERABLE and after.history[-1].retrieved == tuple(shown)
    kept = next_step(slot, "None of the excerpts says.\nAnswer: NONE", retrieved=shown)
    assert kept.stage is Stage.ACCEPTED
