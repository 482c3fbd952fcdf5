"""Lost in the Middle (Liu et al., 2023), §4: synthetic key-value retrieval.

The context is a JSON object of random UUID key-value pairs; the prompt asks for the value of one key, whose pair
sits at a depth of the object (the paper's finding: accuracy drops when it sits in the middle). The paper varies
the number of pairs (75, 140, 300); we fill a target length with as many pairs as fit, to the token.

A worked example of a family (docs/adding-a-family.md): the exact-length API of `longeval.text` in a dozen lines.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext, draft
from longeval.text import Piece, choose_lengths, concat, context_budget, depth_for, fit_context, piece

TEMPLATE = (
    'Extract the value corresponding to the specified key in the JSON object below, an object like '
    '{"key": "value", ...}.\n\nJSON data:\n{context}\n\nKey: "{key}"'
)
"""After the paper's prompt, with a JSON example: the frame finds `{context}` as text, not by
`str.format`, so the braces stay as written and `{key}` is filled with `str.replace`."""
ANSWER_PREFIX = "Corresponding value:"


@dataclass(frozen=True)
class KvParams:
    """The knobs of the task; a suite overrides them as `suite.params.kv_retrieval.depths=[...]`."""

    depths: tuple[float, ...] = (0.0, 25.0, 50.0, 75.0, 100.0)
    """Depths (percent of the object) of the queried pair, cycled over instances: the paper's positions."""

    def __post_init__(self) -> None:
        """Checked when a suite's `suite.params` change them, so a bad value fails at config time."""
        if not self.depths or any(not 0 <= d <= 100 for d in self.depths):
            raise ConfigError(f"depths={list(self.depths)}: give at least one, each a percent from 0 to 100")


def _pair(key: str, value: str, *, last: bool) -> str:
    """One pair as a unit: a leading space (a word boundary, so units join as the whole text tokenizes), then a
    comma, or the closing brace after the last pair."""
    return f' "{key}": "{value}"' + ("}" if last else ",")


def _uuids(rng: np.random.Generator, n: int) -> list[str]:
    raw = rng.bytes(16 * n)
    return [str(uuid.UUID(bytes=raw[16 * i : 16 * i + 16], version=4)) for i in range(n)]


def generate(ctx: GenContext, params: KvParams, *, target_length: int, max_new_tokens: int,
             rng: np.random.Generator, index: int) -> Draft:
    """A JSON object of exactly the tokens left by the frame and the output budget, the queried pair at its depth."""
    key, value = _uuids(rng, 2)
    frame = ctx.frame(TEMPLATE.replace("{key}", key), ANSWER_PREFIX)
    budget = context_budget(frame, target_length, max_new_tokens)
    depth = depth_for(index, params.depths)

    # Candidates: more pairs than can fit, encoded once; choose_lengths picks those that sum to the budget.
    gold = piece(ctx.encoder, _pair(key, value, last=False))
    per_pair = max(1, len(gold) - 8)
    keys, values = _uuids(rng, budget // per_pair + 64), _uuids(rng, budget // per_pair + 64)
    texts = [_pair(k, v, last=False) for k, v in zip(keys, values, strict=True)]
    ids = ctx.encoder.encode_many(texts, cache=False)
    lengths = np.array([len(i) for i in ids], dtype=np.int64)
    opening = piece(ctx.encoder, "{")

    def build(room: int) -> Piece:
        chosen = choose_lengths(lengths, room - len(opening) - len(gold)).tolist()
        at = round(len(chosen) * depth / 100)
        pairs = [Piece(texts[i], ids[i]) for i in chosen[:at]] + [gold] + [Piece(texts[i], ids[i]) for i in chosen[at:]]
        closing = piece(ctx.encoder, pairs[-1].text[:-1] + "}")  # the last pair closes the object
        return concat([opening, *pairs[:-1], closing])

    context = fit_context(ctx.encoder, frame, budget, build)
    return draft(frame, context, [value], depth=depth, meta={"key": key})
