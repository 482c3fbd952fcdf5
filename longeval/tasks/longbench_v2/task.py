"""LongBench v2 generation (Bai et al., 2025, §4 and Appendix D): one prompt per released item.

Unlike the synthetic families, nothing here is random: instance `index` is the `index`-th item of the data
file that passes the filters, and the target length plays the part of the model's context limit. A
document longer than the budget is cut from the middle in tokens, as the paper does (the first half and
the last half of the budget are kept), but only the document is cut: the instructions, the question and the
four choices are always whole, and `input_tokens + max_new_tokens <= target_length` holds for the exact ids
the engine receives.

Zero-shot + CoT takes two calls. `generate` with `cot=True` builds the first (the model writes its chain of
thought in up to 1024 tokens); `cot_answer_draft` builds the second from the first instance's meta and the
model's output (the chain of thought in place of the document, 128 tokens to answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from longeval.errors import ConfigError, DataFileError
from longeval.tasks.base import Draft, GenContext, context_budget, draft
from longeval.tasks.longbench_v2 import prompts
from longeval.tasks.longbench_v2.data import LongBenchV2Data, LongBenchV2Item, load_longbench_v2, select
from longeval.text.pieces import Piece
from longeval.text.render import Frame
from longeval.text.tokenizer import Encoder

ZERO_SHOT_MAX_NEW_TOKENS = 128
"""Appendix D.2: zero-shot answers get 128 tokens."""
COT_MAX_NEW_TOKENS = 1024
"""Appendix D.2: the chain of thought gets 1024 tokens."""
COT_ANSWER_MAX_NEW_TOKENS = 128
"""Appendix D.2: the answer after the chain of thought gets 128 tokens."""

SNAP_TOKENS = 8
"""How far a cut may move to land between characters: a UTF-8 character spans at most four byte tokens."""


@dataclass(frozen=True)
class LongBenchV2Params:
    """Which items, and which of the paper's two settings."""

    cot: bool = False
    """Zero-shot + CoT (two calls) instead of zero-shot."""
    domains: tuple[str, ...] = ()
    """Keep only these domains (e.g. "Single-Document QA"); empty keeps all six."""
    difficulties: tuple[str, ...] = ()
    """Keep only easy and/or hard items; empty keeps both."""
    lengths: tuple[str, ...] = ()
    """Keep only these word-length buckets (short < 32k, medium 32k–128k, long > 128k); empty keeps all."""
    data_key: str = "longbench_v2_path"
    """The `suite.data` field that holds the data file's path."""


def max_new_tokens(params: LongBenchV2Params) -> int:
    """The first call's output budget: 1024 with chain-of-thought, 128 without."""
    return COT_MAX_NEW_TOKENS if params.cot else ZERO_SHOT_MAX_NEW_TOKENS


@dataclass(frozen=True)
class Truncated:
    """A middle-truncated text: what is kept (text and ids), and how long the whole was."""

    piece: Piece
    original_tokens: int

    @property
    def dropped(self) -> int:
        return self.original_tokens - len(self.piece)


def middle_truncate(encoder: Encoder, text: str, budget: int) -> Truncated:
    """Encode `text` once; if it is over `budget` tokens, keep its first `budget // 2` tokens and its last
    `budget - budget // 2`, joined in token space (the paper's `ids[:half] + ids[-half:]`).

    Kept ids are the text's own ids, never re-tokenized, so the count is exact. A cut that would split a
    character's bytes moves inward to the nearest character boundary (at most a few tokens, only for
    non-ASCII text), so the kept text is exactly what the kept ids decode to.
    """
    ids = encoder.encode_many([text], cache=False)[0]  # one-off: a document must not fill the encoder's cache
    n = int(len(ids))
    if n <= budget:
        return Truncated(Piece(text, ids), n)
    head, head_text = _clean_cut(encoder, text, ids, max(budget // 2, 0), from_end=False)
    tail, tail_text = _clean_cut(encoder, text, ids, max(budget - budget // 2, 0), from_end=True)
    kept = np.concatenate([ids[:head], ids[n - tail :]]).astype(np.int32)
    return Truncated(Piece(head_text + tail_text, kept), n)


def _clean_cut(encoder: Encoder, text: str, ids: np.ndarray, count: int, *, from_end: bool) -> tuple[int, str]:
    """The largest k <= count (within SNAP_TOKENS) whose first (or last) k ids decode to a prefix (or suffix)."""
    n = len(ids)
    for k in range(count, max(count - SNAP_TOKENS, 0) - 1, -1):
        part = encoder.decode(ids[n - k :] if from_end else ids[:k])
        if (text.endswith(part) if from_end else text.startswith(part)):
            return k, part
    # A tokenizer whose decode is not the inverse of encode (e.g. it drops a leading space): the ids are
    # what counts, the text is then a close rendering of them.
    return count, encoder.decode(ids[n - count :] if from_end else ids[:count])


def load(ctx: GenContext, params: LongBenchV2Params) -> LongBenchV2Data:
    """The parsed data file, read once per process."""
    path = getattr(ctx.data, params.data_key, None)
    key = f"suite.data.{params.data_key}"
    return ctx.cached(("longbench_v2", path), lambda: load_longbench_v2(path, key=key))


def selected(ctx: GenContext, params: LongBenchV2Params) -> tuple[LongBenchV2Item, ...]:
    """The items that pass the params' filters, in file order (cached per process)."""
    data = load(ctx, params)
    return ctx.cached(
        ("longbench_v2-select", data.path, tuple(params.domains), tuple(params.difficulties), tuple(params.lengths)),
        lambda: select(data, domains=params.domains, difficulties=params.difficulties, lengths=params.lengths),
    )


def item_at(ctx: GenContext, params: LongBenchV2Params, index: int) -> LongBenchV2Item:
    """The `index`-th selected item; asking beyond the selection is a config mistake (too many samples)."""
    items = selected(ctx, params)
    if not 0 <= index < len(items):
        data = load(ctx, params)
        raise ConfigError(
            f"longbench_v2: instance {index} was asked for, but only {len(items)} of the {len(data.items)} items "
            f"in {data.path!r} pass the filters (domains={list(params.domains)}, "
            f"difficulties={list(params.difficulties)}, lengths={list(params.lengths)}); "
            f"set suite.samples to at most {len(items)} or widen suite.params.longbench_v2"
        )
    return items[index]


def slot_values(question: str, choices: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The question and choices as the reference fills them: stripped of surrounding whitespace."""
    values = {"$Q$": question.strip()}
    values.update({f"$C_{letter}$": str(choice).strip() for letter, choice in zip("ABCD", choices, strict=True)})
    return values


def render(ctx: GenContext, before: str, after: str) -> Frame:
    """The frame `before + {context} + after`; an item's own text may hold a literal "{context}".

    The reference prefills nothing: the model writes "The correct answer is (X)" itself.
    """
    return ctx.frame_around(before, after, "")


def generate(
    ctx: GenContext, params: LongBenchV2Params, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    """The prompt of item `index` (zero-shot, or the first CoT call), its document cut to fit.

    `rng` is unused: items come in file order and the cut is deterministic.
    """
    item = item_at(ctx, params, index)
    template = prompts.COT if params.cot else prompts.ZERO_SHOT
    before, after = prompts.split_at(template, prompts.DOC, slot_values(item.question, item.choices))
    frame = render(ctx, before, after)
    budget = context_budget(frame, target_length, max_new_tokens)
    cut = middle_truncate(ctx.encoder, frame.context_lead + item.context.strip(), budget)
    meta = {
        "_id": item.item_id,
        "domain": item.domain,
        "sub_domain": item.sub_domain,
        "difficulty": item.difficulty,
        "length": item.length,
        "answer": item.answer,
        "question": item.question,
        "choices": list(item.choices),
        "cot": params.cot,
        "call": "cot" if params.cot else "zero_shot",
        "followup": params.cot,  # the CoT call is answered by a second call (the pipeline's `followup`)
        "context_tokens": cut.original_tokens,
        "truncated_tokens": cut.dropped,
        "answer_prefix": frame.answer_prefix,
        "prompt_fingerprint": prompts.fingerprint(),
    }
    return draft(frame, cut.piece, [item.answer], complexity=f"{item.difficulty}/{item.length}", meta=meta)


def cot_answer_draft(
    ctx: GenContext, params: LongBenchV2Params, first_instance_meta: dict[str, Any], cot_output: str, *,
    target_length: int, max_new_tokens: int,
) -> Draft:
    """The second CoT call: the question, the choices and the model's chain of thought, asking for one letter.

    As in the paper the document is not repeated ("The text is too long and omitted here."). The chain of
    thought is stripped as the reference strips it; an empty one is quoted as empty, never dropped. It is
    middle-truncated like a document in the rare case that it does not fit (`cot_truncated_tokens`).
    """
    meta = dict(first_instance_meta)
    question, choices = meta.get("question"), meta.get("choices")
    if not isinstance(question, str) or not isinstance(choices, list | tuple) or len(choices) != 4:
        item = load(ctx, params).by_id(str(meta.get("_id")))
        if item is None:
            raise DataFileError(
                f"LongBench v2: the first call's meta has no question and _id {meta.get('_id')!r} is not in "
                f"{load(ctx, params).path!r}; use the same data file for both calls"
            )
        question, choices = item.question, list(item.choices)
    before, after = prompts.split_at(prompts.COT_ANSWER, prompts.COT_SLOT, slot_values(question, choices))
    frame = render(ctx, before, after)
    budget = context_budget(frame, target_length, max_new_tokens)
    cot = cot_output.strip() if isinstance(cot_output, str) else ""  # a failed first call gives no text
    cut = middle_truncate(ctx.encoder, frame.context_lead + cot, budget)
    meta.update(call="cot_answer", cot=True, cot_tokens=cut.original_tokens, cot_truncated_tokens=cut.dropped,
                answer_prefix=frame.answer_prefix, prompt_fingerprint=prompts.fingerprint())
    answer = str(meta.get("answer", ""))
    complexity = f"{meta.get('difficulty', '')}/{meta.get('length', '')}"
    return draft(frame, cut.piece, [answer], complexity=complexity, meta=meta)
