"""Running a SYNC task the way `pipeline.generate_shard` does, for the tests."""

from __future__ import annotations

import numpy as np

from longeval.records import Instance
from longeval.tasks.base import Draft, GenContext, TaskSpec, context_rng, instance_rng, make_instance, output_budget

SEED = 20250417


def run(ctx: GenContext, spec: TaskSpec, length: int, index: int, *, seed: int = SEED,
        rng: np.random.Generator | None = None) -> tuple[Draft, Instance]:
    """One instance: the task's own rng and the domain's context_rng, then the pipeline's length check."""
    draft = spec.generate(
        ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, ctx.fmt, length),
        rng=rng or instance_rng(seed, spec.key, length, index), index=index,
        context_rng=context_rng(seed, spec.context_group, length, index),
    )
    return draft, make_instance(spec, draft, ctx, target_length=length, seed=seed, shard_index=0, index=index)
