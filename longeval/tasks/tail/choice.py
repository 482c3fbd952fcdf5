"""Mapping a free-text answer to one of the options A–F, deterministically.

TAIL's reference asks GPT-4o-mini to map each output to an option (§3.5). We map by rules first and only
leave the rest ("unmapped") for an optional judge: the last answer statement ("Answer: C", "the correct answer
is (C)", "\\boxed{C}"), else a last line that is only a letter ("C", "(C) ...", "Option C"), else a final answer
that is exactly one option's text. An answer naming two letters ("B or C") is not mapped. The same mapping
checks the generator's own answers while the benchmark is built, so building and evaluation agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from longeval.tasks.tail.prompts import LETTERS

MARKER = re.compile(
    r"\b(?:final\s+answer|correct\s+(?:answer|option|choice)|best\s+(?:answer|option|choice)|answer)\b"
    r"(?:\s+(?:is|would\s+be|should\s+be|will\s+be|must\s+be))?\s*(?:[:=\uff1a]|-(?!-))?[ \t]*",
    re.IGNORECASE,
)
"""An answer statement ("the correct answer is", "Answer:"): the clause after the last one names the letter."""
_CLAUSE = re.compile(r"((?:option|choice|letter)\s+)?([(\[])?([A-Fa-f])([)\]])?", re.IGNORECASE)
_LEADING_SPACE = re.compile(r"\s*+")
_WORD = re.compile(r"\S+")
ALTERNATIVE = re.compile(r"\s*(?:,|/|&|\bor\b|\band\b)\s*(?:option\s+)?[(\[]?[A-F][)\]]?(?![A-Za-z])")
"""A second letter after the clause's ("B or C", "B/C"): the statement is `AMBIGUOUS`."""
CLOSES = re.compile(r"(?:$|[.,:;!?)\]\-\u2013\u2014]|\s*$|\s+[-\u2013\u2014(:])")
"""What may follow a bare letter for it to be one ("C.", "C -", "C" at the end), not a word's first letter."""
A_FOLLOWERS = frozenset({"because", "since", "as", "is", "it", "this", "which", "given", "based", "according",
                         "from", "per"})
"""Words after an uppercase "A" that show it is the letter ("A because ...") rather than an article ("A total")."""
_BOXED = re.compile(r"\\boxed\{\s*(?:\\text\{\s*)?\(?([A-F])\)?\s*\}?")
_BARE_LINE = re.compile(r"(?:(?:option|choice)\s+)?[(\[]?([A-F])[)\]]?(?:$|[.:,)]|\s+[-\u2013\u2014:(])", re.IGNORECASE)
_EDGE = " \"'`.,:;!?()[]"
"""Stripped from both ends of a normalised answer (str.strip: a trailing-run regex is quadratic on long runs)."""
AMBIGUOUS = "?"
"""What `last_statement` gives for a statement naming two letters: `parse_choice` maps it to none."""


def parse_choice(output: str, options: Sequence[str] = ()) -> str:
    """The letter A–F that `output` settles on, or "" when no rule maps it (never raises)."""
    if not isinstance(output, str):
        return ""
    text = output
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    elif "<think>" in text:
        return ""  # the model never finished thinking
    text = text.replace("*", "").replace("`", "")
    found, clause = last_statement(text)
    if found == AMBIGUOUS:
        return ""
    if found:
        return found
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    bare = _BARE_LINE.match(last)
    if bare and (bare.group(1).isupper() or len(last) <= 3):
        return bare.group(1).upper()
    return _by_text([clause, last, text], options)


def last_statement(text: str) -> tuple[str, str]:
    """The letter of the last answer statement that names one ("" if none, `AMBIGUOUS` if it names two), and the
    text after the last answer marker (for matching an option's text).

    Works on positions in `text` rather than slices of each marker's line: a long line with thousands of markers
    would otherwise be copied once per marker (quadratic time).
    """
    found, line_end, stop, last = "", -1, 0, None
    for marker in MARKER.finditer(text):
        start = marker.end()
        if start > line_end:  # a new line: its end, and where its trailing whitespace starts
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
            stop = line_end
            while stop > start and text[stop - 1].isspace():
                stop -= 1
        last = start
        end = max(stop, start)
        letter = _letter(text, _LEADING_SPACE.match(text, start, end).end(), end)
        if letter:
            found = letter
    return found, "" if last is None else text[last:line_end]


def _letter(text: str, start: int, stop: int) -> str:
    """The letter the answer clause `text[start:stop]` (stripped) starts with, `AMBIGUOUS`, or "" when it starts
    with something else. Patterns run on the span (`pos`, `endpos`), which reads as the slice would."""
    match = _CLAUSE.match(text, start, stop)
    if not match:
        return ""
    prefix, opened, letter, closed = match.groups()
    at = match.end()
    if at < stop and text[at].isalnum():
        return ""  # "Answer: Cats ..." starts with a word, not a letter
    if ALTERNATIVE.match(text, at, stop):
        return AMBIGUOUS
    if prefix or opened or closed or CLOSES.match(text, at, stop):
        return letter.upper()
    if not letter.isupper():
        return ""  # "the answer is a bit unclear"
    if letter != "A":
        return letter  # "the answer is C because ..."
    follower = _WORD.search(text, at, stop)
    # "Answer: A total of 12" is the option's text, not a letter
    return "A" if follower is not None and follower.group(0).lower() in A_FOLLOWERS else ""


def normal_form(text: str) -> str:
    """An answer or option text as `parse_choice` compares them: whitespace runs as one space, edge punctuation
    (`_EDGE`) stripped, case folded."""
    return " ".join(text.split()).strip(_EDGE).casefold()  # after the join, " " is the only whitespace left


def _by_text(candidates: Sequence[str], options: Sequence[str]) -> str:
    """The letter of the one option whose text equals a candidate answer (case and edge punctuation aside)."""
    try:
        wanted = [normal_form(str(o)) for o in options]
    except TypeError:
        return ""
    for candidate in candidates:
        key = normal_form(candidate)
        if not key:
            continue
        hits = [i for i, option in enumerate(wanted[: len(LETTERS)]) if option and option == key]
        if len(hits) == 1:
            return LETTERS[hits[0]]
    return ""
