"""Every Michelangelo task at exact token lengths from 1K to 1M, deterministic, and what the pipeline
needs from a draft (ids that are the prompt's tokenization, JSON meta, the registry entries)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np
import pytest

from longeval.errors import LengthError
from longeval.tasks.base import Draft, GenContext, make_instance
from longeval.tasks.michelangelo import MICHELANGELO_SCORERS, MICHELANGELO_TASKS
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder
from tests.tasks.michelangelo.mich_helpers import SEED, SPECS, make

SMALLEST = {"latent_list": 1024, "mrcr": 4096, "idk": 1024}
CASES = [pytest.param(name, length, id=f"{name}-{length}") for name in SPECS for length in (1024, 4096, 32768)
         if length >= SMALLEST[name]]


def _check_length(d: Draft, name: str, length: int) -> None:
    used = len(d.prompt_token_ids) + SPECS[name].max_new_tokens
    assert used <= length
    assert used >= 0.99 * length, (used, length)


@pytest.mark.parametrize(("name", "length"), CASES)
def test_exact_length(name: str, length: int, drafts: Callable[[str, int, int], list[Draft]]) -> None:
    for d in drafts(name, length, 3):
        _check_length(d, name, length)


@pytest.mark.parametrize("name", list(SPECS))
def test_one_million_tokens_fast(name: str, ctx: GenContext) -> None:
    make(ctx, SPECS[name], 1_048_576, 0)  # warm the per-process pools
    started = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    d = make(ctx, SPECS[name], 1_048_576, 1)
    elapsed = time.process_time() - started
    _check_length(d, name, 1_048_576)
    assert elapsed < 5.0, elapsed  # ~0.02 s measured
    assert len(d.prompt) > 2_000_000


def test_mrcr_below_its_smallest_length_names_the_setting(ctx: GenContext) -> None:
    with pytest.raises(LengthError, match="suite.lengths"):
        make(ctx, SPECS["mrcr"], 1024, 0)


@pytest.mark.parametrize(("name", "length"), [("latent_list", 400), ("mrcr", 2048), ("idk", 160)])
def test_too_short_for_the_template(name: str, length: int, ctx: GenContext) -> None:
    with pytest.raises(LengthError, match="suite.lengths"):
        make(ctx, SPECS[name], length, 0)


@pytest.mark.parametrize(("name", "length"), [pytest.param(n, 4096, id=n) for n in SPECS])
def test_ids_are_the_tokenization_of_the_prompt(name: str, length: int, encoder: Encoder,
                                                drafts: Callable[[str, int, int], list[Draft]]) -> None:
    for d in drafts(name, length, 3):
        assert list(d.prompt_token_ids) == encoder.tokenizer.encode(d.prompt, add_special_tokens=False)


@pytest.mark.parametrize("fmt", [PromptFormat(chat_template=False), PromptFormat(answer_prefix=False),
                                 PromptFormat(reasoning=True)], ids=["plain", "no-prefix", "reasoning"])
def test_other_prompt_formats(fmt: PromptFormat, encoder: Encoder) -> None:
    fresh = GenContext(encoder=encoder, fmt=fmt)
    for name, spec in SPECS.items():
        d = make(fresh, spec, 8192, 1)
        _check_length(d, name, 8192)
        assert list(d.prompt_token_ids) == encoder.tokenizer.encode(d.prompt, add_special_tokens=False)
        if name == "mrcr":  # the chat layout (the default) has no cue: the assistant's turn is the cue
            assert d.meta["layout"] == "chat" and not d.prompt.endswith("Model:")
            continue
        cue = {"latent_list": "Output:", "idk": "Answer:"}[name]
        assert d.prompt.endswith(cue) == (fmt.answer_prefix and not fmt.reasoning)


@pytest.mark.parametrize("name", list(SPECS))
def test_same_seed_and_index_give_the_same_draft(name: str, encoder: Encoder, ctx: GenContext,
                                                 drafts: Callable[[str, int, int], list[Draft]]) -> None:
    fresh = GenContext(encoder=encoder, fmt=PromptFormat())  # empty per-process caches
    first = drafts(name, 4096, 3)[2]
    again = make(fresh, SPECS[name], 4096, 2)
    assert again.prompt == first.prompt
    assert list(again.prompt_token_ids) == list(first.prompt_token_ids)
    assert again.references == first.references and again.meta == first.meta and again.depth == first.depth
    other_seed = make(ctx, SPECS[name], 4096, 2, seed=SEED + 1)
    assert other_seed.prompt != first.prompt
    assert len({d.prompt for d in drafts(name, 4096, 3)}) == 3


@pytest.mark.parametrize("name", list(SPECS))
def test_make_instance_accepts_the_draft(name: str, ctx: GenContext,
                                         drafts: Callable[[str, int, int], list[Draft]]) -> None:
    spec = SPECS[name]
    d = drafts(name, 4096, 1)[0]
    inst = make_instance(spec, d, ctx, target_length=4096, seed=SEED, shard_index=0, index=0)
    meta = json.loads(inst.meta)
    assert meta["prompt_fingerprint"] == d.meta["prompt_fingerprint"]
    assert inst.metric == f"michelangelo_{name}"
    perfect = f"{meta['random_string']}{meta['answer_joiner']}{d.references[0]}" if name == "mrcr" else d.references[0]
    assert MICHELANGELO_SCORERS[inst.metric](perfect, inst.references, meta).score == 1.0


def test_registry_entries() -> None:
    assert [(s.family, s.name, s.metric) for s in MICHELANGELO_TASKS] == [
        ("michelangelo", "latent_list", "michelangelo_latent_list"),
        ("michelangelo", "mrcr", "michelangelo_mrcr"),
        ("michelangelo", "idk", "michelangelo_idk"),
    ]
    assert {s.name: s.max_new_tokens for s in MICHELANGELO_TASKS} == {"latent_list": 128, "mrcr": 512, "idk": 128}
    assert set(MICHELANGELO_SCORERS) == {s.metric for s in MICHELANGELO_TASKS}
    assert [s.params.needles for s in MICHELANGELO_TASKS if s.name == "mrcr"] == [(2, 4, 8)]


@pytest.mark.parametrize("name", list(SPECS))
def test_a_shared_context_rng_draws_the_filler(name: str, ctx: GenContext) -> None:
    """With `context_rng` (tasks of a context group) the filler comes from it, the rest from `rng`."""
    spec = SPECS[name]

    def run(context_seed: int | None) -> Draft:
        shared = {} if context_seed is None else {"context_rng": np.random.default_rng(context_seed)}
        return spec.generate(ctx, spec.params, target_length=8192, max_new_tokens=spec.max_new_tokens,
                             rng=np.random.default_rng(1), index=1, **shared)

    assert run(5).prompt == run(5).prompt
    assert run(5).prompt != run(6).prompt != run(None).prompt
    assert run(5).references == run(6).references == run(None).references
