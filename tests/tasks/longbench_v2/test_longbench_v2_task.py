"""Generation: the reference prompt, middle truncation in tokens within an exact budget, and the two CoT calls."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from longeval.errors import DataFileError, LengthError
from longeval.tasks.base import instance_rng, make_instance, output_budget
from longeval.tasks.longbench_v2 import (
    COT_ANSWER_MAX_NEW_TOKENS,
    COT_MAX_NEW_TOKENS,
    LONGBENCH_V2_SCORERS,
    LONGBENCH_V2_TASKS,
    ZERO_SHOT_MAX_NEW_TOKENS,
    LongBenchV2Params,
    cot_answer_draft,
    generate,
    middle_truncate,
    prompt_fingerprint,
    prompts,
)
from longeval.tasks.longbench_v2.task import SNAP_TOKENS
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder
from tests.tasks.longbench_v2.lb2_helpers import context_for, make_item, reference_fill, write_json

LONG_CONTEXT = " ".join(f"Sentence {k} of the long report says the value is {k * 7}." for k in range(600))
TRUNCATE_AT = 2048


def chat(encoder: Encoder, user: str) -> str:
    return encoder.tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                 add_generation_prompt=True)


def choices_of(item: dict) -> list[str]:
    return [item[f"choice_{x}"] for x in "ABCD"]


@pytest.fixture
def items() -> list[dict]:
    return [
        make_item(0, context="  A short report.\nIt has two lines.  ", question="  What does it have? "),
        make_item(1, context=LONG_CONTEXT),
        make_item(2, question="What does {context} mean in `f'{context}'`?", choice_B="the $DOC$ marker"),
        make_item(3, context="\u4e16\u754c\u548c\u5e73 " * 3000),  # multi-byte characters, several tokens each
    ]


@pytest.fixture
def data_path(tmp_path: Path, items: list[dict]) -> str:
    return write_json(tmp_path / "data.json", items)


def run(encoder: Encoder, path: str, index: int, *, cot: bool = False, length: int = 8192,
        fmt: PromptFormat | None = None):
    params = LongBenchV2Params(cot=cot)
    budget = COT_MAX_NEW_TOKENS if cot else ZERO_SHOT_MAX_NEW_TOKENS
    return generate(context_for(encoder, path, fmt=fmt), params, target_length=length, max_new_tokens=budget,
                    rng=np.random.default_rng(0), index=index)


def test_untruncated_prompt_is_the_reference_prompt(encoder: Encoder, data_path: str, items: list[dict]) -> None:
    item = items[0]
    draft = run(encoder, data_path, 0)
    expected = reference_fill(prompts.ZERO_SHOT, item["context"], item["question"], choices_of(item))
    assert draft.prompt == chat(encoder, expected)
    assert np.array_equal(draft.prompt_token_ids, encoder.encode(draft.prompt))  # the tokenizer's own ids
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt
    assert draft.references == ["A"] and draft.answer_prefix == "" and draft.complexity == "easy/short"
    assert draft.meta["truncated_tokens"] == 0
    assert draft.meta["context_tokens"] == len(encoder.encode(item["context"].strip()))
    assert {k: draft.meta[k] for k in ("_id", "domain", "sub_domain", "difficulty", "length", "answer", "cot",
                                       "call")} == {
        "_id": "66f00000", "domain": "Single-Document QA", "sub_domain": "Academic", "difficulty": "easy",
        "length": "short", "answer": "A", "cot": False, "call": "zero_shot"}
    assert draft.meta["prompt_fingerprint"] == prompt_fingerprint()
    json.dumps(draft.meta)  # the pipeline stores meta as JSON


def test_without_a_chat_template_the_prompt_is_the_plain_reference_text(
    encoder: Encoder, data_path: str, items: list[dict]
) -> None:
    item = items[0]
    draft = run(encoder, data_path, 0, fmt=PromptFormat(chat_template=False))
    assert draft.prompt == reference_fill(prompts.ZERO_SHOT, item["context"], item["question"], choices_of(item))
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt


def test_truncation_keeps_head_and_tail_halves_and_fills_the_budget_exactly(
    encoder: Encoder, data_path: str, items: list[dict]
) -> None:
    item = items[1]
    draft = run(encoder, data_path, 1, length=TRUNCATE_AT)
    ids = draft.prompt_token_ids
    assert len(ids) + ZERO_SHOT_MAX_NEW_TOKENS == TRUNCATE_AT  # ASCII text: no cut needs to move
    original = encoder.encode(LONG_CONTEXT)
    meta = draft.meta
    assert meta["context_tokens"] == len(original)
    kept = meta["context_tokens"] - meta["truncated_tokens"]
    assert meta["truncated_tokens"] > 0
    # The context ids sit between the frame's head and tail: first half and last half of the budget.
    empty = run(encoder, write_json(Path(data_path).with_name("empty.json"), [{**item, "context": ""}]), 0)
    overhead = len(empty.prompt_token_ids)
    assert kept == len(ids) - overhead
    head_len = len(encoder.encode(empty.prompt.split("<text>\n")[0] + "<text>\n"))
    context_ids = ids[head_len : head_len + kept]
    half = kept // 2
    assert np.array_equal(context_ids[:half], original[:half])
    assert np.array_equal(context_ids[half:], original[len(original) - (kept - half) :])
    # The question and the four choices are whole; the document is cut in its middle only.
    tail = ("What is the correct answer to this question: " + item["question"] + "\nChoices:\n"
            + "".join(f"({x}) {c}\n" for x, c in zip("ABCD", choices_of(item), strict=True)))
    assert tail in draft.prompt
    assert "<text>\nSentence 0 of the long report" in draft.prompt
    assert "Sentence 599 of the long report says the value is 4193.\n</text>" in draft.prompt
    assert "Sentence 300 of" not in draft.prompt
    assert encoder.decode(ids) == draft.prompt


def test_cuts_move_to_character_boundaries(encoder: Encoder) -> None:
    text = "\u4e16\u754c\u548c\u5e73 " * 400
    original = encoder.encode(text)
    naive_splits = 0
    for budget in range(200, 260):
        cut = middle_truncate(encoder, text, budget)
        half = budget // 2
        naive = encoder.decode(original[:half]) + encoder.decode(original[len(original) - (budget - half) :])
        naive_splits += "\ufffd" in naive
        assert "\ufffd" not in cut.piece.text
        assert encoder.decode(cut.piece.ids) == cut.piece.text
        assert budget - 2 * SNAP_TOKENS <= len(cut.piece) <= budget
        assert cut.original_tokens == len(original) and cut.dropped == len(original) - len(cut.piece)
    assert naive_splits > 0  # the range does exercise cuts inside a character


def test_multibyte_document_within_budget(encoder: Encoder, data_path: str) -> None:
    draft = run(encoder, data_path, 3, length=TRUNCATE_AT)
    assert TRUNCATE_AT - 2 * SNAP_TOKENS <= len(draft.prompt_token_ids) + ZERO_SHOT_MAX_NEW_TOKENS <= TRUNCATE_AT
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt and "\ufffd" not in draft.prompt


def test_literal_markers_in_an_item_are_shown_as_written(encoder: Encoder, data_path: str, items: list[dict]) -> None:
    draft = run(encoder, data_path, 2)
    assert "question: What does {context} mean in `f'{context}'`?\n" in draft.prompt
    assert "(B) the $DOC$ marker\n" in draft.prompt
    item = items[2]
    assert draft.prompt == chat(encoder, reference_fill(prompts.ZERO_SHOT, item["context"], item["question"],
                                                        choices_of(item)))
    assert np.array_equal(draft.prompt_token_ids, encoder.encode(draft.prompt))


def test_too_small_a_length_is_a_length_error(encoder: Encoder, data_path: str) -> None:
    with pytest.raises(LengthError, match="target length 150 cannot hold the prompt template"):
        run(encoder, data_path, 1, length=150)


def test_cot_first_call(encoder: Encoder, data_path: str, items: list[dict]) -> None:
    draft = run(encoder, data_path, 1, cot=True, length=TRUNCATE_AT)
    assert len(draft.prompt_token_ids) + COT_MAX_NEW_TOKENS == TRUNCATE_AT
    assert draft.meta["cot"] is True and draft.meta["call"] == "cot"
    assert draft.prompt.startswith(chat(encoder, "Please read the following text and answer the questions below."
                                                 "\n\n<text>\nSentence 0").split("<|im_end|>")[0])
    assert draft.prompt.endswith("(D) fourth option 1\n\nLet\u2019s think step by step:<|im_end|>\n"
                                 "<|im_start|>assistant\n")
    item = items[0]
    short = run(encoder, data_path, 0, cot=True)
    assert short.prompt == chat(encoder, reference_fill(prompts.COT, item["context"], item["question"],
                                                        choices_of(item)))


def answer_call(encoder: Encoder, path: str, meta: dict, cot: str, *, length: int = 8192):
    return cot_answer_draft(context_for(encoder, path), LongBenchV2Params(cot=True), meta, cot,
                            target_length=length, max_new_tokens=COT_ANSWER_MAX_NEW_TOKENS)


def test_cot_answer_call_quotes_the_chain_of_thought(encoder: Encoder, data_path: str, items: list[dict]) -> None:
    first = run(encoder, data_path, 1, cot=True, length=TRUNCATE_AT)
    thought = "  The report lists values in order.\nSo the second option fits.  "
    draft = answer_call(encoder, data_path, first.meta, thought)
    item = items[1]
    expected = reference_fill(prompts.COT_ANSWER, "", item["question"], choices_of(item), thought.strip())
    assert draft.prompt == chat(encoder, expected)
    assert "The text is too long and omitted here." in draft.prompt and "Sentence 0" not in draft.prompt
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt
    assert np.array_equal(draft.prompt_token_ids, encoder.encode(draft.prompt))
    assert draft.references == ["B"] and draft.complexity == "hard/medium"
    meta = draft.meta
    assert meta["call"] == "cot_answer" and meta["cot_truncated_tokens"] == 0
    assert meta["cot_tokens"] == len(encoder.encode(" " + thought.strip()))
    assert meta["truncated_tokens"] == first.meta["truncated_tokens"]  # the first call's record is kept
    assert meta["_id"] == "66f00001" and meta["answer"] == "B"


@pytest.mark.parametrize("thought", ["", "   ", None])
def test_an_empty_or_failed_chain_of_thought_still_gets_its_call(
    encoder: Encoder, data_path: str, thought: str | None
) -> None:
    first = run(encoder, data_path, 0, cot=True)
    draft = answer_call(encoder, data_path, first.meta, thought)
    assert "Let\u2019s think step by step: \n\nBased on the above" in draft.prompt
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt


def test_a_chain_of_thought_with_markers_is_quoted_verbatim(encoder: Encoder, data_path: str) -> None:
    first = run(encoder, data_path, 0, cot=True)
    thought = "Reading {context} and $Q$ and $COT$ literally."
    draft = answer_call(encoder, data_path, first.meta, thought)
    assert f"step by step: {thought}\n\nBased" in draft.prompt
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt


def test_a_chain_of_thought_too_long_for_the_length_is_cut_in_its_middle(encoder: Encoder, data_path: str) -> None:
    first = run(encoder, data_path, 0, cot=True)
    thought = " ".join(f"Step {k}: check fact {k}." for k in range(400))
    draft = answer_call(encoder, data_path, first.meta, thought, length=1024)
    assert len(draft.prompt_token_ids) + COT_ANSWER_MAX_NEW_TOKENS == 1024
    assert draft.meta["cot_truncated_tokens"] > 0
    assert "step by step: Step 0: check fact 0." in draft.prompt and "check fact 399.\n\nBased" in draft.prompt
    assert encoder.decode(draft.prompt_token_ids) == draft.prompt


def test_answer_call_without_question_in_meta_reads_the_data(encoder: Encoder, data_path: str) -> None:
    first = run(encoder, data_path, 2, cot=True)
    meta = {k: v for k, v in first.meta.items() if k not in ("question", "choices")}
    draft = answer_call(encoder, data_path, meta, "Because.")
    assert draft.prompt == answer_call(encoder, data_path, first.meta, "Because.").prompt
    with pytest.raises(DataFileError, match="_id 'unknown' is not in"):
        answer_call(encoder, data_path, {**meta, "_id": "unknown"}, "Because.")


def test_the_registered_spec_runs_like_the_pipeline(encoder: Encoder, data_path: str) -> None:
    (spec,) = LONGBENCH_V2_TASKS
    assert (spec.key, spec.metric, spec.max_new_tokens, spec.needs) == (
        "longbench_v2/longbench_v2", "longbench_v2_choice", 128, ("longbench_v2_path",))
    assert spec.metric in LONGBENCH_V2_SCORERS
    for cot, budget in ((False, 128), (True, 1024)):
        params = dataclasses.replace(spec.params, cot=cot)
        assert spec.budget(params) == budget
        task = dataclasses.replace(spec, params=params, max_new_tokens=spec.budget(params))
        ctx = context_for(encoder, data_path)
        draft = task.generate(ctx, task.params, target_length=TRUNCATE_AT,
                              max_new_tokens=output_budget(task, ctx.fmt, TRUNCATE_AT),
                              rng=instance_rng(1, task.key, TRUNCATE_AT, 1), index=1)
        instance = make_instance(task, draft, ctx, target_length=TRUNCATE_AT, seed=1, shard_index=0, index=1)
        assert instance.input_tokens + instance.max_new_tokens == TRUNCATE_AT
        assert instance.max_new_tokens == budget and instance.complexity == "hard/medium"
        assert json.loads(instance.meta)["truncated_tokens"] > 0


def test_generation_is_deterministic(encoder: Encoder, data_path: str) -> None:
    a, b = run(encoder, data_path, 3, length=TRUNCATE_AT), run(encoder, data_path, 3, length=TRUNCATE_AT)
    assert a.prompt == b.prompt and np.array_equal(a.prompt_token_ids, b.prompt_token_ids) and a.meta == b.meta


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_tiny_budgets(encoder: Encoder, budget: int) -> None:
    text = "one two three four five six seven"
    original = encoder.encode(text)
    cut = middle_truncate(encoder, text, budget)
    assert len(cut.piece) == budget and cut.dropped == len(original) - budget
    assert np.array_equal(cut.piece.ids, np.concatenate([original[: budget // 2],
                                                         original[len(original) - (budget - budget // 2) :]]))
    whole = middle_truncate(encoder, text, len(original))
    assert whole.dropped == 0 and whole.piece.text == text
