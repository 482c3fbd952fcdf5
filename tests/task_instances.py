"""Instances of every registered task, built the way the pipeline builds them: what the tests that loop over the
registry (the task contract, the scorers' linear-time check) share.

A family declares what these need on its `TaskSpec`s (`min_length`), so it edits nothing here. The generation
context holds small samples of the user data files the registry's `DataPaths` name (SQuAD, HotpotQA, LongBench
v2) and a TAIL dataset; a synthetic family needs none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longeval.records import Instance, Prediction
from longeval.tasks import TASKS, configure
from longeval.tasks.base import DataPaths, GenContext, TaskSpec, context_rng, instance_rng, make_instance, output_budget
from longeval.text import Encoder, PromptFormat, load_encoder
from tests.qa_fixtures import hotpotqa_file, squad_file  # noqa: F401  (fixtures task_ctx uses)
from tests.tasks.longbench_v2.lb2_helpers import make_item, write_json
from tests.tasks.tail.tail_helpers import build_dataset, domain_of

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


@pytest.fixture(scope="module")
def task_ctx(task_encoder: Encoder, squad_file: Path, hotpotqa_file: Path,  # noqa: F811
             tmp_path_factory: pytest.TempPathFactory) -> GenContext:
    """A generation context in which every registered task can generate: the data files and the TAIL dataset."""
    folder = tmp_path_factory.mktemp("task-data")
    longbench = write_json(folder / "longbench_v2.json", [make_item(i) for i in range(4)])
    tail = build_dataset(folder / "tail", [domain_of("finance", 1100), domain_of("law", 1000)], (0.25, 0.5, 0.75))
    data = DataPaths(squad_path=str(squad_file), hotpotqa_path=str(hotpotqa_file), longbench_v2_path=longbench)
    return GenContext(encoder=task_encoder, fmt=PromptFormat(), data=data, task_overrides={"tail": {"dataset": tail}})


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
