"""RULER §3.3, Aggregation: common words (CWE) and frequent words (FWE) extraction.

CWE: a numbered list where `num_cw` common words appear `freq_cw` times each and a growing number of
uncommon words `freq_ucw` times each; the model lists the common words. RULER's configuration:
freq_cw 30, freq_ucw 3, num_cw 10, one in-context example; below 4K tokens it uses 6 and 1 (and a
smaller example), since 300 common-word entries alone would not fit.

FWE: coded words (random 6-letter strings) drawn with Zeta-distributed counts, alpha 2.0; the
top-ranked word is the noise token '...' (three dots, as RULER's code; its template says '....') and
the answer is the next three by frequency.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.tasks.base import Draft, GenContext, context_budget, draft
from longeval.tasks.ruler.templates import fill
from longeval.text import words
from longeval.text.pieces import Piece, Ragged, close_gap, open_context, ragged_take


@dataclass(frozen=True)
class CweParams:
    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    icl_example: bool = True
    short_below: int = 4096
    """Below this length RULER uses freq_cw 6, freq_ucw 1."""


@dataclass(frozen=True)
class FweParams:
    alpha: float = 2.0
    coded_wordlen: int = 6
    vocab_per_tokens: int = 50
    """Vocabulary size = target_length // vocab_per_tokens (at least 100)."""
    noise_word: str = "..."
    """RULER sets vocab[0] = '...' (freq_words_extraction.py), three dots, though its template says '....'."""

    def __post_init__(self) -> None:
        """Refuse values the generator cannot work with: a zeta needs alpha > 1, and a vocabulary of at least 100
        words needs words of at least 2 letters (see `coded_vocab` for the limit at each length)."""
        if self.alpha <= 1:
            raise ConfigError(f"alpha={self.alpha}: must be more than 1 (a Zipf law's exponent), e.g. 2.0")
        if self.coded_wordlen < 2 or self.vocab_per_tokens < 1:
            raise ConfigError(f"coded_wordlen={self.coded_wordlen}, vocab_per_tokens={self.vocab_per_tokens}: "
                              "coded_wordlen must be at least 2 and vocab_per_tokens at least 1")


def _numbered(ctx: GenContext, count: int) -> Ragged:
    """Encodings of ' 1.', ' 2.', ... (the list numbering), kept per process and extended when needed."""
    cached: Ragged | None = ctx.cache.get(("cwe-numbers",))
    if cached is None or len(cached.lengths) < count:
        size = max(2 * count, 2 * len(cached.lengths) if cached is not None else 4096)
        cached = Ragged.of(ctx.encoder.encode_many([f" {i}." for i in range(1, size + 1)], cache=False))
        ctx.cache[("cwe-numbers",)] = cached
    return cached


def _cwe_list(common: list[str], uncommon: list[str], freq_cw: int, freq_ucw: int, rng) -> list[str]:
    items = common * freq_cw + uncommon * freq_ucw
    return [items[i] for i in rng.permutation(len(items))]


def _cwe_example(params: CweParams, target_length: int, pool: list[str], rng) -> tuple[str, str]:
    """The solved example: its task text, and what follows it (answer prefix, answer, the newline before the task).

    RULER (common_words_extraction.py, generate_input_output): `template.format(context=example) + ' ' + answer`,
    the template being the model-wrapped one with its answer prefix, then "\n" and the task.
    """
    short = target_length < params.short_below
    n_words, f_cw, f_ucw = (20, 3, 1) if short else (40, 10, 3)
    chosen = pool[:n_words]
    items = _cwe_list(chosen[: params.num_cw], chosen[params.num_cw :], f_cw, f_ucw, rng)
    context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
    user, prefix = fill("common_words_extraction")
    answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(chosen[: params.num_cw]))
    return user.replace("{context}", context), prefix + " " + answer + "\n"


def _compounds(need: int, rng: np.random.Generator) -> list[str]:
    """Beyond ~200K tokens the 8K-word vocabulary runs out of uncommon words: add adjective-noun pairs.

    RULER's word list has the same limit; compounds keep every uncommon word distinct from the others.
    """
    if need <= 0:
        return []
    adjectives, nouns = words.adjectives(), words.nouns()
    codes = rng.integers(len(adjectives) * len(nouns), size=2 * need + 64)
    _, first = np.unique(codes, return_index=True)
    codes = codes[np.sort(first)][:need]
    return [f"{adjectives[c // len(nouns)]}-{nouns[c % len(nouns)]}" for c in codes.tolist()]


def generate_cwe(
    ctx: GenContext, params: CweParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    vocab = list(words.common_vocabulary())
    pool = [vocab[i] for i in rng.permutation(len(vocab))]
    example = ("", "")
    if params.icl_example:
        # RULER (common_words_extraction.py, generate_input_output): few_shots + "\n" + input_text.
        example = _cwe_example(params, target_length, pool[-40:], rng)
        pool = pool[:-40]
    short = target_length < params.short_below
    freq_cw, freq_ucw = (6, 1) if short else (params.freq_cw, params.freq_ucw)
    user, prefix = fill("common_words_extraction")
    frame = ctx.frame(user, prefix, example=example)
    # Two tokens of margin: the first entry loses its leading space, which can change its count by one.
    budget = context_budget(frame, target_length, max_new_tokens) - 2
    # A lower bound on tokens per uncommon word, (number + word) x its frequency, sizes the pool.
    pool += _compounds(budget // (freq_ucw * 5) + 64 - len(pool), rng)

    common, candidates = pool[: params.num_cw], pool[params.num_cw :]
    word_ids = Ragged.of(ctx.encoder.encode_many([" " + w for w in pool[: len(vocab)]])
                         + words.encode_compounds(ctx.encoder, pool[len(vocab) :]))
    word_len = word_ids.lengths
    common_tokens = freq_cw * int(word_len[: params.num_cw].sum())
    n_common_items = params.num_cw * freq_cw
    cand_len = word_len[params.num_cw :]
    est_items = n_common_items + freq_ucw * len(candidates)
    numbers = _numbered(ctx, est_items)
    num_csum = np.concatenate([[0], np.cumsum(numbers.lengths[:est_items])])
    cand_csum = np.concatenate([[0], np.cumsum(cand_len)])

    def total(u: int) -> int:
        return int(num_csum[n_common_items + freq_ucw * u] + common_tokens + freq_ucw * cand_csum[u])

    if total(0) > budget:
        raise LengthError(
            f"cwe at {target_length}: the {n_common_items} common-word entries alone need {total(0)} tokens "
            f"but {budget} are left; use a larger suite.lengths value"
        )
    lo, hi = 0, len(candidates)
    if total(hi) <= budget:
        raise LengthError(f"cwe at {target_length}: the word list ({len(pool)} words) cannot fill {budget} tokens")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= budget else (lo, mid)
    u = lo
    # Swapping uncommon words for longer ones (each appears freq_ucw times) closes most of the gap.
    chosen, _ = close_gap(cand_len, list(range(u)), list(range(u, len(candidates))), budget - total(u),
                          weight=freq_ucw)
    uncommon = [candidates[i] for i in chosen]
    items = _cwe_list(common, uncommon, freq_cw, freq_ucw, rng)
    index_of = {w: i for i, w in enumerate(pool)}
    order = np.array([index_of[w] for w in items])
    # Interleave the numbering and the words: segments [number 0, word 0, number 1, word 1, ...].
    both = Ragged(np.concatenate([numbers.flat, word_ids.flat]),
                  np.concatenate([numbers.starts, word_ids.starts + len(numbers.flat)]),
                  np.concatenate([numbers.lengths, word_ids.lengths]))
    segments = np.empty(2 * len(items), dtype=np.int64)
    segments[0::2] = np.arange(len(items))
    segments[1::2] = len(numbers.lengths) + order
    ids = both.take(segments)
    text = "".join(f" {i + 1}. {w}" for i, w in enumerate(items))
    context = open_context(ctx.encoder, frame, Piece(text, ids))
    return draft(
        frame, context, list(common),
        complexity=f"cw{params.num_cw}-f{freq_cw}-u{freq_ucw}",
        meta={"num_ucw": len(uncommon), "freq_cw": freq_cw, "freq_ucw": freq_ucw},
    )


def zeta(alpha: float, terms: int = 100_000) -> float:
    """Riemann zeta for alpha > 1: a partial sum with the Euler-Maclaurin tail (exact to ~1e-15)."""
    k = np.arange(1, terms + 1, dtype=np.float64)
    n = float(terms)
    return float(np.sum(k**-alpha) + n ** (1 - alpha) / (alpha - 1) - 0.5 * n**-alpha)


def coded_vocab(params: FweParams, size: int, rng: np.random.Generator) -> list[str]:
    """`size` distinct random lowercase words, drawn in one call, in a seeded random order."""
    letters = np.array(list(string.ascii_lowercase))
    there = 26**params.coded_wordlen
    if size > there // 2:  # drawing near the whole space would take ages, past it forever
        raise ConfigError(f"suite.params: ruler/fwe parameter coded_wordlen={params.coded_wordlen} gives {there:,} "
                          f"distinct words, too few for a vocabulary of {size:,} (target_length // vocab_per_tokens, "
                          "at least 100; at most half of the words are drawn): raise coded_wordlen or vocab_per_tokens")
    vocab: dict[str, None] = {}
    while len(vocab) < size:  # ends: at most half the space is asked for, so each round finds over half new
        codes = letters[rng.integers(0, 26, size=(2 * (size - len(vocab)) + 8, params.coded_wordlen))]
        vocab.update(dict.fromkeys("".join(row) for row in codes))
    ordered = sorted(list(vocab)[:size])
    return [ordered[i] for i in rng.permutation(len(ordered))]


def generate_fwe(
    ctx: GenContext, params: FweParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int,
) -> Draft:
    user, prefix = fill("freq_words_extraction")
    frame = ctx.frame(user, prefix)
    budget = context_budget(frame, target_length, max_new_tokens)
    size = max(100, target_length // params.vocab_per_tokens)
    vocab = [params.noise_word] + coded_vocab(params, size, rng)
    word_ids = ctx.encoder.encode_many([" " + w for w in vocab], cache=False)
    word_len = np.array([len(ids) for ids in word_ids])
    rank = np.arange(1, len(vocab) + 1, dtype=np.float64)
    share = rank ** -params.alpha / zeta(params.alpha)

    def counts(num_words: int) -> np.ndarray:
        return (num_words * share).astype(np.int64)

    lo, hi = 0, 1
    while int(counts(hi) @ word_len) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if int(counts(mid) @ word_len) <= budget else (lo, mid)
    cnt = counts(lo)
    gap = budget - int(cnt @ word_len)
    # Fill the gap with single occurrences of unused words: they cannot change the top three.
    for i in np.flatnonzero(cnt == 0):
        if gap <= 0:
            break
        if word_len[i] <= gap:
            cnt[i] = 1
            gap -= int(word_len[i])
    if len(cnt) < 5 or not cnt[3] > cnt[4]:
        raise LengthError(
            f"fwe at {target_length}: too few words for a distinct top three; use a larger suite.lengths value"
        )
    occurrences = np.repeat(np.arange(len(vocab)), cnt)
    occurrences = occurrences[rng.permutation(len(occurrences))]
    text = " " + " ".join(np.asarray(vocab, dtype=object)[occurrences].tolist())
    context = open_context(ctx.encoder, frame, Piece(text, ragged_take(word_ids, occurrences)))
    return draft(
        frame, context, vocab[1:4],
        complexity=f"alpha{params.alpha}",
        meta={"num_words": int(cnt.sum()), "top_counts": [int(c) for c in cnt[:5]]},
    )
