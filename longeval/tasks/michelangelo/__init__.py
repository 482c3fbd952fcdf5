"""Michelangelo (Vodrahalli et al., 2024, "Michelangelo: Long Context Evaluations Beyond Haystacks via
Latent Structure Queries"): three tasks whose answer depends on a latent structure hidden in the context.

- `latent_list` (§2.1): a Python list updated by a few relevant operations among filler that cancels out.
- `mrcr` (§2.2): reproduce the k-th of several writings of one format and topic from a long conversation.
- `idk` (§2.3): answer "I don't know" when the story does not say, and only then.

Output budgets: Latent List answers a number or a short list (at most 26 values, about 110 tokens
with one-digit tokenizers) → 128; MRCR must reproduce a whole writing, the paper's up to 512 tokens
(ours are at most about 200; longer harvested ones are never asked) → 512; IDK needs a letter, or the
sentence that says the context does not tell, and room for a model that explains first → 128.
"""

from __future__ import annotations

from longeval.scoring.judgement import Judge
from longeval.tasks.base import TaskSpec
from longeval.tasks.family import Family, ReportSection, Sampling, SummaryTable, borrowed_threshold
from longeval.tasks.michelangelo import idk, latent_list, mrcr
from longeval.tasks.michelangelo.idk import IdkParams, score_idk
from longeval.tasks.michelangelo.latent_list import LatentListParams, score_latent_list
from longeval.tasks.michelangelo.mrcr import MrcrParams, score_mrcr
from longeval.tasks.michelangelo.stratify import SUBSETS, stacked_counts, stacked_weights
from longeval.tasks.michelangelo.summary import chance_rates, render_chance

__all__ = [
    "FAMILY",
    "MICHELANGELO_SCORERS",
    "MICHELANGELO_TASKS",
    "IdkParams",
    "LatentListParams",
    "MrcrParams",
    "score_idk",
    "score_latent_list",
    "score_mrcr",
]

MICHELANGELO_TASKS: tuple[TaskSpec, ...] = (
    TaskSpec("michelangelo", "latent_list", LatentListParams(), latent_list.generate, "michelangelo_latent_list",
             128, judge=score_latent_list),
    TaskSpec("michelangelo", "mrcr", MrcrParams(), mrcr.generate, "michelangelo_mrcr", 512, judge=score_mrcr,
             min_length=4096),
    TaskSpec("michelangelo", "idk", IdkParams(), idk.generate, "michelangelo_idk", 128, judge=score_idk),
)

MICHELANGELO_SCORERS: dict[str, Judge] = {
    "michelangelo_latent_list": score_latent_list,
    "michelangelo_mrcr": score_mrcr,
    "michelangelo_idk": score_idk,
}
"""Scorers by metric name (each reads the instance's meta)."""


FAMILY = Family(
    name="michelangelo", title="Michelangelo", threshold=borrowed_threshold("Michelangelo"), tasks=MICHELANGELO_TASKS,
    intro="Michelangelo reports cumulative average scores: the mean over every instance of length up "
          "to L (solid lines, as in the paper's curves), beside the pointwise score at L (dashed). "
          "The dotted line is the task's chance rate (Appendix B, simulated on our generators): read "
          "scores against it, not against 0.",
    tables=(SummaryTable("chance", "Michelangelo: chance rates (Appendix B)", chance_rates, render_chance),),
    sampling=Sampling(choices=tuple(SUBSETS), counts=stacked_counts, weights=stacked_weights),
    cumulative_curves=True,
    report=(ReportSection("cumulative", "Michelangelo cumulative curves", "cumulative",
                          caption="Solid: cumulative average score over instances up to length L; dashed: score at "
                                  "L; dotted: chance.",
                          alt="Michelangelo: cumulative and pointwise score against context length per task",
                          rows="chance", rows_caption="chance rates (Michelangelo Appendix B)"),),
)
