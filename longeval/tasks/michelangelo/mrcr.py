"""Michelangelo §2.2, Multi-Round Co-reference Resolution (MRCR).

The context is a long conversation in which a user asks for writings ("Write a poem about penguins.")
and a model answers each. A few requests share one format and topic: the *needles* (2, 4 or 8;
instance `i` has `needles[i % 3]`). Near them sit `near_misses` writings that share the format or the
topic but not both (half each), and the rest of the conversation is filler that shares neither, so
the number of confusable writings is fixed and only the length varies (§3's principle). The final
request asks the model to prepend a random string to the k-th needle (k uniform in 1..n), e.g.
"Add the sentence AKJSs89sal to the 2nd poem about penguins." (Appendix A.2).

Two layouts (`layout`). "chat" is OpenAI's openai/mrcr release as published: every request and every
writing is a chat message, rendered turn by turn by the model's chat template (a plain "User:" /
"Assistant:" transcript for base models), the final ask is OpenAI's "Prepend … to the 2nd (1 indexed) poem
about penguins. Do not include any other text in your response." and the answer is the random string
followed directly by the writing. "text" is the paper's Appendix A.2: the conversation as "User: …\nModel:
…" lines inside one user message, after two solved examples, with "Model:" as the answer prefix. Either
way the context is built from turns encoded once, in token space, at any length up to 1M tokens.

Scoring offers both published variants (`grading`):
- "openai" (default; OpenAI's openai/mrcr grader): the output must start with the random string, else
  0; otherwise the string is removed from output and answer and the score is difflib's
  `SequenceMatcher(None, output, answer).ratio()`.
- "deepmind" (DeepMind's mrcr_v2 grader): the answer's first 12 characters are the hash; its *last*
  occurrence in the output starts the text compared (0 if absent), after stripping both sides.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.scoring.judgement import Judgement, raw_output
from longeval.tasks.base import Draft, GenContext, context_budget, draft, fit_context
from longeval.tasks.michelangelo import prompts
from longeval.tasks.michelangelo._units import UnitPool, fill_units, interleave, positions_among
from longeval.tasks.michelangelo.writings import (
    Writing,
    WritingPool,
    is_longeval_pool,
    load_longeval_pool,
    load_openai_pool,
    procedural_pool,
)
from longeval.text.pieces import Piece
from longeval.text.render import Frame, TurnLayout, turn_layout

GRADINGS = ("openai", "deepmind")
LAYOUTS = ("auto", "chat", "text")
MIN_LENGTH = 4096
"""The smallest target length every needle count fits at, with the 512-token output budget (OpenAI's
smallest bin starts here too)."""
RANDOM_STRING_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
PREFIX_LENGTH = {"openai": 10, "deepmind": 12}
"""OpenAI's strings have 10 characters; DeepMind's grader reads the first 12 characters as the hash."""
ANSWER_ROOM = 16
"""Output tokens kept free besides a needle (the random string and a space)."""
KEY_ATTEMPTS = 16
MAX_COMPARE_CHARS = 100_000
"""Outputs are cut here before difflib (quadratic in the worst case); real outputs are far shorter."""

NOISE_FLOORS = {
    "any_response": 0.01,
    "same_key": {2: 0.51, 4: 0.27, 8: 0.15},
}
"""DeepMind's mrcr_v2 noise rates: a model that repeats any assistant response scores about 1 %; one
that repeats a random writing of the asked format and topic about 51 / 27 / 15 % (2 / 4 / 8 needles)."""
PAPER_CHANCE = {"any_writing": 0.04, "topic_or_format": 0.09}
"""Appendix B.1.1: a random writing of the conversation scores 4 %; one sharing topic or format 9 %."""


@dataclass(frozen=True)
class MrcrParams:
    """The paper's MRCR with OpenAI's needle counts."""

    needles: tuple[int, ...] = (2, 4, 8)
    """Needle counts; instance `i` uses `needles[i % len(needles)]`."""
    grading: str = "openai"
    """"openai" or "deepmind": which published grader scores the output (see the module docstring)."""
    near_misses: int = 4
    """Writings sharing the format or the topic of the needles (half each), at every length."""
    pool_path: str | None = None
    """openai/mrcr Parquet files (a file or a folder), or a pool written by `longeval mrcr build-pool`;
    None: the procedural offline pool."""
    pool_revision: str | None = None
    """The Hugging Face commit the openai/mrcr files were downloaded at (required for them)."""
    pool_max_writings: int = 4000
    """How many distinct writings to harvest from the Parquet files."""
    prefix_length: int = 0
    """Characters of the random string; 0: 10 for "openai", 12 for "deepmind" grading."""
    few_shot: bool = True
    """Show solved examples before the conversation (Appendix A.2's two; in the chat layout openai/mrcr's
    own first message when the pool has one)."""
    layout: str = "auto"
    """"chat" (openai/mrcr as published: one chat message per turn), "text" (Appendix A.2: the conversation
    as text in one user message, cue "Model:"), or "auto": chat for OpenAI's grading or an openai/mrcr
    pool, else text. OpenAI's grader reads the raw output, so a text-layout answer that starts with a
    space after "Model:" scores 0 under it, as it would under the card's `grade`."""

    def __post_init__(self) -> None:
        if self.grading not in GRADINGS:
            raise ConfigError(f"mrcr.grading must be one of {', '.join(GRADINGS)}, got {self.grading!r}")
        if not self.needles or any(int(n) < 1 for n in self.needles):
            raise ConfigError(f"mrcr.needles must be positive integers, got {self.needles!r}")
        if self.near_misses < 0:
            raise ConfigError(f"mrcr.near_misses must be >= 0, got {self.near_misses}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"mrcr.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.prefix_length < 0 or (self.grading == "deepmind" and self.prefix_length not in (0, 12)):
            raise ConfigError("mrcr.prefix_length must be 0 (the grader's default) or, for deepmind grading, 12")

    @property
    def random_string_length(self) -> int:
        return self.prefix_length or PREFIX_LENGTH[self.grading]


def request(fmt: str, topic: str) -> str:
    """The user's ask: "Write a poem about penguins." """
    return prompts.MRCR_REQUEST.format(article=prompts.article(fmt), format=fmt, topic=topic)


def turn(writing: Writing) -> str:
    """One conversation turn, "User: ...\nModel: ...\n" (a unit of the context)."""
    return prompts.MRCR_TURN.format(request=request(writing.format, writing.topic), writing=writing.text)


def chat_request(writing: Writing) -> str:
    """The request message of the chat layout: as published ("write a poem about tapirs") or in its style."""
    return writing.request or prompts.MRCR_CHAT_REQUEST.format(article=prompts.article(writing.format),
                                                                format=writing.format, topic=writing.topic)


def chat_question(random_string: str, k: int, fmt: str, topic: str) -> str:
    """OpenAI's final ask: "Prepend X to the 2nd (1 indexed) poem about tapirs. Do not include ..." """
    return prompts.MRCR_CHAT_QUESTION.format(random_string=random_string, ordinal=prompts.ordinal(k), format=fmt,
                                             topic=topic)


@dataclass(frozen=True)
class _Encoded:
    """A writing pool with every turn encoded once, and per-writing format/topic codes for numpy."""

    pool: WritingPool
    turns: UnitPool
    formats: np.ndarray
    topics: np.ndarray
    keys: tuple[tuple[str, str], ...]  # sorted (format, topic) keys


def _pool_key(params: MrcrParams) -> tuple[Any, ...]:
    return (params.pool_path, params.pool_revision, params.pool_max_writings if params.pool_path else 0)


def _pool(ctx: GenContext, params: MrcrParams) -> WritingPool:
    def build() -> WritingPool:
        if params.pool_path and is_longeval_pool(params.pool_path):
            return load_longeval_pool(params.pool_path)
        if params.pool_path:
            return load_openai_pool(params.pool_path, revision=params.pool_revision or "",
                                    max_writings=params.pool_max_writings)
        return procedural_pool()

    return ctx.cached(("michelangelo/mrcr/pool", *_pool_key(params)), build)


def layout_of(params: MrcrParams, pool: WritingPool) -> str:
    """The layout an instance uses: `params.layout`, with "auto" resolved (see `MrcrParams.layout`)."""
    if params.layout != "auto":
        return params.layout
    return "chat" if params.grading == "openai" or pool.source.startswith("openai/mrcr") else "text"


def _encoded(ctx: GenContext, params: MrcrParams, chat: TurnLayout | None = None) -> _Encoded:
    """The pool with every turn encoded once, as text-layout lines or (given `chat`) as chat turns."""
    pool = _pool(ctx, params)

    def build() -> _Encoded:
        formats = {f: i for i, f in enumerate(pool.formats)}
        topics = {t: i for i, t in enumerate(pool.topics)}
        if chat is None:
            turns = UnitPool.build(ctx.encoder, [turn(w) for w in pool.writings], follower="User")
        else:
            turns = UnitPool.build(ctx.encoder, [chat.turn(chat_request(w), w.text) for w in pool.writings],
                                   follower=chat.open or "x")
        return _Encoded(
            pool=pool,
            turns=turns,
            formats=np.array([formats[w.format] for w in pool.writings], dtype=np.int64),
            topics=np.array([topics[w.topic] for w in pool.writings], dtype=np.int64),
            keys=tuple(sorted(pool.by_key)),
        )

    key = None if chat is None else (chat.open, chat.mid, chat.close)
    return ctx.cached(("michelangelo/mrcr/turns", *_pool_key(params), key), build)


def chat_examples(pool: WritingPool, length: int) -> str:
    """Solved examples for the chat layout's first message, when the pool brings none of its own: the
    same cases as Appendix A.2's, in openai/mrcr's wording (answer = string + writing, no space)."""
    text = prompts.MRCR_INTRO
    for n, (turns, (fmt, topic), k, answer, rs) in enumerate(_example_cases(pool, length), start=1):
        text += prompts.MRCR_EXAMPLE_HEADER.format(n=n)
        text += "".join(prompts.MRCR_CHAT_EXAMPLE_TURN.format(request=chat_request(w), writing=w.text) for w in turns)
        ask = chat_question(rs, k, fmt, topic)
        text += prompts.MRCR_CHAT_EXAMPLE_TURN.format(request=ask, writing=rs + answer.text)
        text += prompts.MRCR_CHAT_EXAMPLE_END
    return text


def _chat_layout(ctx: GenContext, params: MrcrParams, pool: WritingPool) -> TurnLayout:
    """The model's rendering of the chat layout, with the examples as the first user message."""
    def build() -> TurnLayout:
        preamble = (pool.preamble or chat_examples(pool, params.random_string_length)) if params.few_shot else ""
        return turn_layout(ctx.encoder, ctx.fmt, [{"role": "user", "content": preamble}] if preamble else [])

    key = ("michelangelo/mrcr/chat", *_pool_key(params), params.few_shot, params.random_string_length)
    return ctx.cached(key, build)


def random_string(rng: np.random.Generator, length: int) -> str:
    """The alphanumeric string the model must prepend (OpenAI's alphabet)."""
    return "".join(RANDOM_STRING_CHARS[i] for i in rng.integers(0, len(RANDOM_STRING_CHARS), size=length))


def _example_cases(pool: WritingPool, length: int) -> list[tuple[list[Writing], tuple[str, str], int, Writing, str]]:
    """The two solved examples' turns, asked key, ordinal, answer and random string (fixed)."""
    shots = {(w.format, w.topic): [] for w in pool.few_shot}
    for w in pool.few_shot:
        shots[(w.format, w.topic)].append(w)
    (p_owls, t_owls, p_kites, t_kites) = (shots.get(k, []) for k in (("poem", "owls"), ("tweet", "owls"),
                                                                       ("poem", "kites"), ("tweet", "kites")))
    rng = np.random.default_rng(0)
    cases = (
        ([p_owls[0], t_kites[0]], ("poem", "owls"), 1, p_owls[0]),
        ([t_owls[0], p_kites[0], t_owls[1]], ("tweet", "owls"), 2, t_owls[1]),
    )
    return [(turns, key, k, answer, random_string(rng, length)) for turns, key, k, answer in cases]


def _examples(pool: WritingPool, length: int) -> str:
    """The two solved examples (fixed, so every instance shares the prompt's head)."""
    text = prompts.MRCR_INTRO
    cases = _example_cases(pool, length)
    for n, (turns, (fmt, topic), k, answer, rs) in enumerate(cases, start=1):
        text += prompts.MRCR_EXAMPLE_HEADER.format(n=n) + "".join(turn(w) for w in turns)
        text += prompts.MRCR_QUESTION.format(random_string=rs, ordinal=prompts.ordinal(k), format=fmt, topic=topic)
        text += f"{prompts.MRCR_CUE} {rs} {answer.text}\n"
    return text + prompts.MRCR_EXAMPLE_HEADER.format(n=len(cases) + 1)


@dataclass(frozen=True)
class _Plan:
    key: tuple[str, str]
    needles: list[int]  # pool indices, in no particular order
    near: list[int]
    filler: np.ndarray  # pool indices the filler may use
    fixed_tokens: int


def _candidates(enc: _Encoded, n: int, answer_room: int) -> list[tuple[str, str]]:
    """(format, topic) keys with at least `n` writings short enough to be reproduced in the output budget."""
    lengths = enc.turns.lengths
    keys = [k for k in enc.keys if sum(1 for i in enc.pool.by_key[k] if lengths[i] <= answer_room) >= n]
    if not keys:
        raise ConfigError(f"the MRCR pool ({enc.pool.source}) has no (format, topic) with {n} writings short "
                          f"enough for a {answer_room}-token answer; raise max_new_tokens or use another pool")
    return keys


def _plan(enc: _Encoded, key: tuple[str, str], n: int, m: int, rng: np.random.Generator, answer_room: int) -> _Plan:
    """The needles of `key` and its near misses: `m` writings sharing its format or its topic, half each."""
    lengths = enc.turns.lengths
    f, t = enc.pool.formats.index(key[0]), enc.pool.topics.index(key[1])
    own = [i for i in enc.pool.by_key[key] if lengths[i] <= answer_room]
    needles = [own[i] for i in rng.choice(len(own), size=n, replace=False)]
    same_format = np.flatnonzero((enc.formats == f) & (enc.topics != t))
    same_topic = np.flatnonzero((enc.formats != f) & (enc.topics == t))
    want_topic = min(m // 2, len(same_topic))
    want_format = min(m - want_topic, len(same_format))
    want_topic = min(m - want_format, len(same_topic))
    near = [int(same_format[i]) for i in rng.choice(len(same_format), size=want_format, replace=False)]
    near += [int(same_topic[i]) for i in rng.choice(len(same_topic), size=want_topic, replace=False)]
    filler = np.flatnonzero((enc.formats != f) & (enc.topics != t))
    return _Plan(key, needles, near, filler, int(lengths[needles + near].sum()))


def generate(
    ctx: GenContext, params: MrcrParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator | None = None,
) -> Draft:
    """One MRCR conversation of exactly the target length (whole turns only)."""
    if target_length < MIN_LENGTH:
        raise LengthError(
            f"michelangelo/mrcr needs target lengths of at least {MIN_LENGTH} tokens (got {target_length}): "
            f"8 needles, near misses and a {max_new_tokens}-token answer do not fit; raise suite.lengths"
        )
    needles = tuple(params.needles)
    n = int(needles[index % len(needles)])
    pool = _pool(ctx, params)
    layout = layout_of(params, pool)
    chat = _chat_layout(ctx, params, pool) if layout == "chat" else None
    enc = _encoded(ctx, params, chat)
    length = params.random_string_length
    rs = random_string(rng, length)
    examples = _examples(enc.pool, length) if params.few_shot and chat is None else ""
    answer_room = max_new_tokens - ANSWER_ROOM
    keys = _candidates(enc, n, answer_room)
    smallest = None
    for _ in range(KEY_ATTEMPTS):  # a long needle set may not fit a short context: draw another key
        plan = _plan(enc, keys[int(rng.integers(len(keys)))], n, params.near_misses, rng, answer_room)
        k = int(rng.integers(1, n + 1))
        frame: Frame
        if chat is not None:
            question = chat_question(rs, k, plan.key[0], plan.key[1])
            frame = chat.frame(ctx.encoder, question)
        else:
            question = prompts.MRCR_QUESTION.format(random_string=rs, ordinal=prompts.ordinal(k),
                                                    format=plan.key[0], topic=plan.key[1])
            frame = ctx.frame(examples + "{context}" + question, prompts.MRCR_CUE)
        budget = context_budget(frame, target_length, max_new_tokens)
        smallest = plan.fixed_tokens if smallest is None else min(smallest, plan.fixed_tokens)
        if plan.fixed_tokens <= budget and len(plan.filler):
            break
    else:
        raise LengthError(
            f"michelangelo/mrcr at {target_length}: {n} needles and their near misses need at least {smallest} "
            f"tokens but the context has {budget}; use larger suite.lengths values"
        )

    fixed_ids = plan.needles + plan.near
    shuffled = [fixed_ids[i] for i in rng.permutation(len(fixed_ids))]
    items = [enc.turns.piece(np.array([i])) for i in shuffled]
    fill_seed = int((context_rng if context_rng is not None else rng).integers(2**63))
    place_seed = int(rng.integers(2**63))
    placed: dict[str, Any] = {}

    def build(room: int) -> Piece:
        frng = np.random.default_rng(fill_seed)
        order, _ = fill_units(enc.turns.lengths, lambda size: plan.filler[frng.integers(0, len(plan.filler), size)],
                              room - plan.fixed_tokens)
        at = positions_among(len(order), len(items), np.random.default_rng(place_seed))
        context, offsets = interleave(enc.turns, order, items, at)
        placed.update(offsets=offsets, filler=len(order))
        return context

    context = fit_context(ctx.encoder, frame, budget, build)
    needle_set = set(plan.needles)
    in_order = [(off, i) for off, i in zip(placed["offsets"], shuffled, strict=True) if i in needle_set]
    target_offset, target = in_order[k - 1]
    fmt, topic = plan.key
    writing = enc.pool.writings[target]
    return draft(
        frame, context, [writing.text],
        depth=round(100.0 * target_offset / max(1, len(context)), 2),
        complexity=f"needles={n}",
        meta={
            "random_string": rs,
            "grading": params.grading,
            "layout": layout,
            "answer_joiner": "" if chat is not None else " ",
            "question": question,
            "needles": n,
            "ordinal": k,
            "format": fmt,
            "topic": topic,
            "near_misses": len(plan.near),
            "near_miss_keys": [list(enc.pool.writings[i].key) for i in plan.near],
            "filler_turns": placed["filler"],
            "needle_offsets": [off for off, _ in in_order],
            "pool": enc.pool.source,
            "pool_fingerprint": enc.pool.fingerprint,
            "prompt_fingerprint": prompts.fingerprint(),
        },
    )


# -- the two published graders --------------------------------------------------------------------


def _ratio(a: str, b: str) -> float:
    return float(difflib.SequenceMatcher(None, a, b).ratio())


def grade_openai(response: str, answer: str, random_string: str) -> float:
    """OpenAI's grader: 0 unless the response starts with the random string; then the SequenceMatcher
    ratio of response and answer with that string removed from the front of both."""
    if not response.startswith(random_string):
        return 0.0
    return _ratio(response.removeprefix(random_string), answer.removeprefix(random_string))


def grade_deepmind(prediction: str, target: str, hash_length: int = 12) -> float:
    """DeepMind's mrcr_v2 grader: the target's first `hash_length` characters are the hash; the text after
    the hash's last occurrence in the prediction is compared with the rest of the target (both stripped)."""
    if not prediction:
        return 0.0
    target = target.strip()
    if len(target) < hash_length:
        return 0.0
    digest, reference = target[:hash_length], target[hash_length:].strip()
    prediction = prediction.strip()
    at = prediction.rfind(digest)
    if at == -1:
        return 0.0
    return float(difflib.SequenceMatcher(a=reference, b=prediction[at + hash_length :].strip()).ratio())


@raw_output
def score_mrcr(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Score one output with the instance's grading variant; never raises on any output.

    The graders get the model's output as it came (`raw_output`): OpenAI's `grade` gives 0 to a response
    that starts with a space before the random string, and so do we. The answer is the random string
    and the writing joined as the prompt shows it (`answer_joiner`: "" in the chat layout, as in
    openai/mrcr's `answer`; " " in the text layout's solved examples).
    """
    rs = str(meta.get("random_string", ""))
    writing = str(references[0]) if references else ""
    answer = f"{rs}{meta.get('answer_joiner', ' ')}{writing}"
    response = str(output)[:MAX_COMPARE_CHARS]
    if meta.get("grading", "openai") == "deepmind":
        found = bool(rs) and rs in response
        score = grade_deepmind(response, answer, len(rs)) if rs else 0.0
        parsed = response[response.rfind(rs) + len(rs) :].strip() if found else ""
    else:
        found = response.startswith(rs)
        score = grade_openai(response, answer, rs) if rs else 0.0
        parsed = response.removeprefix(rs).strip() if found else ""
    if not found:
        return Judgement(0.0, "", "no_prefix")
    return Judgement(score, parsed[:2000], "" if score == 1.0 else "mismatch")
