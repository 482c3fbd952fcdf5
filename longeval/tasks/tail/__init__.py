"""TAIL (Gu, Zhao, Ning, Zheng and Cohan, 2024): a long-context QA benchmark built from the user's own documents.

The pure parts, one job per module:

- `documents`: read `<root>/<domain>/*.txt|md|pdf`, compose one long document per domain, 600-word segments (§3.1);
- `depths`: the gold segment at each depth and Algorithm 1's fall-back to the preceding segment (§3.2);
- `prompts`: the generation, quality-check, RAG-filter and evaluation prompts, versioned;
- `qa`: parsing the generator's JSON, the two checks, cosine retrieval, and Algorithm 1 as a state machine the
  builder drives one batch of LLM calls at a time (§3.2, §3.4);
- `testdocs`: test documents of any token length with the gold at a fixed depth (§3.3);
- `dataset`: the built benchmark's on-disk format (version 1), reader and writer;
- `task`: the evaluation task; `scoring`: deterministic option mapping, the depth × length grid, Avg, wAvg and
  the long/short ratio (§3.5, §4.3).

The builder that calls the generator model lives in `longeval.builders`; nothing here calls a model.
"""

from __future__ import annotations

from longeval.scoring.judgement import Judge
from longeval.tasks.base import TaskSpec
from longeval.tasks.family import Family, Panel, ReportSection, SummaryTable, borrowed_threshold
from longeval.tasks.tail.choice import parse_choice
from longeval.tasks.tail.dataset import (
    DATASET_KEY,
    FORMAT_VERSION,
    Manifest,
    TailDataset,
    TailQuestion,
    accepted_question,
    load_tail_dataset,
    make_manifest,
    question_id,
    write_tail_dataset,
)
from longeval.tasks.tail.depths import (
    DEFAULT_DEPTHS,
    check_depths,
    initial_segments,
    previous_segment,
    segment_at_depth,
)
from longeval.tasks.tail.documents import SEGMENT_WORDS, Domain, compose, load_domains, normalise, segment
from longeval.tasks.tail.prompts import LETTERS, PROMPTS_VERSION
from longeval.tasks.tail.prompts import fingerprint as prompt_fingerprint
from longeval.tasks.tail.qa import (
    MAX_ATTEMPTS,
    REASONS,
    TOP_K,
    Attempt,
    Question,
    Slot,
    Stage,
    Verdict,
    check_quality,
    check_rag,
    next_step,
    parse_question,
    prompt_for,
    provenance,
    retrieval_query,
    retrieve,
    shuffle_options,
    start,
)
from longeval.tasks.tail.samples import sample_data
from longeval.tasks.tail.scoring import (
    ERROR_TYPES,
    UNMAPPED,
    WRONG,
    Cell,
    Heatmap,
    LengthSummary,
    accuracy_grid,
    heatmap,
    length_accuracy,
    length_summary,
    score_tail,
    summarise_lengths,
)
from longeval.tasks.tail.summary import (
    HEADLINE_METRICS,
    grid_cells,
    grid_table,
    headline_metric,
    headline_metrics,
    headline_table,
    render_headline,
)
from longeval.tasks.tail.task import (
    COT_MAX_NEW_TOKENS,
    DIRECT_MAX_NEW_TOKENS,
    JUDGE_MAX_NEW_TOKENS,
    TailParams,
    generate,
    judge_draft,
    max_new_tokens,
)
from longeval.tasks.tail.testdocs import EncodedDomain, TailDocument, build_test_document, encode_domain

__all__ = [
    "COT_MAX_NEW_TOKENS",
    "DATASET_KEY",
    "DEFAULT_DEPTHS",
    "DIRECT_MAX_NEW_TOKENS",
    "JUDGE_MAX_NEW_TOKENS",
    "ERROR_TYPES",
    "FAMILY",
    "FORMAT_VERSION",
    "LETTERS",
    "MAX_ATTEMPTS",
    "METRIC",
    "PROMPTS_VERSION",
    "REASONS",
    "SEGMENT_WORDS",
    "TAIL_SCORERS",
    "TAIL_TASKS",
    "TOP_K",
    "UNMAPPED",
    "WRONG",
    "Attempt",
    "Cell",
    "Domain",
    "EncodedDomain",
    "Heatmap",
    "LengthSummary",
    "Manifest",
    "Question",
    "Slot",
    "Stage",
    "TailDataset",
    "TailDocument",
    "TailParams",
    "TailQuestion",
    "Verdict",
    "accepted_question",
    "accuracy_grid",
    "build_test_document",
    "check_depths",
    "check_quality",
    "check_rag",
    "compose",
    "encode_domain",
    "generate",
    "heatmap",
    "judge_draft",
    "initial_segments",
    "length_accuracy",
    "length_summary",
    "load_domains",
    "load_tail_dataset",
    "make_manifest",
    "max_new_tokens",
    "next_step",
    "normalise",
    "parse_choice",
    "parse_question",
    "previous_segment",
    "prompt_fingerprint",
    "prompt_for",
    "provenance",
    "question_id",
    "retrieval_query",
    "retrieve",
    "score_tail",
    "segment",
    "segment_at_depth",
    "shuffle_options",
    "start",
    "summarise_lengths",
    "write_tail_dataset",
]

METRIC = "tail_choice"

TAIL_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("tail", "tail", TailParams(), generate, METRIC, COT_MAX_NEW_TOKENS, judge=score_tail,
             budget=max_new_tokens,
             followup=judge_draft, followup_budget=JUDGE_MAX_NEW_TOKENS, min_length=8192),
)
"""The registry entry; `budget` gives 32 tokens when a suite sets `suite.params.tail.cot=false`. The benchmark
folder is a param (`suite.params.tail.dataset`), not a `suite.data` path, so `needs` is empty. With
`suite.params.tail.judge=true`, unmapped outputs get a judge call through `followup`."""

TAIL_SCORERS: dict[str, Judge] = {METRIC: score_tail}


FAMILY = Family(
    name="tail", title="TAIL", threshold=borrowed_threshold("TAIL"), tasks=TAIL_TASKS, sample_data=sample_data,
    intro="TAIL's Figure 5: accuracy by the depth of the evidence (rows) and the context length (columns); "
          "its Table 2: Avg, wAvg(inc), wAvg(dec) and the longest/shortest ratio. TAIL weighs lengths by their "
          "size (wAvg(inc) weights = the lengths), RULER by their rank (1..L), so the leaderboard's TAIL row and "
          "TAIL Table 2 below give different wAvg for the same accuracies; quote Table 2 against the paper.",
    tables=(SummaryTable("tail_grid", "TAIL: accuracy by depth and length (Figure 5)", grid_table, "heatmap",
                         log=False, heatmap=grid_cells),  # W&B gets it as a heatmap image (tracking.plot_specs)
            SummaryTable("tail_headline", "TAIL: Table 2", headline_table, render_headline,
                         metrics=headline_metrics)),
    panels=(Panel("Avg / wAvg(inc) / wAvg(dec) as TAIL weighs them (%)",
                  tuple(headline_metric(m) for m in HEADLINE_METRICS[:3])),
            Panel("longest / shortest length ratio", (headline_metric("ratio"),))),
    report=(ReportSection("heatmap", "TAIL depth × length", "tail_grid",
                          caption="Accuracy (%) by depth of the evidence (rows) and length (columns); grey: no "
                                  "instances.",
                          alt="TAIL: accuracy heatmap by evidence depth and context length, one panel per run",
                          rows="tail_headline", rows_caption="TAIL Table 2"),),
    task_curves_caption="Accuracy per length with its 95 % interval (TAIL's per-length line chart).",
)
