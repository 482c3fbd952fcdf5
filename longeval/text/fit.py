"""Fitting a context to an exact token budget: what a generator calls between its frame and its draft.

A prompt is `frame.head + context + frame.tail` (see `text.render`); the context gets whatever the target length
leaves after the frame and the output budget (`context_budget`). A generator builds the context from pieces
encoded once (`text.pieces`): a stream of filler units cut at a word (`UnitStream.fill`), or whole items that may
not be cut (key-value pairs, needles, numbered words), for which `choose_lengths` picks items whose token counts
sum to the budget. `fit_context` then fixes the context's first word to how it follows the template and shrinks
the budget in the rare case that re-encoding overflows it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from longeval.errors import LengthError
from longeval.text.pieces import Piece, close_gap, open_context
from longeval.text.render import Frame
from longeval.text.tokenizer import Encoder


def context_budget(frame: Frame, target_length: int, max_new_tokens: int) -> int:
    """Tokens left for the context: `input_tokens + max_new_tokens <= target_length`.

    Raises:
        LengthError: the frame and the output budget alone do not fit the target length.
    """
    budget = target_length - max_new_tokens - frame.overhead
    if budget <= 0:
        raise LengthError(
            f"target length {target_length} cannot hold the prompt template ({frame.overhead} tokens) "
            f"and the output budget ({max_new_tokens} tokens); use a larger suite.lengths value"
        )
    return budget


def fit_context(encoder: Encoder, frame: Frame, budget: int, build: Callable[[int], Piece], *,
                opened: bool = False) -> Piece:
    """Build a context of at most `budget` tokens, allowing for the re-encoded first word.

    `build(b)` assembles a context for a budget `b`; removing (or adding) the leading space can change the count
    by a token, and so can a last item rendered differently, so we shrink and rebuild while it overflows.
    `opened=True`: `build` already starts the context as it follows the template (see `open_context`).

    Raises:
        LengthError: four rebuilds still overflow (a `build` that ignores its budget).
    """
    target = budget
    for _ in range(4):
        context = build(target) if opened else open_context(encoder, frame, build(target))
        if len(context) <= budget:
            return context
        target -= len(context) - budget
    raise LengthError(f"could not fit a context into {budget} tokens")


def choose_lengths(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Positions of items whose token lengths sum to `budget` or just under, in their original order.

    For contexts made of whole items that may not be cut (RULER's distractor needles, a JSON object's
    key-value pairs): give more candidates than fit, in random order. As many items as the shortest ones
    allow are taken, the first ones first; if they overflow, the longest are swapped for the shortest spares;
    then swaps for longer spares close the remaining gap, usually to 0 tokens.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = int(np.searchsorted(np.cumsum(np.sort(lengths)), budget, side="right"))
    chosen, spare = np.arange(n), np.arange(n, len(lengths))
    total = int(lengths[:n].sum())
    if total > budget:
        longest = chosen[np.argsort(-lengths[chosen], kind="stable")]
        shortest = spare[np.argsort(lengths[spare], kind="stable")]
        m = min(len(longest), len(shortest))
        deltas = lengths[longest[:m]] - lengths[shortest[:m]]
        useful = int(np.argmax(deltas <= 0)) if (deltas <= 0).any() else m  # swaps that still save tokens
        saving = np.cumsum(deltas[:useful])
        k = int(np.searchsorted(saving, total - budget, side="left")) + 1
        if k > useful:  # cannot happen when the n shortest fit, but never index past the savings
            order = np.argsort(lengths, kind="stable")
            chosen, spare, k = order[:n], order[n:], 0
            total = int(lengths[chosen].sum())
        else:
            chosen = np.concatenate([longest[k:], shortest[:k]])
            spare = np.concatenate([shortest[k:], longest[:k]])
            total -= int(saving[k - 1])
    spare = spare[np.argsort(-lengths[spare], kind="stable")]
    picked, _ = close_gap(lengths, chosen.tolist(), spare.tolist(), budget - total)
    return np.sort(np.asarray(picked, dtype=np.int64))
