"""Small synthetic SQuAD v2.0 and HotpotQA files in the real upstream formats, for the RULER QA tasks: RULER's
`Family.sample_data`.

The real dev sets cannot be downloaded here, so these writers build deterministic stand-ins: paragraphs
of about 80-150 words made of synthetic sentences, every answer occurring in its gold paragraph (with a
correct `answer_start` for SQuAD), and some unanswerable SQuAD v2 questions with empty answer lists.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from longeval.tasks.family import SampleData

_ADJECTIVES = (
    "ancient", "bright", "quiet", "narrow", "northern", "golden", "hidden", "coastal", "famous", "early",
    "western", "broad", "sacred", "modern", "rural", "royal", "busy", "distant", "humble", "vast",
    "eastern", "fertile", "stone", "wooden", "silver", "crowded", "remote", "steep", "gentle", "civic",
)
_NOUNS = (
    "river", "harbor", "library", "council", "bridge", "market", "village", "garden", "tower", "museum",
    "railway", "school", "valley", "temple", "fortress", "canal", "orchard", "guild", "chapel", "mill",
    "archive", "festival", "treaty", "charter", "province", "monastery", "academy", "lighthouse", "quarry",
    "observatory", "theater", "aqueduct", "workshop", "estate", "plaza", "harvest", "colony", "expedition",
)
_VERBS = (
    "described", "rebuilt", "expanded", "visited", "governed", "protected", "studied", "restored",
    "financed", "mapped", "celebrated", "defended", "documented", "renamed", "surveyed", "supplied",
)
_TIMES = (
    "during the long winter", "after the great flood", "in the following decade", "before the harvest",
    "under the old charter", "within a single generation", "at the turn of the century", "over many years",
)
_SYLLABLES = (
    "ka", "lor", "ven", "tri", "mas", "dun", "el", "bra", "quo", "shi", "vad", "ren", "ost", "pel", "gar",
    "thi", "mun", "zel", "cor", "ax", "wyn", "fel", "dar", "sol", "nim", "bel", "tor", "ula", "ves", "hal",
)


def _name(rng: random.Random, taken: set[str]) -> str:
    """A unique synthetic proper name of two capitalised pseudo-words (e.g. 'Korven Dashil')."""
    while True:
        parts = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize() for _ in range(2)]
        name = " ".join(parts)
        if name not in taken:
            taken.add(name)
            return name


def _filler(rng: random.Random, subject: str) -> str:
    """One synthetic sentence of 12-20 words."""
    adj, noun, verb = rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)
    adj2, noun2, when = rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_TIMES)
    forms = (
        f"The {adj} {noun} of {subject} was {verb} by the {adj2} {noun2} {when}.",
        f"Records of the {noun} show that the {adj2} {noun2} near {subject} was {verb} {when}.",
        f"{when.capitalize()}, travellers {verb} the {adj} {noun} and the {adj2} {noun2} of {subject}.",
        f"Local historians note that the {adj} {noun2} beside the {noun} was {verb} {when} by its keepers.",
    )
    return rng.choice(forms)


def _paragraph(rng: random.Random, subject: str, facts: list[str], min_words: int, max_words: int) -> list[str]:
    """Sentences about `subject`, with the fact sentences spread among them, of min..max words in total."""
    target = rng.randint(min_words, max_words)
    sentences = [_filler(rng, subject)]
    while sum(len(s.split()) for s in sentences) + sum(len(f.split()) for f in facts) < target:
        sentences.append(_filler(rng, subject))
    for fact in facts:
        sentences.insert(rng.randint(1, len(sentences)), fact)
    while sum(len(s.split()) for s in sentences) > max_words and len(sentences) > len(facts) + 1:
        for i in range(len(sentences) - 1, -1, -1):
            if sentences[i] not in facts:
                del sentences[i]
                break
    return sentences


def write_squad(path: str | Path, n_articles: int = 6, paragraphs: int = 5, seed: int = 0) -> Path:
    """Write a SQuAD v2.0 dev-format JSON file with synthetic articles; returns the path."""
    rng = random.Random(seed)
    taken: set[str] = set()
    data: list[dict[str, Any]] = []
    qid = 0
    for _ in range(n_articles):
        title = _name(rng, taken).replace(" ", "_")
        subject = title.replace("_", " ")
        paras = []
        for _ in range(paragraphs):
            founder, place = _name(rng, taken), _name(rng, taken)
            noun = rng.choice(_NOUNS)
            facts = [
                f"The {noun} of {subject} was founded by {founder} in the town of {place}.",
            ]
            sentences = _paragraph(rng, subject, facts, 80, 150)
            context = " ".join(sentences)
            qas = []
            start = context.index(founder)
            surname = founder.split()[1]
            answers = [{"text": founder, "answer_start": start}]
            if rng.random() < 0.5:  # a second annotator's shorter answer, as in the real dev set
                answers.append({"text": surname, "answer_start": context.index(surname, start)})
            qas.append({"id": f"{qid:024x}", "question": f"Who founded the {noun} of {subject}?",
                        "answers": answers, "is_impossible": False})
            qid += 1
            qas.append({"id": f"{qid:024x}", "question": f"In which town was the {noun} of {subject} founded?",
                        "answers": [{"text": place, "answer_start": context.index(place)}], "is_impossible": False})
            qid += 1
            # SQuAD v2: an unanswerable question, with empty answers and a plausible (wrong) answer.
            qas.append({"id": f"{qid:024x}", "question": f"Who demolished the {noun} of {subject}?",
                        "answers": [], "plausible_answers": [{"text": founder, "answer_start": start}],
                        "is_impossible": True})
            qid += 1
            paras.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": paras})
    out = Path(path)
    out.write_text(json.dumps({"version": "v2.0", "data": data}), encoding="utf-8")
    return out


def write_hotpotqa(path: str | Path, n_items: int = 30, seed: int = 0) -> Path:
    """Write a HotpotQA dev-distractor-format JSON file (10 paragraphs per question); returns the path."""
    rng = random.Random(seed)
    taken: set[str] = set()
    items: list[dict[str, Any]] = []
    for k in range(n_items):
        titles = [_name(rng, taken) for _ in range(10)]
        bridge, answer = _name(rng, taken), _name(rng, taken)
        noun = rng.choice(_NOUNS)
        gold_a, gold_b = rng.sample(range(10), 2)
        context: list[list[Any]] = []
        supporting: list[list[Any]] = []
        for i, title in enumerate(titles):
            facts: list[str] = []
            if i == gold_a:
                facts = [f"The {noun} of {title} was designed by {bridge}."]
            elif i == gold_b:
                facts = [f"{bridge} was trained as an architect by {answer}."]
            sentences = _paragraph(rng, title, facts, 80, 110)
            # HotpotQA sentences keep their separating space at the start of every sentence but the first.
            sentences = [s if j == 0 else " " + s for j, s in enumerate(sentences)]
            for fact in facts:
                supporting.append([title, next(j for j, s in enumerate(sentences) if s.strip() == fact)])
            context.append([title, sentences])
        items.append({
            "_id": f"{rng.getrandbits(96):024x}",
            "question": f"Who trained the designer of the {noun} of {titles[gold_a]}?",
            "answer": answer,
            "type": "bridge",
            "level": ("easy", "medium", "hard")[k % 3],
            "supporting_facts": supporting,
            "context": context,
        })
    out = Path(path)
    out.write_text(json.dumps(items), encoding="utf-8")
    return out


def sample_data(folder: Path) -> SampleData:
    """SQuAD (about 300 paragraphs: enough for qa_1 at 4096 tokens) and HotpotQA (30 questions x 10 paragraphs)."""
    folder.mkdir(parents=True, exist_ok=True)
    squad = write_squad(folder / "dev-v2.0.json", n_articles=30, paragraphs=10)
    hotpotqa = write_hotpotqa(folder / "hotpot_dev_distractor_v1.json")
    return SampleData(data={"squad_path": str(squad), "hotpotqa_path": str(hotpotqa)})
