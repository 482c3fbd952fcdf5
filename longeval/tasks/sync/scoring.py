"""The six SYNC scorers: (output, references, meta) -> Judgement, each 0 or 1 as in the paper.

The graph tasks check the model's answer against the graph in `meta`, not against one reference string:
any shortest or longest path counts if all its edges exist and its length is optimal (§3.1). Path errors
follow the paper's error analysis (§5.4): "no_answer" (nothing parseable), "invalid_path" (an edge that does
not exist, wrong end points, or a wrong claim that no path exists), "suboptimal_path" (valid but not of the
optimal length). The other tasks use "no_answer", "wrong_answer", and for letter coverage "invalid_words"
(not three LL0 words) and "suboptimal_words" (three words, fewer letters than the optimum).

Scorers never raise on any output string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from longeval.scoring.judgement import Judgement
from longeval.tasks.sync.parsing import (
    final_answer,
    format_nodes,
    parse_nodes,
    parse_translation,
    parse_words,
    says_no_path,
)
from longeval.tasks.sync.prompts import TASK_PROMPTS

NO_ANSWER = "no_answer"
INVALID_PATH = "invalid_path"
SUBOPTIMAL_PATH = "suboptimal_path"
WRONG_ANSWER = "wrong_answer"
INVALID_WORDS = "invalid_words"
SUBOPTIMAL_WORDS = "suboptimal_words"
ERROR_TYPES = (NO_ANSWER, INVALID_PATH, SUBOPTIMAL_PATH, WRONG_ANSWER, INVALID_WORDS, SUBOPTIMAL_WORDS)

MAX_PARSED_NODES = 200
"""Parsed answers are for inspection: a runaway list of nodes is cut in `parsed_answer` (not in scoring)."""


def _answer(output: str, task: str, meta: dict[str, Any]) -> str:
    return final_answer(output, TASK_PROMPTS[task].label, prefilled=bool(meta.get("answer_prefix")))


def _edges(meta: dict[str, Any]) -> frozenset[tuple[int, int]]:
    return frozenset((int(u), int(v)) for u, v in meta["edges"])


def _shown(nodes: list[int]) -> str:
    return format_nodes(nodes[:MAX_PARSED_NODES]) + (" ..." if len(nodes) > MAX_PARSED_NODES else "")


def _is_path(edges: frozenset[tuple[int, int]], nodes: list[int]) -> bool:
    return all((a, b) in edges for a, b in zip(nodes, nodes[1:], strict=False))


def score_connected_nodes(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Exact match of the set of nodes named (a mention of the queried node itself is ignored)."""
    answer = _answer(output, "connected_nodes", meta)
    named = parse_nodes(answer)
    if not named and not says_no_path(answer):
        return Judgement(0.0, answer[:200], NO_ANSWER)
    query = int(meta["node"])
    nodes = sorted(set(named) - {query})
    right = set(nodes) == {int(n) for n in meta["successors"]}
    return Judgement(float(right), _shown(nodes) or "none", "" if right else WRONG_ANSWER)


def score_shortest_path(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """A path from source to target along existing edges, of the shortest length; or "no path" when right."""
    answer = _answer(output, "shortest_path", meta)
    distance = meta.get("distance")
    nodes = parse_nodes(answer)
    ends = {int(meta["source"]), int(meta["target"])}
    if says_no_path(answer) and set(nodes) <= ends:  # "no path from Node s to Node t" names only the ends
        return Judgement(float(distance is None), "no path", "" if distance is None else INVALID_PATH)
    if not nodes:
        return Judgement(0.0, answer[:200], NO_ANSWER)
    shown = _shown(nodes)
    valid = (len(nodes) >= 2 and nodes[0] == int(meta["source"]) and nodes[-1] == int(meta["target"])
             and _is_path(_edges(meta), nodes))
    if not valid or distance is None:
        return Judgement(0.0, shown, INVALID_PATH)
    if len(nodes) - 1 == int(distance):
        return Judgement(1.0, shown, "")
    return Judgement(0.0, shown, SUBOPTIMAL_PATH)


def score_longest_path(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """A path along existing edges whose length equals the longest path's."""
    answer = _answer(output, "longest_path", meta)
    nodes = parse_nodes(answer)
    if not nodes:
        return Judgement(0.0, answer[:200], NO_ANSWER)
    shown = _shown(nodes)
    in_graph = all(0 <= n < int(meta["num_nodes"]) for n in nodes)
    if not in_graph or not _is_path(_edges(meta), nodes):
        return Judgement(0.0, shown, INVALID_PATH)
    if len(nodes) - 1 == int(meta["longest_length"]):
        return Judgement(1.0, shown, "")
    return Judgement(0.0, shown, SUBOPTIMAL_PATH)


def _score_translation(task: str, output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    words = parse_translation(_answer(output, task, meta))
    if not words:
        return Judgement(0.0, "", NO_ANSWER)
    shown = " ".join(words)[:2000]
    right = any(words == parse_words(ref) for ref in references)
    return Judgement(float(right), shown, "" if right else WRONG_ANSWER)


def score_single_hop(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Exact match of the translated words (case, quotes and punctuation aside)."""
    return _score_translation("single_hop_translation", output, references, meta)


def score_multi_hop(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Exact match of the translated words (case, quotes and punctuation aside)."""
    return _score_translation("multi_hop_translation", output, references, meta)


def score_letter_coverage(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Three distinct LL0 words whose translations' first letters number as many as the optimum (§3.2)."""
    answer = _answer(output, "letter_coverage", meta)
    tokens = parse_words(answer)
    if not tokens:
        return Judgement(0.0, answer[:200], NO_ANSWER)
    vocabulary = set(meta["source_vocabulary"])
    chosen = list(dict.fromkeys(t for t in tokens if t in vocabulary))
    shown = ", ".join(chosen[:50])
    if len(chosen) != 3:
        return Judgement(0.0, shown, INVALID_WORDS)
    translations = {chain[0]: chain[1:] for chain in meta["chains"]}
    letters = {w[0] for word in chosen for w in translations.get(word, ())}
    right = len(letters) == int(meta["optimum"])
    return Judgement(float(right), shown, "" if right else SUBOPTIMAL_WORDS)


SYNC_SCORERS: dict[str, Callable[[str, Sequence[str], dict[str, Any]], Judgement]] = {
    "sync_connected_nodes": score_connected_nodes,
    "sync_shortest_path": score_shortest_path,
    "sync_longest_path": score_longest_path,
    "sync_single_hop": score_single_hop,
    "sync_multi_hop": score_multi_hop,
    "sync_letter_coverage": score_letter_coverage,
}
