"""LongBench v2 (Bai et al., 2025): 503 hard multiple-choice questions on real long documents.

The data is the user's file (`suite.data.longbench_v2_path`); `data` reads and checks it, `prompts` holds the
Appendix D.3 templates, `task` builds prompts with the document middle-truncated in tokens (§4), and `scoring`
extracts the letter and computes the breakdown of Table 2 with the compensated accuracy of Table 5.

One task, `longbench_v2`, in the paper's two settings: zero-shot (the default, 128 output tokens) and
zero-shot + CoT (`suite.params.longbench_v2.cot=true`: a 1024-token chain of thought, then a second call,
`cot_answer_draft`, with 128 tokens for the answer).
"""

from __future__ import annotations

from longeval.scoring.judgement import Judge
from longeval.tasks.base import TaskSpec
from longeval.tasks.family import Family, Panel, ReportSection, SummaryTable, borrowed_threshold
from longeval.tasks.longbench_v2.data import (
    DIFFICULTIES,
    DOMAINS,
    LENGTHS,
    LongBenchV2Data,
    LongBenchV2Item,
    load_longbench_v2,
    select,
)
from longeval.tasks.longbench_v2.prompts import fingerprint as prompt_fingerprint
from longeval.tasks.longbench_v2.samples import sample_data
from longeval.tasks.longbench_v2.scoring import (
    ERROR_TYPES,
    GUESS_SCORE,
    INVALID,
    WRONG,
    breakdown,
    extract_answer,
    is_invalid,
    score_longbench_v2,
)
from longeval.tasks.longbench_v2.summary import breakdown_metric, breakdown_metrics, breakdown_table
from longeval.tasks.longbench_v2.task import (
    COT_ANSWER_MAX_NEW_TOKENS,
    COT_MAX_NEW_TOKENS,
    ZERO_SHOT_MAX_NEW_TOKENS,
    LongBenchV2Params,
    Truncated,
    cot_answer_draft,
    generate,
    max_new_tokens,
    middle_truncate,
)

__all__ = [
    "COT_ANSWER_MAX_NEW_TOKENS",
    "COT_MAX_NEW_TOKENS",
    "DIFFICULTIES",
    "DOMAINS",
    "ERROR_TYPES",
    "FAMILY",
    "GUESS_SCORE",
    "INVALID",
    "LENGTHS",
    "LONGBENCH_V2_SCORERS",
    "LONGBENCH_V2_TASKS",
    "LongBenchV2Data",
    "LongBenchV2Item",
    "LongBenchV2Params",
    "METRIC",
    "Truncated",
    "WRONG",
    "ZERO_SHOT_MAX_NEW_TOKENS",
    "breakdown",
    "cot_answer_draft",
    "extract_answer",
    "generate",
    "is_invalid",
    "load_longbench_v2",
    "max_new_tokens",
    "middle_truncate",
    "prompt_fingerprint",
    "score_longbench_v2",
    "select",
]

METRIC = "longbench_v2_choice"
DECODING_DEVIATION = "the paper samples at temperature 0.1 (Appendix D.3's setup); we decode greedily"

LONGBENCH_V2_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("longbench_v2", "longbench_v2", LongBenchV2Params(), generate, METRIC, ZERO_SHOT_MAX_NEW_TOKENS,
             judge=score_longbench_v2, needs=("longbench_v2_path",), budget=max_new_tokens, followup=cot_answer_draft,
             followup_budget=COT_ANSWER_MAX_NEW_TOKENS, decoding_deviation=DECODING_DEVIATION),
)
"""The registry entry; `budget` gives the CoT call its 1024 tokens when a suite sets `cot=true`, and
`followup` makes the pipeline ask the answer call with the chain of thought quoted (`longeval.stages.followup`)."""

LONGBENCH_V2_SCORERS: dict[str, Judge] = {METRIC: score_longbench_v2}


FAMILY = Family(
    name="longbench_v2", title="LongBench v2", tasks=LONGBENCH_V2_TASKS, sample_data=sample_data,
    threshold=borrowed_threshold("LongBench v2"),
    intro="LongBench v2's Table 2: accuracy overall, by difficulty, by length bucket (short < 32k, "
          "medium 32k–128k, long > 128k words) and by domain. Compensated accuracy counts an "
          "unparseable answer as a 0.25 guess (its Table 5); chance is 25.",
    tables=(SummaryTable("longbench_v2", "LongBench v2: Table 2", breakdown_table, "breakdown",
                         metrics=breakdown_metrics),),
    has_depth=False,
    panels=(Panel("accuracy by difficulty and length (%)",
                  tuple(breakdown_metric(g) for g in ("overall", *DIFFICULTIES, *LENGTHS))),
            Panel("accuracy by domain (%)", tuple(breakdown_metric(d) for d in DOMAINS)),
            Panel("compensated accuracy (%)", (breakdown_metric("overall", compensated=True),))),
    report=(ReportSection("breakdown", "LongBench v2 breakdown", "longbench_v2",
                          caption="Bars: accuracy; black ticks: compensated accuracy; dotted: chance.",
                          alt="LongBench v2: accuracy overall, by difficulty and by length per run",
                          rows_caption="LongBench v2 (Table 2 layout, with Table 5's compensated accuracy)"),),
)
