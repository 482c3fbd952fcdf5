"""RULER's prompt templates and answer prefixes, verbatim from the reference implementation.

Prompts are versioned data: each task's prompt fingerprint (`prompt_fingerprint`: its entry of this table,
the singular rewrite for NIAH, and `TEMPLATE_VERSION`) enters its instance ids, generator version and cache key, so a
template change can never be served stale prompts. Checked against RULER's scripts/data/synthetic/constants.py
at commit c3f5e3b (2025: "assigned", no longer "assgined").
"""

from __future__ import annotations

import hashlib
import json

TEMPLATE_VERSION = "ruler-2025-c3f5e3b.5"
"""Bumped whenever a template, or how a generator lays text around it, changes (.2: essay needles between
sentences as RULER places them; .3: word lists keep RULER's entries with a space; .4: in RULER-format mode
CWE's example is a turn of its own; .5: the essay haystack's sentences are nltk Punkt's, as RULER's)."""

TEMPLATES: dict[str, dict[str, str]] = {
    "niah": {
        "template": (
            "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
            "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
        ),
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    },
    "variable_tracking": {
        "template": (
            "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
            "Question: Find all variables that are assigned the value {query} in the text above."
        ),
        "answer_prefix": (
            " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
            "are assigned the value {query}, they are: "
        ),
    },
    "common_words_extraction": {
        "template": (
            "Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n{context}\n"
            "Question: What are the 10 most common words in the above list?"
        ),
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
    },
    "freq_words_extraction": {
        "template": (
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
            "the dots '....'. What are the three most frequently appeared words in the above coded text?"
        ),
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
    },
    "qa": {
        "template": (
            "Answer the question based on the given documents. Only give me the answer and do not output any "
            "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on "
            "the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
        ),
        "answer_prefix": " Answer:",
    },
}

TEMPLATES_FINGERPRINT = hashlib.sha256(
    json.dumps([TEMPLATE_VERSION, TEMPLATES], sort_keys=True).encode()).hexdigest()[:16]


SINGULAR = (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer"))
"""RULER's rewrite of the NIAH template for one query and one value (scripts/data/synthetic/niah.py,
generate_input_output), applied in this order to the unfilled template, so keys are never touched."""


def singular(text: str) -> str:
    for old, new in SINGULAR:
        text = text.replace(old, new)
    return text


def fill(kind: str, *, one_answer: bool = False, **values: object) -> tuple[str, str]:
    """The user text (with `{context}` left in place) and the answer prefix for one instance.

    `one_answer` applies RULER's singular rewrite (NIAH with one query and one value): the template words and
    `type_needle_v` lose their plural ("numbers" -> "number"); the needles themselves stay plural, as RULER's.
    """
    entry = TEMPLATES[kind]
    template, prefix = entry["template"], entry["answer_prefix"]
    if one_answer:
        template, prefix = singular(template), singular(prefix)
        if "type_needle_v" in values:
            values = {**values, "type_needle_v": str(values["type_needle_v"])[:-1]}
    template = template.replace("{context}", "\x00")
    user = template.format(**values).replace("\x00", "{context}")
    return user, prefix.format(**values)


def prompt_fingerprint(kind: str) -> str:
    """The fingerprint of the prompts a task renders: its template entry, TEMPLATE_VERSION and, for NIAH, the
    singular rewrite (which a task uses depends on its parameters, which enter instance ids anyway)."""
    entry = TEMPLATES[kind]
    payload = [TEMPLATE_VERSION, kind, entry, list(SINGULAR) if kind == "niah" else None]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
