"""RULER's prompt templates and answer prefixes, verbatim from the reference implementation.

Prompts are versioned data: `TEMPLATE_VERSION` and a hash of this table are stored with every instance.
The variable-tracking prefix keeps RULER's spelling ("assgined") so our prompts match theirs token for token.
"""

from __future__ import annotations

import hashlib
import json

TEMPLATE_VERSION = "ruler-2024"

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
            "are assgined the value {query}, they are: "
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

TEMPLATES_FINGERPRINT = hashlib.sha256(json.dumps(TEMPLATES, sort_keys=True).encode()).hexdigest()[:16]


def fill(kind: str, **values: object) -> tuple[str, str]:
    """The user text (with `{context}` left in place) and the answer prefix for one instance."""
    entry = TEMPLATES[kind]
    template = entry["template"].replace("{context}", "\x00")
    user = template.format(**values).replace("\x00", "{context}")
    return user, entry["answer_prefix"].format(**values)
