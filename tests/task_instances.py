"""Instances of every registered task, built the way the pipeline builds them: what the tests that loop over the
registry (the task contract, the scorers' linear-time check) share.

A family declares what these need, so it edits nothing here: the length on its `TaskSpec`s (`min_length`), and the
data files its tasks read as `Family.sample_data` (RULER's SQuAD and HotpotQA, LongBench v2's file, TAIL's built
dataset), which the generation context is made of; a synthetic family declares none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longeval.records import Instance, Prediction
from longeval.tasks import FAMILIES, TASKS, configure
from longeval.tasks.base import DataPaths, GenContext, TaskSpec, context_rng, instance_rng, make_instance, output_budget
from longeval.tasks.family import SampleData
from longeval.text import Encoder, PromptFormat, load_encoder

SEED = 97
SMALLEST_LENGTH = 2048
"""Every task is generated at `max(SMALLEST_LENGTH, spec.min_length)`: small, so a test over the registry is fast."""


def length_of(spec: TaskSpec) -> int:
    """The target length a task is tested at: the smallest it is built for (its `min_length`), at least 2048."""
    return max(SMALLEST_LENGTH, spec.min_length)


@pytest.fixture(scope="module")
def task_encoder(smollm2_path: Path) -> Encoder:
    """SmolLM2's tokenizer: the lengths are counted in a real model's tokens."""
    return load_encoder(str(smollm2_path))


def family_samples(folder: Path) -> dict[str, SampleData]:
    """Every registered family's sample data, written under `folder/<family>` (families without any left out)."""
    return {name: family.sample_data(folder / name) for name, family in FAMILIES.items()
            if family.sample_data is not None}


def sample_context(encoder: Encoder, folder: Path) -> GenContext:
    """A generation context made of every registered family's sample data (written under `folder`)."""
    data: dict[str, str] = {}
    params: dict[str, dict] = {}
    for sample in family_samples(folder).values():
        data.update(sample.data)
        for key, values in sample.params.items():
            params[key] = {**params.get(key, {}), **values}
    return GenContext(encoder=encoder, fmt=PromptFormat(), data=DataPaths(**data), task_overrides=params)


@pytest.fixture(scope="module")
def task_ctx(task_encoder: Encoder, tmp_path_factory: pytest.TempPathFactory) -> GenContext:
    """A generation context in which every registered task can generate: each family's sample data, if it has any."""
    return sample_context(task_encoder, tmp_path_factory.mktemp("task-data"))


def task_instance(ctx: GenContext, key: str, index: int = 0) -> Instance:
    """Instance `index` of the task at its test length, the way `stages.generate.generate_shard` builds it."""
    spec = configure(TASKS[key], ctx.task_overrides)
    length = length_of(spec)
    shared = {"context_rng": context_rng(SEED, spec.context_group, length, index)} if spec.context_group else {}
    draft = spec.generate(ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, ctx.fmt, length),
                          rng=instance_rng(SEED, spec.key, length, index), index=index, **shared)
    return make_instance(spec, draft, ctx, target_length=length, seed=SEED, shard_index=0, index=index)


def prediction(instance: Instance, output: str) -> Prediction:
    """A finished prediction of `output` for the instance (no engine)."""
    return Prediction(instance_id=instance.instance_id, model_id="adversary", output=output,
                      output_tokens=len(output) // 4, finish_reason="length", cached_prompt_tokens=0,
                      latency_s=0.0, error="")


def reference_answer(instance: Instance) -> str:
    """The answer a right output would give: the meta's target or answer, else the first reference."""
    meta = json.loads(instance.meta or "{}")
    return str(meta.get("target") or meta.get("answer") or (instance.references[0] if instance.references else ""))
