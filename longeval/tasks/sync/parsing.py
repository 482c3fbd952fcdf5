"""Reading SYNC answers out of free model text.

With chain-of-thought the answer is the last line that carries the task's label ("Shortest Path: ...");
the label may be decorated (markdown, "Final", a parenthesis before the colon). When the label was prefilled
as the answer prefix (no-CoT mode), the output itself starts with the answer. Every function here accepts
any string and never raises: model output is data, not input we can trust.
"""

from __future__ import annotations

import re
from functools import lru_cache

from longeval.scoring.string_match import strip_reasoning

MAX_SCAN_CHARS = 100_000
"""A runaway generation is judged on its last 100K characters (CoT) or its first line (prefilled)."""

_MARKUP = "*_`#>|~ \t\r"  # quotes stay: a quoted translation is found by its quotes
_GENERIC = re.compile(r"(?i)(?:final\s+)?answer[^:\n]{0,40}[:：]")
# Possessive `\s*+`: "node" + a long run of spaces backtracked quadratically (64K spaces: 21 s); "#" and the
# digits are not spaces, so no match is lost.
NODE = re.compile(r"(?i)\bnode\s*+#?+\s*+([0-9]{1,6})(?![0-9])")
"""A node an answer names ("Node 7", "node #7"), its number the group."""
_INTEGER = re.compile(r"(?<![0-9])([0-9]{1,6})(?![0-9])")
_NO_PATH = re.compile(
    r"(?i)\b(?:no\s+(?:such\s+|valid\s+|directed\s+|possible\s+|existing\s+)?paths?|not\s+reachable|unreachable"
    r"|(?:does\s*n[o']?t|do\s*n[o']?t|cannot|can\s*not|can't)\s+(?:exist|be\s+reached|reach))\b"
)
_NONE = re.compile(r"(?i)^\W*(?:none|nothing|no\s+nodes?)\b")
_WORD = re.compile(r"[a-z]+")
_QUOTED = re.compile(r"[\"“”]([^\"“”\n]+)[\"“”]")
_ASIDE = re.compile(r"\([^()\n]*\)")


@lru_cache(maxsize=32)
def _label_pattern(label: str) -> re.Pattern[str]:
    words = r"[\s*_`-]*".join(re.escape(w) for w in label.split())
    return re.compile(rf"(?i){words}[^:\n]{{0,60}}[:：]")


def final_answer(output: str, label: str, *, prefilled: bool = False) -> str:
    """The answer text of one output ("" when there is none).

    Args:
        output: The model's raw text (a reasoning model's `<think>` part is dropped).
        label: The task's answer label, e.g. "Shortest Path".
        prefilled: Whether the prompt ended with `label:`, so the output starts with the answer.
    """
    text = strip_reasoning(output if isinstance(output, str) else "")
    if prefilled:
        return _first_line(text[:MAX_SCAN_CHARS])
    text = text[-MAX_SCAN_CHARS:]
    for pattern in (_label_pattern(label), _GENERIC):
        matches = list(pattern.finditer(text))
        if matches:
            return _first_line(text[matches[-1].end() :])
    return _last_line(text)


def _clean(line: str) -> str:
    return line.strip(_MARKUP).strip()


def _first_line(text: str) -> str:
    for line in text.split("\n"):
        if _clean(line):
            return _clean(line)
    return ""


def _last_line(text: str) -> str:
    for line in reversed(text.split("\n")):
        if _clean(line):
            return _clean(line)
    return ""


def parse_nodes(answer: str) -> list[int]:
    """Node ids in order: the numbers after "Node", or bare numbers when "Node" is never written."""
    named = NODE.findall(answer)
    return [int(n) for n in (named or _INTEGER.findall(answer))]


def says_no_path(answer: str) -> bool:
    """Whether the answer says that there is no path, or starts with "none" (no nodes)."""
    return _NO_PATH.search(answer) is not None or _NONE.match(answer) is not None


def parse_words(answer: str) -> list[str]:
    """Lower-case ASCII words: the synthetic languages use only the letters a-z."""
    return _WORD.findall(answer.lower())


def parse_translation(answer: str) -> list[str]:
    """The translated words: the last quoted span when there is one (models often quote), else the line
    without asides in parentheses ("... (LL2)")."""
    quoted = _QUOTED.findall(answer)
    return parse_words(quoted[-1] if quoted else _ASIDE.sub(" ", answer))


def format_nodes(nodes: list[int]) -> str:
    return ", ".join(f"Node {n}" for n in nodes)
