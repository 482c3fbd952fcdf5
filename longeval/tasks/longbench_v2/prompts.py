"""The LongBench v2 prompts (Bai et al., 2025, Appendix D.3), kept as versioned data.

The paper's appendix shows three templates: zero-shot, the first call of zero-shot + CoT (the model writes
its chain of thought) and the second CoT call (the model reads its own chain of thought and names one
letter). The text here is byte for byte the released files the paper's numbers came from
(`prompts/0shot.txt`, `0shot_cot.txt`, `0shot_cot_ans.txt` in THUDM/LongBench). A PDF cannot show bytes,
so two details come from those files rather than the typeset appendix: "Let’s" is written with a
right single quotation mark (U+2019), and the `<text>` tags sit on their own lines without code fences.
The second CoT call does not repeat the document: as in the paper, it says "The text is too long and
omitted here." and quotes the chain of thought instead.

Slots use the released files' own markers (`$DOC$`, `$Q$`, `$C_A$` … `$C_D$`, `$COT$`). We fill them in
one pass, so a question or a chain of thought that happens to contain a marker is shown as written
(the reference's chained `str.replace` would substitute it again).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

PROMPTS_VERSION = "1"

DOC = "$DOC$"
COT_SLOT = "$COT$"

ZERO_SHOT = (
    "Please read the following text and answer the question below.\n"
    "\n"
    "<text>\n"
    "$DOC$\n"
    "</text>\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
"""Zero-shot: the model answers at once in at most 128 tokens."""

COT = (
    "Please read the following text and answer the questions below.\n"
    "\n"
    "<text>\n"
    "$DOC$\n"
    "</text>\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    "Let\u2019s think step by step:"
)
"""Zero-shot + CoT, first call: the model reasons in at most 1024 tokens."""

COT_ANSWER = (
    "Please read the following text and answer the questions below.\n"
    "\n"
    "The text is too long and omitted here.\n"
    "\n"
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n"
    "(A) $C_A$\n"
    "(B) $C_B$\n"
    "(C) $C_C$\n"
    "(D) $C_D$\n"
    "\n"
    "Let\u2019s think step by step: $COT$\n"
    "\n"
    "Based on the above, what is the single, most likely answer choice? Format your response as follows: "
    '"The correct answer is (insert answer here)".'
)
"""Zero-shot + CoT, second call: the chain of thought in place of the document, 128 tokens to answer."""

TEMPLATES: dict[str, str] = {"zero_shot": ZERO_SHOT, "cot": COT, "cot_answer": COT_ANSWER}

_MARKER = re.compile(r"\$(DOC|Q|C_A|C_B|C_C|C_D|COT)\$")


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace every `$NAME$` marker of `template` by `values["$NAME$"]`, in one pass.

    Markers without a value are left as they are, so `fill` can leave the document slot open.
    """
    return _MARKER.sub(lambda m: values.get(m.group(0), m.group(0)), template)


def split_at(template: str, slot: str, values: Mapping[str, str]) -> tuple[str, str]:
    """The filled text before and after `slot` (which must occur once): the frame around a long piece."""
    if template.count(slot) != 1:
        raise ValueError(f"template must contain {slot} exactly once")
    before, after = template.split(slot)
    return fill(before, values), fill(after, values)


def fingerprint() -> str:
    """A hash of every template above: stored with each instance, so a wording change is never silent."""
    table = {"version": PROMPTS_VERSION, **TEMPLATES}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode("utf-8")).hexdigest()[:16]
