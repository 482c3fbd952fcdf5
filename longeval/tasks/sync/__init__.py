"""SYNC (Cao, Zou and Wang, 2025): synthetic contexts shared by tasks of rising difficulty.

Two domains, three tasks each, and within a domain one context per (seed, length, index): the tasks differ
only in the question after it, so a drop in score from retrieval to tracking to global understanding is the
task's doing, not the context's (§3.3), and the engine computes the shared prefix once. Generators take the
pipeline's `context_rng` (identical for a domain's three tasks) and build the graph or languages and the
layout from it; the query comes from the task's own `rng`.

Output budgets: `max_new_tokens(params)` gives 1024 tokens with chain-of-thought (the default, the paper's
main setting) and 128 without; the specs below carry the CoT budget. The three tasks of a domain must share
their params and budget, or their contexts differ.
"""

from __future__ import annotations

from collections.abc import Callable

from longeval.scoring.judgement import Judgement
from longeval.stats.aggregate import ladder
from longeval.tasks.base import Draft, TaskSpec
from longeval.tasks.family import Family, Panel, ReportSection, SummaryTable, borrowed_threshold
from longeval.tasks.sync.graph import (
    GraphParams,
    generate_connected_nodes,
    generate_longest_path,
    generate_shortest_path,
)
from longeval.tasks.sync.scoring import (
    ERROR_TYPES,
    SYNC_SCORERS,
    score_connected_nodes,
    score_letter_coverage,
    score_longest_path,
    score_multi_hop,
    score_shortest_path,
    score_single_hop,
)
from longeval.tasks.sync.translation import (
    TranslationParams,
    generate_letter_coverage,
    generate_multi_hop_translation,
    generate_single_hop_translation,
)

__all__ = [
    "CONTEXT_GROUPS",
    "COT_MAX_NEW_TOKENS",
    "DIRECT_MAX_NEW_TOKENS",
    "FAMILY",
    "ERROR_TYPES",
    "GraphParams",
    "Judgement",
    "LADDER",
    "SYNC_SCORERS",
    "SYNC_TASKS",
    "TranslationParams",
    "generate_connected_nodes",
    "generate_letter_coverage",
    "generate_longest_path",
    "generate_multi_hop_translation",
    "generate_shortest_path",
    "generate_single_hop_translation",
    "max_new_tokens",
    "score_connected_nodes",
    "score_letter_coverage",
    "score_longest_path",
    "score_multi_hop",
    "score_shortest_path",
    "score_single_hop",
]

COT_MAX_NEW_TOKENS = 1024
"""Room to reason: the paper finds most models write under 500 CoT tokens on retrieval and 500 to 1,000 on
the global tasks at 64K (§5.2, Figure 2)."""
DIRECT_MAX_NEW_TOKENS = 128
"""Without CoT the answer is one line; the longest (a 20-node path) is under 100 tokens."""

GRAPH_GROUP = "sync/graph"
TRANSLATION_GROUP = "sync/translation"

CONTEXT_GROUPS: dict[str, str] = {
    "connected_nodes": GRAPH_GROUP,
    "shortest_path": GRAPH_GROUP,
    "longest_path": GRAPH_GROUP,
    "single_hop_translation": TRANSLATION_GROUP,
    "multi_hop_translation": TRANSLATION_GROUP,
    "letter_coverage": TRANSLATION_GROUP,
}


LADDER: dict[str, tuple[str, str]] = {
    "connected_nodes": ("graph", "retrieval"),
    "shortest_path": ("graph", "tracking"),
    "longest_path": ("graph", "global"),
    "single_hop_translation": ("translation", "retrieval"),
    "multi_hop_translation": ("translation", "tracking"),
    "letter_coverage": ("translation", "global"),
}
"""Each task's domain and the capability it tests (§3.3): the rungs compared on one shared context."""


def max_new_tokens(params: GraphParams | TranslationParams) -> int:
    """The output budget for a SYNC task with these params: larger with chain-of-thought."""
    return COT_MAX_NEW_TOKENS if params.cot else DIRECT_MAX_NEW_TOKENS


def _spec(name: str, params: GraphParams | TranslationParams, generate: Callable[..., Draft], metric: str) -> TaskSpec:
    return TaskSpec("sync", name, params, generate, metric, max_new_tokens(params), judge=SYNC_SCORERS[metric],
                    budget=max_new_tokens, context_group=CONTEXT_GROUPS[name],
                    min_length=4096 if CONTEXT_GROUPS[name] == TRANSLATION_GROUP else 0)


SYNC_TASKS: tuple[TaskSpec, ...] = (
    _spec("connected_nodes", GraphParams(), generate_connected_nodes, "sync_connected_nodes"),
    _spec("shortest_path", GraphParams(), generate_shortest_path, "sync_shortest_path"),
    _spec("longest_path", GraphParams(), generate_longest_path, "sync_longest_path"),
    _spec("single_hop_translation", TranslationParams(), generate_single_hop_translation, "sync_single_hop"),
    _spec("multi_hop_translation", TranslationParams(), generate_multi_hop_translation, "sync_multi_hop"),
    _spec("letter_coverage", TranslationParams(), generate_letter_coverage, "sync_letter_coverage"),
)


FAMILY = Family(
    name="sync", title="SYNC", threshold=borrowed_threshold("SYNC"), tasks=SYNC_TASKS,
    intro="The three tasks of a domain read the same contexts: retrieval (connected nodes, single-hop "
          "translation), tracking (shortest path, multi-hop translation) and global (longest path, letter "
          "coverage), so the fall from rung to rung at one length is the task's doing (SYNC §3.3). The error "
          "types are the paper's Table 5.",
    tables=(SummaryTable("sync_ladder", "SYNC: retrieval, tracking and global on one context",
                         lambda tasks, rows: ladder(tasks, LADDER), "ladder"),),
    panels=(Panel(table="sync_ladder"), Panel(table="errors")),  # the ladder and the error types (its Table 5)
    report=(ReportSection("ladder", "SYNC task ladder", "sync_ladder",
                          caption="Line style is the rung (solid retrieval, dashed tracking, dotted global), colour "
                                  "the run.",
                          alt="SYNC: retrieval, tracking and global scores per domain against length",
                          rows_caption="same context, harder questions (SYNC §3.3)"),
            ReportSection("errors", "SYNC error types", "errors",
                          caption="Stacked shares of each kind of failure (SYNC Table 5: no answer, invalid path, "
                                  "suboptimal path).",
                          alt="SYNC: share of instances per kind of failure, per run, task and length",
                          rows_caption="SYNC error types (Table 5)")),
)
