"""The evaluation task on a built benchmark with the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from longeval.errors import ConfigError, DataFileError
from longeval.tasks import configure
from longeval.tasks.base import GenContext, make_instance
from longeval.tasks.tail import (
    COT_MAX_NEW_TOKENS,
    DIRECT_MAX_NEW_TOKENS,
    TAIL_SCORERS,
    TAIL_TASKS,
    Domain,
    TailParams,
    generate,
    make_manifest,
    max_new_tokens,
    write_tail_dataset,
)
from longeval.tasks.tail.task import load
from tests.tasks.tail.tail_helpers import build_dataset, domain_of, question_for

DEPTHS = (0.25, 0.5, 0.75)
SLACK = 24


@pytest.fixture(scope="module")
def domains() -> list[Domain]:
    return [domain_of("finance", 1100), domain_of("law", 1000)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, domains: list[Domain]) -> str:
    return build_dataset(tmp_path_factory.mktemp("tail") / "bench", domains, DEPTHS)


def run(ctx: GenContext, params: TailParams, index: int, length: int = 8192):
    budget = max_new_tokens(params)
    return generate(ctx, params, target_length=length, max_new_tokens=budget, rng=np.random.default_rng(0),
                    index=index)


def test_spec_and_budgets() -> None:
    (spec,) = TAIL_TASKS
    assert (spec.family, spec.name, spec.metric, spec.max_new_tokens) == ("tail", "tail", "tail_choice", 512)
    assert spec.budget(TailParams(cot=False)) == DIRECT_MAX_NEW_TOKENS == 32 and COT_MAX_NEW_TOKENS == 512
    direct = configure(spec, {"tail": {"cot": False, "dataset": "/x", "depths": [0.5]}})
    assert direct.max_new_tokens == 32 and direct.params.depths == (0.5,)
    assert set(TAIL_SCORERS) == {"tail_choice"}


@pytest.mark.parametrize("length", [8192, 16384])
def test_prompt_fills_the_length_with_the_gold_at_its_depth(ctx: GenContext, dataset: str, length: int) -> None:
    params = TailParams(dataset=dataset)
    draft = run(ctx, params, 2, length)  # finance at depth 0.5
    meta = draft.meta
    assert meta["domain"] == "finance" and meta["depth"] == 50.0 and draft.complexity == "finance"
    assert length - COT_MAX_NEW_TOKENS - SLACK <= len(draft.prompt_token_ids) <= length - COT_MAX_NEW_TOKENS
    assert abs(draft.depth - 50.0) < 0.3 and draft.depth == meta["realised_depth"]
    assert draft.references == [meta["answer"]]
    assert meta["question"] in draft.prompt and "F. finance option F" in draft.prompt
    assert "<|im_start|>user" in draft.prompt and draft.prompt.endswith("<|im_start|>assistant\n")
    gold = load(ctx, params).segments["finance"][meta["gold_segment"]]
    assert gold in draft.prompt
    assert draft.prompt.index(meta["question"]) < draft.prompt.index("Document:\n") < draft.prompt.index(gold)
    assert draft.prompt.rstrip().endswith('"Answer: X", where X is one of A, B, C, D, E or F.<|im_end|>\n'
                                          "<|im_start|>assistant")
    assert np.array_equal(ctx.encoder.encode(draft.prompt), draft.prompt_token_ids)
    assert meta["answer_prefix"] == "" and meta["cot"] is True and len(meta["options"]) == 6
    assert meta["dataset_version"] == 1 and meta["generator_model"] == "test-generator"


def test_same_question_at_every_length(ctx: GenContext, dataset: str) -> None:
    params = TailParams(dataset=dataset)
    drafts = [run(ctx, params, 4, n) for n in (8192, 16384)]
    assert drafts[0].meta["question_id"] == drafts[1].meta["question_id"]
    assert abs(drafts[0].depth - drafts[1].depth) < 0.3
    assert len(drafts[1].prompt_token_ids) > 1.9 * len(drafts[0].prompt_token_ids)


def test_instances_interleave_domains_and_never_repeat(ctx: GenContext, dataset: str) -> None:
    params = TailParams(dataset=dataset)
    seen = [(d.meta["domain"], d.meta["depth"]) for d in (run(ctx, params, i) for i in range(6))]
    assert seen == [("finance", 25.0), ("law", 25.0), ("finance", 50.0), ("law", 50.0), ("finance", 75.0),
                    ("law", 75.0)]
    with pytest.raises(ConfigError, match="has 6 questions at the chosen depths; set suite.samples to at most 6"):
        run(ctx, params, 6)


def test_depths_select_questions(ctx: GenContext, dataset: str) -> None:
    only = TailParams(dataset=dataset, depths=(0.75,))
    assert {run(ctx, only, i).meta["depth"] for i in range(2)} == {75.0}
    with pytest.raises(ConfigError, match=r"match no question.*0\.25, 0\.5, 0\.75"):
        run(ctx, TailParams(dataset=dataset, depths=(0.1,)), 0)


def test_without_cot_the_answer_is_prefilled(ctx: GenContext, dataset: str) -> None:
    params = TailParams(dataset=dataset, cot=False)
    draft = run(ctx, params, 1)
    assert draft.prompt.endswith("Answer:") and draft.meta["answer_prefix"] == "Answer:"
    assert len(draft.prompt_token_ids) <= 8192 - DIRECT_MAX_NEW_TOKENS
    right = draft.meta["answer"]
    score = TAIL_SCORERS["tail_choice"]
    assert score(f" {right}", draft.references, draft.meta).score == 1.0
    assert score(" Z", draft.references, draft.meta).error_type == "unmapped"


def test_make_instance_accepts_the_draft(ctx: GenContext, dataset: str) -> None:
    spec = replace(TAIL_TASKS[0], params=TailParams(dataset=dataset))
    draft = run(ctx, spec.params, 3)
    instance = make_instance(spec, draft, ctx, target_length=8192, seed=1, shard_index=0, index=3)
    assert instance.input_tokens + instance.max_new_tokens <= 8192 and instance.complexity == "law"
    assert json.loads(instance.meta)["question_id"] == draft.meta["question_id"] and instance.metric == "tail_choice"


def test_a_literal_context_marker_in_a_question(ctx: GenContext, tmp_path: Path, domains: list[Domain]) -> None:
    q = question_for(domains[0], 5, 0.5)
    q = replace(q, question="What does {context} mean in the $DOCUMENT$ template?", question_id="odd")
    write_tail_dataset(str(tmp_path / "odd"), [q], {"finance": domains[0].segments},
                       make_manifest(generator_model="g", seed=0))
    draft = run(ctx, TailParams(dataset=str(tmp_path / "odd"), depths=(0.5,)), 0)
    assert "What does {context} mean in the $DOCUMENT$ template?" in draft.prompt
    assert np.array_equal(ctx.encoder.encode(draft.prompt), draft.prompt_token_ids)


def test_unset_dataset_names_the_setting(ctx: GenContext) -> None:
    with pytest.raises(DataFileError, match=r"suite\.params\.tail\.dataset is not set"):
        run(ctx, TailParams(), 0)


def test_the_judge_sees_only_what_the_parser_cannot_map(ctx: GenContext, dataset: str) -> None:
    from longeval.tasks.tail import judge_draft, score_tail

    params = TailParams(dataset=dataset, depths=DEPTHS, judge=True)
    first = run(ctx, params, 0)
    assert first.meta["followup"] is True
    meta = dict(first.meta)
    gold = meta["answer"]
    assert judge_draft(ctx, params, meta, f"Thinking...\nAnswer: {gold}", target_length=8192, max_new_tokens=8) is None
    rambling = "I am not sure; it could be several of these, maybe the second or the last."
    second = judge_draft(ctx, params, meta, rambling, target_length=8192, max_new_tokens=8)
    assert second is not None
    assert second.meta["mapped_by"] == "judge" and second.meta["judged_output"] == rambling
    assert rambling in second.prompt and meta["question"] in second.prompt
    assert second.prompt.rstrip().endswith("Answer:") and second.references == [gold]
    assert second.meta["depth"] == meta["depth"]  # the judged answer counts in its question's cell
    # the judge's reply is scored by the same deterministic parser, after its "Answer:" prefix
    assert score_tail(f" {gold}", [gold], second.meta).score == 1.0
    assert score_tail(" X", [gold], second.meta).error_type == "unmapped"
    without = TailParams(dataset=dataset, depths=DEPTHS)
    assert run(ctx, without, 0).meta["followup"] is False
