"""RULER §3.1, Retrieval: needle-in-a-haystack (NIAH) and its eight variants.

A needle is a key-value sentence, `One of the special magic {numbers|uuids|words} for {key} is: {value}.`,
inserted into a haystack (repeated noise sentences, essays, or other needles acting as distractors) at
one of 40 depths evenly spaced over 0-100 %. Keys are adjective-noun pairs, numbers have 7 digits,
UUIDs 32 hex digits. Multi-key adds distractor needles, multi-value puts several values under one key
and multi-query asks for several keys at once; every queried value must be returned.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np

from longeval.tasks.base import Draft, GenContext, context_budget, fit_context
from longeval.tasks.ruler.templates import fill
from longeval.text import words
from longeval.text.corpus import load_essays, noise_sentences
from longeval.text.pieces import Piece, UnitStream, close_gap, concat, piece
from longeval.text.render import Frame

DEPTHS = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)))
"""RULER's 40 insertion depths (percent)."""

Kind = Literal["words", "numbers", "uuids"]


@dataclass(frozen=True)
class NiahParams:
    """One NIAH variant (RULER Table 2 and its released configuration)."""

    haystack: Literal["noise", "essay", "needle"] = "essay"
    type_key: Kind = "words"
    type_value: Kind = "numbers"
    num_needle_k: int = 1
    """Needles with distinct keys; those not queried are distractors (MK-NIAH)."""
    num_needle_v: int = 1
    """Values stored under each key, all to be returned (MV-NIAH)."""
    num_needle_q: int = 1
    """Keys asked for at once (MQ-NIAH)."""


def _draw(kind: Kind, rng: np.random.Generator) -> str:
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4))
    adjectives, nouns = words.adjectives(), words.nouns()
    return f"{adjectives[rng.integers(len(adjectives))]}-{nouns[rng.integers(len(nouns))]}"


def _draw_unique(kind: Kind, rng: np.random.Generator, n: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        item = _draw(kind, rng)
        if item not in taken:
            taken.add(item)
            out.append(item)
    return out


def needle_text(params: NiahParams, key: str, value: str) -> str:
    return f" One of the special magic {params.type_value} for {key} is: {value}."


def _haystack_stream(ctx: GenContext, params: NiahParams) -> UnitStream:
    if params.haystack == "noise":
        return ctx.cached(("noise",), lambda: UnitStream(ctx.encoder, noise_sentences()))
    corpus = load_essays(ctx.data.essay_dir)
    return ctx.cached(("essay", corpus.fingerprint), lambda: UnitStream(ctx.encoder, corpus.sentences))


def _insert(stream: UnitStream, budget: int, needles: list[tuple[float, Piece]]) -> Piece:
    """Fill `budget` tokens with haystack and put each needle at the unit boundary nearest its depth."""
    n, tail = stream.fill(budget)
    parts: list[Piece] = []
    start = 0
    for depth, needle in sorted(needles, key=lambda item: item[0]):
        at = int(n * depth / 100)
        parts.append(stream.slice(start, at))
        parts.append(needle)
        start = at
    parts.append(stream.slice(start, n))
    parts.append(tail)
    return concat(parts)


def _needle_haystack(
    ctx: GenContext, params: NiahParams, budget: int, needles: list[tuple[float, Piece]],
    rng: np.random.Generator, taken: set[str],
) -> Piece:
    """A haystack made of distractor needles, sized to the budget by choosing needles of the right lengths."""
    texts: list[str] = []
    ids: list[list[int]] = []
    want = int(budget / max(1.0, float(np.mean([len(p) for _, p in needles])))) + 64
    while sum(len(i) for i in ids) < budget + 64 * 8:  # enough candidates, and spares for swapping
        keys = _draw_unique(params.type_key, rng, want, taken)
        batch = [needle_text(params, k, _draw(params.type_value, rng)) for k in keys]
        texts += batch
        ids += ctx.encoder.tokenizer(batch, add_special_tokens=False)["input_ids"]
        want = 64 + want // 8
    lengths = np.array([len(i) for i in ids])
    chosen = _choose_lengths(lengths, budget)
    distractors = [Piece(texts[i], np.asarray(ids[i], dtype=np.int32)) for i in chosen]
    units = len(distractors)
    parts: list[Piece] = []
    start = 0
    for depth, needle in sorted(needles, key=lambda item: item[0]):
        at = int(units * depth / 100)
        parts.extend(distractors[start:at])
        parts.append(needle)
        start = at
    parts.extend(distractors[start:])
    return concat(parts)


def _choose_lengths(lengths: np.ndarray, budget: int) -> list[int]:
    """Indices of items whose lengths sum to `budget` or just under: greedy, then swaps close the gap."""
    csum = np.cumsum(lengths)
    n = int(np.searchsorted(csum, budget, side="right"))
    gap = budget - (int(csum[n - 1]) if n else 0)
    chosen, _ = close_gap(lengths, list(range(n)), list(range(n, len(lengths))), gap)
    return chosen


def generate(
    ctx: GenContext, params: NiahParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    taken: set[str] = set()
    keys = _draw_unique(params.type_key, rng, params.num_needle_k, taken)
    values = [_draw_unique(params.type_value, rng, params.num_needle_v, taken) for _ in keys]
    needles = [(k, v) for k, vs in zip(keys, values, strict=True) for v in vs]
    order = rng.permutation(len(needles))
    needles = [needles[i] for i in order]
    queried = sorted(int(i) for i in rng.choice(len(keys), size=params.num_needle_q, replace=False))
    query_keys = [keys[i] for i in queried]
    references = [v for i in queried for v in values[i]]

    # The first queried needle sits at depth DEPTHS[index % 40]: depth is stratified over instances.
    first = next(i for i, (k, _) in enumerate(needles) if k == query_keys[0])
    depth = DEPTHS[index % len(DEPTHS)]
    others = [d for d in DEPTHS if d != depth]
    depths = [float(d) for d in rng.choice(others, size=len(needles) - 1, replace=False)]
    depths.insert(first, float(depth))
    placed = [(d, piece(ctx.encoder, needle_text(params, k, v))) for d, (k, v) in zip(depths, needles, strict=True)]

    query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    user, prefix = fill("niah", type_needle_v=params.type_value, query=query)
    frame: Frame = ctx.frame(user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    needle_tokens = sum(len(p) for _, p in placed)
    if needle_tokens > budget:
        raise_too_short(target_length, needle_tokens, budget)

    if params.haystack == "needle":
        build = lambda b: _needle_haystack(ctx, params, b - needle_tokens, placed, rng, taken)  # noqa: E731
    else:
        stream = _haystack_stream(ctx, params)
        build = lambda b: _insert(stream, b - needle_tokens, placed)  # noqa: E731
    context = fit_context(ctx.encoder, budget, build)
    return Draft(
        prompt=frame.head + context.text + frame.tail,
        prompt_token_ids=np.concatenate([frame.head_ids, context.ids, frame.tail_ids]),
        answer_prefix=frame.answer_prefix,
        references=references,
        depth=float(depth),
        complexity=f"k{params.num_needle_k}-v{params.num_needle_v}-q{params.num_needle_q}",
        meta={"keys": query_keys, "depths": depths, "haystack": params.haystack},
    )


def raise_too_short(target_length: int, need: int, budget: int) -> None:
    from longeval.errors import LengthError

    raise LengthError(
        f"target length {target_length} leaves {budget} context tokens, fewer than the {need} the needles "
        "need; use a larger suite.lengths value"
    )
