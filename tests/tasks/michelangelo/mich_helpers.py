"""Helpers for the Michelangelo tests: draft an instance the way the pipeline does, and cut a prompt
into its parts."""

from __future__ import annotations

import numpy as np

from longeval.tasks.base import Draft, GenContext, TaskSpec, instance_rng
from longeval.tasks.michelangelo import MICHELANGELO_TASKS

SEED = 4321
SPECS = {spec.name: spec for spec in MICHELANGELO_TASKS}


def make(ctx: GenContext, spec: TaskSpec, length: int, index: int, *, params: object = None,
         seed: int = SEED) -> Draft:
    """One draft as the pipeline asks for it (per-instance rng, the task's own output budget)."""
    return spec.generate(ctx, params or spec.params, target_length=length, max_new_tokens=spec.max_new_tokens,
                         rng=instance_rng(seed, spec.key, length, index), index=index)


def between(text: str, before: str, after: str) -> str:
    """The text between the last `before` and the last `after` (the task's own copy, after the examples)."""
    start = text.rindex(before) + len(before)
    end = text.rindex(after)
    assert start <= end, (before, after)
    return text[start:end]


def rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))
