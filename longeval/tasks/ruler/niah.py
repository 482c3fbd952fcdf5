"""RULER §3.1, Retrieval: needle-in-a-haystack (NIAH) and its eight variants.

A needle is a key-value sentence, `One of the special magic {numbers|uuids|words} for {key} is: {value}.`,
inserted into a haystack (repeated noise sentences, essays, or other needles acting as distractors) at
one of 40 depths evenly spaced over 0-100 %. Keys are adjective-noun pairs, numbers have 7 digits,
UUIDs 32 hex digits. Multi-key adds distractor needles, multi-value puts several values under one key
and multi-query asks for several keys at once; every queried value must be returned.

Text layout as RULER's generator (scripts/data/synthetic/niah.py, generate_input_output): the essay haystack
is its first words, split into sentences; a needle at depth d goes before sentence int(S * (d / 100)) of the S
sentences (the last one the cut one), and sentence runs and needles are joined by single spaces, so a needle at
depth 0 follows a space, one after the last sentence is followed by one, and two at the same place have two
between them. In the noise and needle haystacks every noise paragraph, the needle and each distractor needle
is a line of its own ("\n".join), and the context ends on a whole line. With one query and one value the
template is singular.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.tasks.base import Draft, GenContext, draft
from longeval.tasks.ruler.templates import fill
from longeval.text import words
from longeval.text.corpus import NOISE, load_essays
from longeval.text.fit import choose_lengths, context_budget, fit_context
from longeval.text.haystack import depth_for, insert_between_lines, insert_between_sentences
from longeval.text.pieces import Piece, Ragged, UnitStream, concat, drop_space, end_line
from longeval.text.render import Frame
from longeval.text.tokenizer import Encoder

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


def draw_many(kind: Kind, rng: np.random.Generator, n: int) -> list[str]:
    """n random keys or values of a kind, drawn in one vectorised call."""
    if kind == "numbers":
        return [str(x) for x in rng.integers(10**6, 10**7, size=n)]
    if kind == "uuids":
        raw = rng.bytes(16 * n)
        return [str(uuid.UUID(bytes=raw[16 * i : 16 * i + 16], version=4)) for i in range(n)]
    adjectives, nouns = words.adjectives(), words.nouns()
    a, b = rng.integers(len(adjectives), size=n), rng.integers(len(nouns), size=n)
    return [f"{adjectives[i]}-{nouns[j]}" for i, j in zip(a, b, strict=True)]


MAX_DRAW_ROUNDS = 64
"""Rounds of `draw_unique` before it gives up: each round draws all that is still missing, so only a request
near the size of the kind's whole space (more needles than there are distinct keys) takes more than a few."""


def draw_unique(kind: Kind, rng: np.random.Generator, n: int, taken: set[str], *, param: str = "") -> list[str]:
    """n keys or values of a kind unlike any in `taken`; gives up, naming `param`, rather than draw forever."""
    out: list[str] = []
    for _ in range(MAX_DRAW_ROUNDS):
        if len(out) >= n:
            return out
        for item in draw_many(kind, rng, n - len(out)):
            if item not in taken:
                taken.add(item)
                out.append(item)
    if len(out) >= n:
        return out
    raise ConfigError(f"gave up drawing {n:,} distinct {kind} after {MAX_DRAW_ROUNDS} rounds (got {len(out):,}): "
                      f"{param or 'the needle count'} asks for more distinct {kind} than there are; lower it")


def one_answer(params: NiahParams) -> bool:
    """RULER rewrites the template to the singular when one query has one value."""
    return params.num_needle_q * params.num_needle_v == 1


def _lines(params: NiahParams) -> bool:
    """Noise and needle haystacks are lines; the essay haystack is running text."""
    return params.haystack != "essay"


def needle_text(params: NiahParams, key: str, value: str) -> str:
    """A needle as placed: a line of its own in line haystacks, after a space in the essay haystack."""
    text = f"One of the special magic {params.type_value} for {key} is: {value}."
    return text + "\n" if _lines(params) else " " + text


def _needle_piece(ctx: GenContext, params: NiahParams, key: str, value: str) -> Piece:
    text = needle_text(params, key, value)
    return Piece(text, ctx.encoder.encode_followed(text) if _lines(params) else ctx.encoder.encode(text))


def _noise_stream(ctx: GenContext) -> UnitStream:
    return ctx.cached(("noise-lines",), lambda: UnitStream(ctx.encoder, (NOISE + "\n",), followed=True))


def prepare_haystack(ctx: GenContext, params: NiahParams) -> None:
    """Build the noise or essay haystack these parameters draw from and keep it in `ctx`, as the first instance
    would: the generation benchmark times this apart from that instance. (The needle haystack depends on the
    target length and is built with its instance.)"""
    if params.haystack == "noise":
        _noise_stream(ctx)
    elif params.haystack == "essay":
        ctx.essay_haystack()


def _open(encoder: Encoder, frame: Frame, context: Piece) -> Piece:
    """The essay context as it follows the template: RULER's text (ours less its first space), or with the space
    when the template's own space before the context moved into it."""
    return context if frame.context_lead == " " else drop_space(encoder, context)


def _encode_items(ctx: GenContext, kind: Kind, items: list[str]) -> list[np.ndarray]:
    """Ids of ' item' for many keys or values; word keys from their cached adjective and noun parts."""
    if kind == "words":
        return words.encode_compounds(ctx.encoder, items)
    return ctx.encoder.encode_many([" " + item for item in items], cache=False)


def needle_ids(ctx: GenContext, params: NiahParams, keys: list[str], values: list[str]) -> list[np.ndarray]:
    """Needle ids assembled from encoded parts: the sentence frame once, keys and values in batches.

    Parts meet at pre-tokenizer boundaries (a space, '-', ':', '.'), so this equals encoding each needle;
    a few are checked, and a tokenizer that merges across the parts gets whole-needle encodings instead.
    """
    enc = ctx.encoder
    lead = "" if _lines(params) else " "
    head = enc.encode(f"{lead}One of the special magic {params.type_value} for")
    mid = enc.encode(" is:")
    end = enc.encode_followed(".\n") if _lines(params) else enc.encode(".")
    key_ids, value_ids = _encode_items(ctx, params.type_key, keys), _encode_items(ctx, params.type_value, values)
    out = [np.concatenate([head, k, mid, v, end]) for k, v in zip(key_ids, value_ids, strict=True)]
    whole = [_needle_piece(ctx, params, keys[i], values[i]).ids for i in range(min(3, len(out)))]
    if not all(np.array_equal(a, b) for a, b in zip(out, whole, strict=False)):
        return [_needle_piece(ctx, params, k, v).ids for k, v in zip(keys, values, strict=True)]
    return out


@dataclass(frozen=True)
class NeedlePool:
    """Distractor needles encoded once and shared by every instance of a length (RULER's multi-key haystacks).

    Its size and contents depend only on the needle kinds, the target length and the tokenizer, so
    instances stay identical however they are sharded; each instance draws its own random subset.
    """

    keys: list[str]
    texts: list[str]
    ids: Ragged


def _pool(ctx: GenContext, params: NiahParams, target_length: int) -> NeedlePool:
    probe = len(ctx.encoder.encode(needle_text(params, draw_many(params.type_key, np.random.default_rng(0), 1)[0],
                                               draw_many(params.type_value, np.random.default_rng(1), 1)[0])))
    size = 1 << max(12, int(2 * target_length / max(1, probe - 4) + 512).bit_length())

    def build() -> NeedlePool:
        rng = np.random.default_rng([POOL_SEED, size, len(params.type_key), len(params.type_value)])
        keys = draw_unique(params.type_key, rng, size, set())
        values = draw_many(params.type_value, rng, size)
        texts = [needle_text(params, k, v) for k, v in zip(keys, values, strict=True)]
        return NeedlePool(keys, texts, Ragged.of(needle_ids(ctx, params, keys, values)))

    return ctx.cached(("needle-pool", params.type_key, params.type_value, size), build)


POOL_SEED = 20240401


def _needle_haystack(
    ctx: GenContext, params: NiahParams, budget: int, needles: list[tuple[float, Piece]],
    rng: np.random.Generator, taken: set[str], pool: NeedlePool,
) -> Piece:
    """A haystack made of distractor needles, sized to the budget by choosing needles of the right lengths."""
    lengths_all = pool.ids.lengths
    want = min(len(lengths_all), int(budget / max(1.0, float(lengths_all[:256].mean()))) + 256)
    candidates = rng.choice(len(lengths_all), size=want, replace=False)
    candidates = np.array([c for c in candidates if pool.keys[c] not in taken], dtype=np.int64)
    chosen = candidates[choose_lengths(lengths_all[candidates], budget)]
    units = len(chosen)
    parts: list[Piece] = []
    start = 0
    for depth, needle in sorted(needles, key=lambda item: item[0]):
        at = int(units * depth / 100)
        parts.append(_run(pool, chosen[start:at]))
        parts.append(needle)
        start = at
    parts.append(_run(pool, chosen[start:]))
    return concat(parts)


def _run(pool: NeedlePool, indices: np.ndarray) -> Piece:
    return Piece("".join(pool.texts[i] for i in indices), pool.ids.take(indices))


def generate(
    ctx: GenContext, params: NiahParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    taken: set[str] = set()
    keys = draw_unique(params.type_key, rng, params.num_needle_k, taken, param="suite.params num_needle_k")
    values = [draw_unique(params.type_value, rng, params.num_needle_v, taken, param="suite.params num_needle_v")
              for _ in keys]
    needles = [(k, v) for k, vs in zip(keys, values, strict=True) for v in vs]
    order = rng.permutation(len(needles))
    needles = [needles[i] for i in order]
    queried = sorted(int(i) for i in rng.choice(len(keys), size=params.num_needle_q, replace=False))
    query_keys = [keys[i] for i in queried]
    references = [v for i in queried for v in values[i]]

    # The first queried needle sits at depth DEPTHS[index % 40]: depth is stratified over instances.
    first = next(i for i, (k, _) in enumerate(needles) if k == query_keys[0])
    depth = depth_for(index, DEPTHS)
    others = [d for d in DEPTHS if d != depth]
    depths = [float(d) for d in rng.choice(others, size=len(needles) - 1, replace=False)]
    depths.insert(first, float(depth))
    placed = [(d, _needle_piece(ctx, params, k, v)) for d, (k, v) in zip(depths, needles, strict=True)]

    query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    user, prefix = fill("niah", one_answer=one_answer(params), type_needle_v=params.type_value, query=query)
    frame: Frame = ctx.frame(user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    needle_tokens = sum(len(p) for _, p in placed)
    # Essays: a needle after an empty sentence run or after the last sentence keeps a join space
    # (insert_between_sentences).
    need = needle_tokens + (len(placed) + 1 if params.haystack == "essay" else 0)
    if need > budget:
        raise_too_short(target_length, need, budget)

    if params.haystack == "needle":
        pool = _pool(ctx, params, target_length)
        build = lambda b: end_line(  # noqa: E731
            ctx.encoder, _needle_haystack(ctx, params, b - needle_tokens, placed, rng, taken, pool))
    elif params.haystack == "noise":
        stream = _noise_stream(ctx)
        build = lambda b: end_line(ctx.encoder, insert_between_lines(stream, b - needle_tokens, placed))  # noqa: E731
    else:
        essays, follower = ctx.essay_haystack(), frame.tail or "x"
        build = lambda b: _open(  # noqa: E731
            ctx.encoder, frame, insert_between_sentences(essays, b - needle_tokens, placed, follower))
    context = fit_context(ctx.encoder, frame, budget, build, opened=params.haystack == "essay")
    return draft(
        frame, context, references,
        depth=float(depth),
        complexity=f"k{params.num_needle_k}-v{params.num_needle_v}-q{params.num_needle_q}",
        meta={"keys": query_keys, "depths": depths, "haystack": params.haystack,
              **({"corpus": load_essays(ctx.data.essay_dir).name} if params.haystack == "essay" else {})},
    )


def raise_too_short(target_length: int, need: int, budget: int) -> None:
    raise LengthError(
        f"target length {target_length} leaves {budget} context tokens, fewer than the {need} the needles "
        "need; use a larger suite.lengths value"
    )
