"""TAIL's prompts as versioned data: question generation (§3.2, Figure 2), the quality check (§3.2), the RAG
filter (§3.4) and the evaluation (§3.5, Figure 7).

The paper shows its prompts as figures; the wording here is ours, following what they and the reference code ask
for: one question with six options A–F and exactly one right answer, returned as JSON; the check answers from the
gold paragraph alone; the filter answers from retrieved excerpts, allowed to say there is not enough information;
the evaluated model thinks step by step and ends with one answer line, so the answer is mapped without a judge.

Slots are `$NAME$` markers filled in one pass, so a paragraph or option containing a marker stays as written.
Change any template and bump `PROMPTS_VERSION`: the fingerprint is stored with every built question and instance.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence

PROMPTS_VERSION = "2"  # 2: the answer-mapping judge
LETTERS = ("A", "B", "C", "D", "E", "F")
"""§3.2: six options, one right; guessing gives 1/6."""

GENERATION = (
    "Write one multiple-choice question about the paragraph below, for a reading test.\n"
    "\n"
    "Rules:\n"
    "- The question must be answerable from this paragraph alone, and its answer must be a specific fact stated "
    "in it, not general knowledge.\n"
    "- The question must stay clear when the paragraph sits inside a long document: name people, organisations, "
    "dates and things explicitly, and never refer to \"the paragraph\", \"the passage\", \"the text\" or "
    "\"the context\".\n"
    "- Give exactly six options, labelled A to F. Exactly one option is correct; the others must be plausible "
    "but clearly wrong according to the paragraph.\n"
    "\n"
    "Paragraph:\n"
    "<paragraph>\n"
    "$PARAGRAPH$\n"
    "</paragraph>\n"
    "\n"
    "Reply with one JSON object and nothing else, in this form:\n"
    '{"question": "...", "options": {"A": "...", "B": "...", "C": "...", "D": "...", "E": "...", "F": "..."}, '
    '"answer": "<the letter of the correct option>"}'
)
"""Algorithm 1 line 3: one question per gold paragraph, as JSON (the reference asks for a JSON object too)."""

QUALITY = (
    "Answer the multiple-choice question below using only this paragraph.\n"
    "\n"
    "Paragraph:\n"
    "<paragraph>\n"
    "$PARAGRAPH$\n"
    "</paragraph>\n"
    "\n"
    "Question: $QUESTION$\n"
    "Options:\n"
    "$OPTIONS$\n"
    "\n"
    'Think briefly if you need to, then end with one line of the form "Answer: X", where X is one of '
    "A, B, C, D, E or F."
)
"""Algorithm 1 line 4: a question the generator cannot answer from its own gold paragraph is discarded."""

RAG = (
    "Answer the multiple-choice question below using only these excerpts. If they do not contain enough "
    "information to answer it, say so.\n"
    "\n"
    "Excerpts:\n"
    "$EXCERPTS$\n"
    "\n"
    "Question: $QUESTION$\n"
    "Options:\n"
    "$OPTIONS$\n"
    "\n"
    'Think briefly if you need to, then end with one line of the form "Answer: X", where X is one of '
    'A, B, C, D, E or F, or "Answer: NONE" if the excerpts are not enough.'
)
"""Algorithm 1 line 8 (§3.4): a question answerable from the top-5 other segments is discarded."""

EVAL_COT = (
    "I will give you a multiple-choice question and a document. Answer the question using only the document.\n"
    "\n"
    "Question: $QUESTION$\n"
    "Options:\n"
    "$OPTIONS$\n"
    "\n"
    "Document:\n"
    "$DOCUMENT$\n"
    "\n"
    "Think step by step and write out your reasoning. Then give your final answer on the last line, in the form "
    '"Answer: X", where X is one of A, B, C, D, E or F.'
)
"""§3.5 / §4.2 (Figure 7): question first, then the document; chain of thought, 512 output tokens."""

EVAL_DIRECT = (
    "I will give you a multiple-choice question and a document. Answer the question using only the document.\n"
    "\n"
    "Question: $QUESTION$\n"
    "Options:\n"
    "$OPTIONS$\n"
    "\n"
    "Document:\n"
    "$DOCUMENT$\n"
    "\n"
    'Reply with the letter of the correct option only, in the form "Answer: X", where X is one of '
    "A, B, C, D, E or F."
)
"""Without chain of thought (not in the paper): the answer prefix "Answer:" is prefilled, 32 output tokens."""

DIRECT_ANSWER_PREFIX = "Answer:"
DOCUMENT = "$DOCUMENT$"

JUDGE = (
    "Below are a multiple-choice question and a response to it. Which option does the response give as its final "
    "answer?\n"
    "\n"
    "Question: $QUESTION$\n"
    "Options:\n"
    "$OPTIONS$\n"
    "\n"
    "Response:\n"
    "<response>\n"
    "$DOCUMENT$\n"
    "</response>\n"
    "\n"
    "Reply with the letter of that option only (A, B, C, D, E or F), or X if the response gives no single option."
)
"""§3.5's answer mapping by an LLM, for the outputs the deterministic parser cannot map (`suite.params.tail.judge`);
the response sits where an evaluation prompt's document does."""
JUDGE_ANSWER_PREFIX = "Answer:"

TEMPLATES: dict[str, str] = {"generation": GENERATION, "quality": QUALITY, "rag": RAG, "eval_cot": EVAL_COT,
                             "eval_direct": EVAL_DIRECT, "judge": JUDGE}

_MARKER = re.compile(r"\$(PARAGRAPH|QUESTION|OPTIONS|EXCERPTS|DOCUMENT)\$")


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace each `$NAME$` marker by `values["NAME"]` in one pass; markers without a value stay."""
    return _MARKER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def format_options(options: Sequence[str]) -> str:
    """"A. first\\nB. second ..." — the way options are shown in every prompt."""
    return "\n".join(f"{letter}. {str(text).strip()}" for letter, text in zip(LETTERS, options, strict=False))


def generation_prompt(paragraph: str) -> str:
    """The user message asking for one question about `paragraph`."""
    return fill(GENERATION, {"PARAGRAPH": paragraph})


def quality_prompt(paragraph: str, question: str, options: Sequence[str]) -> str:
    """The user message asking to answer the question from its own gold paragraph."""
    return fill(QUALITY, {"PARAGRAPH": paragraph, "QUESTION": question.strip(), "OPTIONS": format_options(options)})


def rag_prompt(question: str, options: Sequence[str], excerpts: Sequence[str]) -> str:
    """The user message asking to answer from retrieved excerpts (numbered [1], [2], ...) only."""
    shown = "\n\n".join(f"[{i}] {text}" for i, text in enumerate(excerpts, start=1)) or "(none)"
    return fill(RAG, {"EXCERPTS": shown, "QUESTION": question.strip(), "OPTIONS": format_options(options)})


def evaluation_parts(question: str, options: Sequence[str], *, cot: bool) -> tuple[str, str, str]:
    """The evaluation prompt split at the document: (text before, text after, answer prefix)."""
    before, after = (EVAL_COT if cot else EVAL_DIRECT).split(DOCUMENT)  # split first: a question may hold the marker
    values = {"QUESTION": question.strip(), "OPTIONS": format_options(options)}
    return fill(before, values), fill(after, values), "" if cot else DIRECT_ANSWER_PREFIX


def judge_parts(question: str, options: Sequence[str]) -> tuple[str, str, str]:
    """The judge prompt split at the response: (text before, text after, answer prefix)."""
    before, after = JUDGE.split(DOCUMENT)
    values = {"QUESTION": question.strip(), "OPTIONS": format_options(options)}
    return fill(before, values), fill(after, values), JUDGE_ANSWER_PREFIX


def fingerprint() -> str:
    """A hash of every template and the version: stored with built questions and instances."""
    blob = json.dumps([PROMPTS_VERSION, TEMPLATES, DIRECT_ANSWER_PREFIX], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
