"""What every task shares: the generation context, the task spec, and turning a draft into an Instance.

A task is pure: `generate(ctx, params, target_length=..., rng=..., index=...) -> Draft`. No engine,
no Ray, no I/O beyond reading the user's data files through `GenContext`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from longeval.errors import LengthError
from longeval.records import Instance, content_id
from longeval.scoring.judgement import Judge
from longeval.store.location import fingerprint
from longeval.text.corpus import essays_identity, load_essays
from longeval.text.fit import context_budget, fit_context  # noqa: F401  (their home before longeval.text.fit)
from longeval.text.haystack import EssayHaystack
from longeval.text.pieces import Piece, assemble
from longeval.text.render import Frame, PromptFormat, render_frame, render_parts
from longeval.text.tokenizer import Encoder

GENERATOR_VERSION = "1"
DECODING = "greedy"
"""How both engines decode (temperature 0, seed 0): recorded in every instance's meta."""


@dataclass(frozen=True)
class DataPaths:
    """User-supplied data for tasks that need it (RULER QA reads SQuAD and HotpotQA; LongBench v2 its file)."""

    essay_dir: str | None = None
    squad_path: str | None = None
    hotpotqa_path: str | None = None
    longbench_v2_path: str | None = None


@dataclass
class GenContext:
    """Everything a generator may use besides its parameters: the model's tokenizer and the data."""

    encoder: Encoder
    fmt: PromptFormat = field(default_factory=PromptFormat)
    data: DataPaths = field(default_factory=DataPaths)
    cache: dict[Any, Any] = field(default_factory=dict)  # per-process: encoded corpora, parsed data
    task_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # the suite's `params`

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    @property
    def data_id(self) -> str:
        """A fingerprint of the data behind the instances: the essay corpus and the QA files' bytes."""
        return self.cached(("data_id",), lambda: data_fingerprint(self.data))

    def essay_haystack(self) -> EssayHaystack:
        """The essay haystack of `suite.data.essay_dir` (`text.haystack.EssayHaystack`: the corpus's sentences
        encoded once, and which units begin one), built on first use and kept for the process."""
        corpus = load_essays(self.data.essay_dir)
        return self.cached(("essay-sentences", corpus.fingerprint), lambda: EssayHaystack.of(self.encoder, corpus))

    def frame(self, user_text: str, answer_prefix: str, *, example: tuple[str, str] = ("", "")) -> Frame:
        """The encoded frame of a user message with one `{context}` slot (`text.render.render_frame`): found as
        text, not by `str.format`, so JSON braces elsewhere in the message stay as written. `example`: a solved
        example before it (its text, then its answer), a turn of its own in RULER's templates."""
        return render_frame(self.encoder, self.fmt, user_text, answer_prefix, example=example)

    def frame_around(self, before: str, after: str, answer_prefix: str) -> Frame:
        """The frame of `before + context + after`, texts kept as written (no `{context}` slot to parse)."""
        return render_parts(self.encoder, self.fmt, before, after, answer_prefix)


def draft(frame: Frame, context: Piece, references: list[str], **fields: Any) -> Draft:
    """A Draft from the frame and the finished context."""
    prompt, ids = assemble(frame, context)
    return Draft(prompt=prompt, prompt_token_ids=ids, answer_prefix=frame.answer_prefix, references=references,
                 **fields)


@dataclass(frozen=True)
class Draft:
    """A generated prompt before the bookkeeping fields are filled in."""

    prompt: str
    prompt_token_ids: np.ndarray
    answer_prefix: str
    references: list[str]
    depth: float = -1.0
    """Where the information sits in the context, in percent (0 = start, 100 = end); -1 for none (whole
    documents). Reports bin it into the depth x length heatmaps."""
    complexity: str = ""
    context_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def data_fingerprint(data: DataPaths) -> str:
    """A hash of the data behind the instances (part of every instance id): the essay corpus and each data
    file, local or remote, so changed data gets new instance ids and a run root refuses it."""
    h = hashlib.sha256(essays_identity(data.essay_dir).fingerprint.encode())
    for path in (data.squad_path, data.hotpotqa_path, data.longbench_v2_path):
        h.update(file_fingerprint(path))
    return h.hexdigest()[:16]


file_fingerprint = fingerprint
"""A data file's identity (`longeval.store.location.fingerprint`), part of every instance id."""


class Generator(Protocol):
    """A task's generator: pure, one instance per call, from its params and the randomness it is given.

    SYNC's shared-context tasks also take `context_rng` (the same for every task of the context group).
    """

    def __call__(self, ctx: GenContext, params: Any, /, *, target_length: int, max_new_tokens: int,
                 rng: np.random.Generator, index: int, **shared: Any) -> Draft: ...


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: a family, a name from the paper, the paper's parameters, a generator, and the judge
    that scores it (bound here, so a task without one fails when it is declared, not in the score stage).

    `metric` names the judge in every instance and score row (the on-disk record of how it was scored).
    """

    family: str
    name: str
    params: Any
    generate: Generator
    metric: str
    max_new_tokens: int
    judge: Judge
    needs: tuple[str, ...] = ()  # DataPaths fields this task reads
    budget: Callable[[Any], int] | None = None
    """The output budget as a function of the params (SYNC: larger with chain-of-thought), used when the
    suite changes the params; None keeps `max_new_tokens`."""
    followup: Callable[..., Draft | None] | None = None
    """Builds a second call from the first call's output (LongBench v2's CoT answer call); instances that
    need one carry `"followup": true` in their meta (see `longeval.stages.followup`)."""
    followup_budget: int = 0
    decoding_deviation: str = ""
    """How our greedy decoding departs from the paper's, recorded in every instance's meta
    (`decoding_deviation`); "" where the paper decodes greedily too or does not say."""
    context_group: str = ""
    """Tasks that share one context per (seed, length, index), e.g. SYNC's three graph tasks: their
    generators get the same `context_rng`, and their instances the same `context_id`, so the engine can
    schedule them together and compute the shared prefix once."""
    min_length: int = 0
    """The smallest target length the task is built for: its template, output budget and the least context it
    needs (SYNC's translation domain: 4096). Tests that generate every registered task (tests/task_instances.py)
    use it, at least 2048; 0 where 2048 holds the task. Not a parameter, so it is no part of instance ids."""
    prompt_fingerprint: str = ""
    """A fingerprint of the prompt templates this task renders (versioned data): part of the generator version,
    hence of instance ids and instance cache keys, so a changed template never serves cached old prompts."""

    @property
    def key(self) -> str:
        return f"{self.family}/{self.name}"

    @property
    def generator_version(self) -> str:
        """GENERATOR_VERSION, plus the prompt fingerprint when the task declares one."""
        return f"{GENERATOR_VERSION}+{self.prompt_fingerprint}" if self.prompt_fingerprint else GENERATOR_VERSION


def instance_rng(seed: int, task_key: str, target_length: int, index: int) -> np.random.Generator:
    """Randomness derived per instance, so any sharding gives the same instances."""
    task_hash = int.from_bytes(hashlib.sha256(task_key.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, task_hash, target_length, index])


def context_rng(seed: int, group: str, target_length: int, index: int) -> np.random.Generator:
    """The randomness of a shared context: the same for every task of the group at (seed, length, index)."""
    return instance_rng(seed, f"context:{group}", target_length, index)


def make_instance(
    spec: TaskSpec,
    draft: Draft,
    ctx: GenContext,
    *,
    target_length: int,
    seed: int,
    shard_index: int,
    index: int,
) -> Instance:
    ids = np.asarray(draft.prompt_token_ids, dtype=np.int32)
    max_new = output_budget(spec, ctx.fmt, target_length)
    input_tokens = int(len(ids))
    if input_tokens + max_new > target_length:
        raise LengthError(f"{spec.key} at {target_length}: {input_tokens} input tokens exceed the budget")
    meta = dict(draft.meta)
    meta.update(params=asdict(spec.params), reasoning=ctx.fmt.reasoning, prompt_format=ctx.fmt.identity(),
                decoding=DECODING)
    if spec.decoding_deviation:
        meta["decoding_deviation"] = spec.decoding_deviation
    return Instance(
        instance_id=content_id(spec.key, asdict(spec.params), spec.generator_version, target_length, seed, index,
                               ctx.encoder.fingerprint, ctx.fmt.identity(), ctx.data_id, max_new),
        family=spec.family,
        task=spec.name,
        context_id=draft.context_id or content_id(spec.context_group or spec.key, target_length, seed, index,
                                                  ctx.encoder.fingerprint, ctx.fmt.identity(), "context"),
        target_length=target_length,
        input_tokens=input_tokens,
        depth=float(draft.depth),
        complexity=draft.complexity,
        prompt=draft.prompt,
        prompt_token_ids=ids,  # numpy until written; Arrow takes it as is
        answer_prefix=draft.answer_prefix,
        max_new_tokens=max_new,
        references=list(draft.references),
        metric=spec.metric,
        meta=json.dumps(meta, sort_keys=True),
        seed=seed,
        shard_index=shard_index,
        index=index,
        generator_version=spec.generator_version,
        tokenizer_id=ctx.encoder.fingerprint,
    )


def output_budget(spec: TaskSpec, fmt: PromptFormat, target_length: int) -> int:
    """max_new_tokens: the task's own budget (RULER's tokens_to_generate), larger for reasoning models."""
    return max(spec.max_new_tokens, reasoning_budget(target_length)) if fmt.reasoning else spec.max_new_tokens


def reasoning_budget(target_length: int) -> int:
    """Output budget for reasoning models: an eighth of the length, at least 1K (e.g. 16K at 128K)."""
    return max(1024, target_length // 8)
