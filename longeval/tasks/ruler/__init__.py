"""RULER (Hsieh et al., 2024): the 13-task configuration of the paper's main results.

Each entry is one parametrised generator with the paper's settings; output budgets are RULER's
`tokens_to_generate`; metrics are its recall-based string matches.
"""

from __future__ import annotations

from longeval.scoring.string_match import judge_all, judge_part
from longeval.tasks.base import TaskSpec
from longeval.tasks.family import RULER_THRESHOLD, Family
from longeval.tasks.ruler import aggregation, niah, qa, variable_tracking
from longeval.tasks.ruler.aggregation import CweParams, FweParams
from longeval.tasks.ruler.niah import NiahParams
from longeval.tasks.ruler.qa import QaParams
from longeval.tasks.ruler.samples import sample_data
from longeval.tasks.ruler.templates import prompt_fingerprint
from longeval.tasks.ruler.variable_tracking import VtParams

__all__ = [
    "FAMILY",
    "RULER_GROUPS",
    "RULER_TASKS",
    "CweParams",
    "FweParams",
    "NiahParams",
    "QaParams",
    "VtParams",
]


def _niah(name: str, **params: object) -> TaskSpec:
    return TaskSpec("ruler", name, NiahParams(**params), niah.generate, "string_match_all", 128, judge=judge_all,
                    prompt_fingerprint=prompt_fingerprint("niah"))


RULER_TASKS: tuple[TaskSpec, ...] = (
    _niah("niah_single_1", haystack="noise", type_key="words", type_value="numbers"),
    _niah("niah_single_2", haystack="essay", type_key="words", type_value="numbers"),
    _niah("niah_single_3", haystack="essay", type_key="words", type_value="uuids"),
    _niah("niah_multikey_1", haystack="essay", type_key="words", type_value="numbers", num_needle_k=4),
    _niah("niah_multikey_2", haystack="needle", type_key="words", type_value="numbers"),
    _niah("niah_multikey_3", haystack="needle", type_key="uuids", type_value="uuids"),
    _niah("niah_multivalue", haystack="essay", type_key="words", type_value="numbers", num_needle_v=4),
    _niah("niah_multiquery", haystack="essay", type_key="words", type_value="numbers", num_needle_k=4,
          num_needle_q=4),
    TaskSpec("ruler", "vt", VtParams(), variable_tracking.generate, "string_match_all", 30, judge=judge_all,
             prompt_fingerprint=prompt_fingerprint("variable_tracking")),
    TaskSpec("ruler", "cwe", CweParams(), aggregation.generate_cwe, "string_match_all", 120, judge=judge_all,
             prompt_fingerprint=prompt_fingerprint("common_words_extraction")),
    TaskSpec("ruler", "fwe", FweParams(), aggregation.generate_fwe, "string_match_all", 50, judge=judge_all,
             prompt_fingerprint=prompt_fingerprint("freq_words_extraction")),
    TaskSpec("ruler", "qa_1", QaParams(dataset="squad"), qa.generate, "string_match_part", 32, judge=judge_part,
             needs=("squad_path",), prompt_fingerprint=prompt_fingerprint("qa")),
    TaskSpec("ruler", "qa_2", QaParams(dataset="hotpotqa"), qa.generate, "string_match_part", 32, judge=judge_part,
             needs=("hotpotqa_path",), prompt_fingerprint=prompt_fingerprint("qa")),
)

RULER_GROUPS: dict[str, str] = {
    **{spec.name: "retrieval" for spec in RULER_TASKS if spec.name.startswith("niah")},
    "vt": "multi-hop tracking", "cwe": "aggregation", "fwe": "aggregation", "qa_1": "QA", "qa_2": "QA",
}
"""RULER's task categories (its §3)."""

FAMILY = Family(
    name="ruler", title="RULER", tasks=RULER_TASKS, sample_data=sample_data, skill_groups=RULER_GROUPS,
    threshold=RULER_THRESHOLD,
    intro="Scores are RULER's string_match_all (NIAH, VT, CWE, FWE) or string_match_part (QA), ×100. The "
          "per-task figure draws each task against length with its 95 % interval shaded; the dotted "
          "line is the effective-length threshold. Compare with RULER's Table 3 and its per-task appendix.",
    threshold_on_task_curves=True,
)
