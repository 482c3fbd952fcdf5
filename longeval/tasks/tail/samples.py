"""A small built TAIL benchmark (varied report text, one question per domain and depth): TAIL's
`Family.sample_data`."""

from __future__ import annotations

import json
from pathlib import Path

from longeval.tasks.family import SampleData
from longeval.tasks.tail.dataset import TailQuestion, make_manifest, question_id, write_tail_dataset
from longeval.tasks.tail.depths import initial_segments
from longeval.tasks.tail.documents import Domain, compose
from longeval.tasks.tail.prompts import LETTERS
from longeval.tasks.tail.qa import Question

NOUNS = ("revenue", "headcount", "backlog", "inventory", "margin", "turnover", "output", "demand", "yield", "cost")
PLACES = ("Aberdeen", "Leeds", "Cardiff", "Belfast", "Dundee", "Exeter", "Bristol", "Durham", "Bangor", "Oxford")


def report(tag: str, sentences: int, *, start: int = 0) -> str:
    """Distinct, varied sentences (numbers, names, punctuation), so tokenization is realistic and nothing repeats."""
    lines = []
    for k in range(start, start + sentences):
        lines.append(
            f"In {PLACES[k % 10]}, the {NOUNS[(k * 7) % 10]} of {tag} unit {k} changed by "
            f"{(k * 37) % 101 - 50}.{k % 10}% (quarter {k % 4 + 1}); "
            f"officials called it \"{'notable' if k % 3 else 'routine'}\"."
        )
        if k % 5 == 4:
            lines.append("")  # a paragraph break, normalised away
    return "\n".join(lines)


def domain_of(name: str, sentences: int) -> Domain:
    return compose(name, [(f"{name}.txt", report(name, sentences))])


def question_for(domain: Domain, segment: int, depth: float, answer: str = "C") -> TailQuestion:
    options = tuple(f"{domain.name} option {letter} for segment {segment}" for letter in LETTERS)
    q = Question(f"What does {domain.name} segment {segment} report at depth {depth}?", options, answer)
    return TailQuestion(
        question_id=question_id(domain.fingerprint, segment, depth, q), domain=domain.name, gold_segment=segment,
        depth=depth, question=q.question, options=options, answer=answer, gold_text=domain.segments[segment],
        generator_model="test-generator", provenance=json.dumps({"attempts": []}),
    )


def build_dataset(folder: Path, domains: list[Domain], depths: tuple[float, ...]) -> str:
    """Write a benchmark with one question per (domain, depth), gold at the segment nearest that depth."""
    questions = []
    for domain in domains:
        for depth, seg in zip(depths, initial_segments(domain.word_counts, depths), strict=True):
            questions.append(question_for(domain, seg, depth, answer=LETTERS[seg % 6]))
    write_tail_dataset(str(folder), questions, {d.name: d.segments for d in domains},
                       make_manifest(generator_model="test-generator", seed=7, domains=domains))
    return str(folder)


def sample_data(folder: Path) -> SampleData:
    """Two domains (finance, law) of about 1,000 sentences, questions at depths 25, 50 and 75 %."""
    dataset = build_dataset(folder / "tail", [domain_of("finance", 1100), domain_of("law", 1000)], (0.25, 0.5, 0.75))
    return SampleData(params={"tail": {"dataset": dataset}})
