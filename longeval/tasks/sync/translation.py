"""SYNC §3.2 and §4: three translation tasks between unseen languages, on one shared context.

Each of 3, 5 or 7 languages (LL0, LL1, ...) has a vocabulary of 250 words of 3 to 7 random letters; a
dictionary of 50 word-to-word entries maps each language to the next (LL0 -> LL1 -> LL2 ...). The entries
form 50 chains, so every dictionary word of LL0 has one translation in every later language. The context
repeats the vocabularies as haystack (one per line, words shuffled each time) and states each dictionary
exactly once, in order, between two vocabulary lines. Three tasks share it:

- single_hop_translation (retrieval): translate a phrase of 2 to 5 words between consecutive languages.
- multi_hop_translation (tracking): translate a phrase across two or more dictionaries (e.g. LL0 -> LL2).
- letter_coverage (global understanding): name three LL0 words whose translations' first letters, over
  every other language, cover the most distinct letters; scored by the size of that union.

Vocabularies are disjoint across languages, so a word names its language. Language sets are drawn per
(`dataset_seed`, number of languages, slot), shared by every length like the graphs of the graph domain;
`dataset_seed=None` draws them from `context_rng`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext, draft
from longeval.tasks.sync.layout import Layout, Rows, fit, insert, shared_budget, too_short
from longeval.tasks.sync.prompts import (
    DICTIONARY,
    DICTIONARY_ENTRY,
    TRANSLATION_HEAD,
    VOCABULARY_HEADER,
    answer_prefix,
    language_name,
    prompt_fingerprint,
    user_text,
)
from longeval.text.render import Frame

TRANSLATION_TASKS = ("single_hop_translation", "multi_hop_translation", "letter_coverage")
COVERAGE_WORDS = 3
_STREAM_TAG = 0x53594E4354  # "SYNCT"
_TAIL_SLACK = 2
"""Tokens kept back beyond the widest estimated translation question, for tokenizers that merge across words."""


@dataclass(frozen=True)
class TranslationParams:
    """The paper's translation configuration (§4)."""

    num_languages: tuple[int, ...] = (3, 5, 7)
    """Languages per set; instance `i` uses `num_languages[i % len(num_languages)]`."""
    vocabulary_size: int = 250
    """Words per language."""
    word_length: tuple[int, int] = (3, 7)
    """Fewest and most letters in a word (uniform)."""
    dictionary_size: int = 50
    """Entries in each dictionary between consecutive languages."""
    phrase_length: tuple[int, int] = (2, 5)
    """Fewest and most words in a phrase to translate (the paper: more than one word, at most five)."""
    cot: bool = True
    """Zero-shot chain-of-thought (the paper's main setting); False prefills the answer label (§5.2)."""
    dataset_seed: int | None = 0
    """Seeds the language sets shared by every length and run seed; None: drawn from `context_rng`."""

    def __post_init__(self) -> None:
        lo, hi = self.word_length
        p_lo, p_hi = self.phrase_length
        problems = []
        if not self.num_languages or any(int(n) < 3 for n in self.num_languages):
            problems.append(f"num_languages must be counts >= 3 (multi-hop needs two dictionaries), "
                            f"got {self.num_languages!r}")
        if not 1 <= lo <= hi:
            problems.append(f"word_length must be (fewest, most) letters with 1 <= fewest <= most, got {lo, hi}")
        if not COVERAGE_WORDS <= self.dictionary_size <= self.vocabulary_size:
            problems.append(f"dictionary_size must be between {COVERAGE_WORDS} and vocabulary_size, "
                            f"got {self.dictionary_size}")
        if not 1 <= p_lo <= p_hi <= self.dictionary_size:
            problems.append(f"phrase_length must be (fewest, most) words within the dictionary, got {p_lo, p_hi}")
        if max(self.num_languages or (0,)) * self.vocabulary_size > 26**hi // 4:
            problems.append("vocabulary_size is too large for the word lengths; allow longer words")
        if problems:
            raise ConfigError("sync translation parameters: " + "; ".join(problems))


# -- languages ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Languages:
    """Vocabularies (one per language) and the dictionary chains: `chains[k][l]` is entry k in language l."""

    vocabularies: tuple[tuple[str, ...], ...]
    chains: tuple[tuple[str, ...], ...]

    @property
    def num_languages(self) -> int:
        return len(self.vocabularies)

    def dictionary(self, source: int) -> list[tuple[str, str]]:
        """The entries from language `source` to `source + 1`."""
        return [(chain[source], chain[source + 1]) for chain in self.chains]

    @cached_property
    def _slot(self) -> dict[str, int]:
        return {word: k for k, chain in enumerate(self.chains) for word in chain}

    def translate(self, words: list[str], target: int) -> list[str]:
        """Follow the dictionaries from each word's language to language `target`."""
        return [self.chains[self._slot[w]][target] for w in words]


def random_words(count: int, word_length: tuple[int, int], rng: np.random.Generator) -> list[str]:
    """`count` distinct words of random lower-case letters, lengths uniform in `word_length`."""
    lo, hi = word_length
    there = sum(26**n for n in range(max(lo, 1), hi + 1))
    if count > there // 2:  # drawing near the whole space would take ages, past it forever
        raise ConfigError(f"suite.params: word_length={list(word_length)} gives {there:,} distinct words, too few "
                          f"for the {count:,} this translation needs (at most half of them are drawn); use longer "
                          "words")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:  # ends: at most half the space is asked for, so the longest draws are mostly new
        draw = count - len(words) + 8
        lengths = rng.integers(lo, hi + 1, size=draw)
        letters = (rng.integers(0, 26, size=(draw, hi)) + ord("a")).astype(np.uint8)
        for length, row in zip(lengths.tolist(), letters, strict=True):
            word = row[:length].tobytes().decode("ascii")
            if word not in seen and len(words) < count:
                seen.add(word)
                words.append(word)
    return words


def make_languages(num_languages: int, params: TranslationParams, rng: np.random.Generator) -> Languages:
    """Disjoint vocabularies and `dictionary_size` chains of one word per language."""
    size = params.vocabulary_size
    words = random_words(num_languages * size, params.word_length, rng)
    vocabularies = tuple(tuple(words[i * size : (i + 1) * size]) for i in range(num_languages))
    picks = [rng.choice(size, size=params.dictionary_size, replace=False) for _ in range(num_languages)]
    chains = tuple(
        tuple(vocabularies[lang][int(picks[lang][k])] for lang in range(num_languages))
        for k in range(params.dictionary_size)
    )
    return Languages(vocabularies, chains)


def instance_languages(params: TranslationParams, index: int, context_rng: np.random.Generator) -> Languages:
    """The language set of instance `index`: from (`dataset_seed`, languages, slot), or from `context_rng`."""
    n = int(params.num_languages[index % len(params.num_languages)])
    if params.dataset_seed is None:
        return make_languages(n, params, context_rng)
    slot = index // len(params.num_languages)
    return make_languages(n, params, np.random.default_rng([params.dataset_seed, _STREAM_TAG, n, slot]))


# -- letter coverage ------------------------------------------------------------------------------------


def letter_masks(languages: Languages) -> np.ndarray:
    """Per chain, the first letters of its translations (languages 1..n-1) as a 26-bit mask."""
    masks = np.zeros(len(languages.chains), dtype=np.uint32)
    for k, chain in enumerate(languages.chains):
        for word in chain[1:]:
            masks[k] |= np.uint32(1 << (ord(word[0]) - ord("a")))
    return masks


def _popcount(x: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    x = x.astype(np.uint64)
    count = np.zeros(x.shape, dtype=np.uint8)
    while np.any(x):
        count += (x & 1).astype(np.uint8)
        x >>= 1
    return count


def best_coverage(masks: np.ndarray) -> tuple[int, tuple[int, int, int]]:
    """The largest union of three distinct masks, and the first triple (lexicographic) reaching it.

    One vectorised (j, k) plane per first index i: O(m^3 / 3) bit operations, no Python loop over triples
    (about a millisecond for the paper's 50 entries).
    """
    m = len(masks)
    best, triple = -1, (0, 1, 2)
    for i in range(m - 2):
        rest = masks[i + 1 :]
        plane = _popcount((masks[i] | rest)[:, None] | rest[None, :]).astype(np.int16)
        plane[np.tril_indices(len(rest))] = -1  # keep k > j
        flat = int(np.argmax(plane))
        value = int(plane.flat[flat])
        if value > best:
            j, k = divmod(flat, len(rest))
            best, triple = value, (i, i + 1 + j, i + 1 + k)
    return best, triple


def coverage_of(languages: Languages, words: list[str]) -> int:
    """How many distinct first letters the translations of `words` have (words without one add none)."""
    letters = set()
    for word in words:
        k = languages._slot.get(word)
        if k is not None and languages.chains[k][0] == word:
            letters.update(w[0] for w in languages.chains[k][1:])
    return len(letters)


# -- context --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    rows: Rows
    n: int  # languages
    v: int  # words per language

    def header(self, lang: np.ndarray | int) -> np.ndarray | int:
        return lang

    def comma(self, lang: np.ndarray | int, word: np.ndarray | int) -> np.ndarray | int:
        return self.n + lang * self.v + word

    def period(self, lang: np.ndarray | int, word: np.ndarray | int) -> np.ndarray | int:
        return self.n + self.n * self.v + lang * self.v + word

    def dictionary(self, source: int) -> int:
        return self.n + 2 * self.n * self.v + source


def _table(ctx: GenContext, languages: Languages) -> _Table:
    """Rows: vocabulary headers, every word followed by "," and by ".", then the dictionaries."""
    n, v = languages.num_languages, len(languages.vocabularies[0])
    headers = [VOCABULARY_HEADER.format(language=language_name(i)) for i in range(n)]
    commas = [f" {w}," for vocab in languages.vocabularies for w in vocab]
    periods = [f" {w}." for vocab in languages.vocabularies for w in vocab]
    dictionaries = [
        DICTIONARY.format(source=language_name(i), target=language_name(i + 1),
                          entries="; ".join(DICTIONARY_ENTRY.format(source=a, target=b)
                                            for a, b in languages.dictionary(i)))
        for i in range(n - 1)
    ]
    # The dictionary order is the order of the chains: already random, as the chains were drawn at random.
    ids = ctx.encoder.encode_many(headers) + ctx.encoder.encode_many(commas + periods + dictionaries, cache=False)
    return _Table(Rows.of(headers + commas + periods + dictionaries, ids), n, v)


def _vocabulary_lines(table: _Table, budget: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Vocabulary lines (LL0, LL1, ... in turn, words shuffled each time) within `budget` tokens, and the
    positions where a line starts (where a dictionary may go). The last line may be cut short; it then
    ends with a period."""
    n, v, lengths = table.n, table.v, table.rows.lengths
    words = np.arange(v)
    shortest_line = min(
        int(lengths[table.header(i)]) + int(np.minimum(lengths[table.comma(i, words)],
                                                       lengths[table.period(i, words)]).sum())
        for i in range(n)
    )
    count = budget // shortest_line + 2
    langs = np.arange(count) % n
    order = np.argsort(rng.random((count, v)), axis=1)
    lines = np.empty((count, v + 1), dtype=np.int64)
    lines[:, 0] = langs
    lines[:, 1:v] = table.comma(langs[:, None], order[:, :-1])
    lines[:, v] = table.period(langs, order[:, -1])
    flat = lines.ravel()
    total = np.cumsum(lengths[flat])
    k = int(np.searchsorted(total, budget, side="right"))
    seq = flat[:k].copy()
    if len(seq) and seq[-1] < n:  # a vocabulary header with no words
        seq = seq[:-1]
    if len(seq) and seq[-1] < table.period(0, 0):  # a cut line: end it with a period when that fits
        period = seq[-1] + n * v
        used = int(lengths[seq].sum())
        if used - lengths[seq[-1]] + lengths[period] <= budget:
            seq[-1] = period
    starts = np.arange(0, len(seq) + 1, v + 1)
    if starts[-1] != len(seq):
        starts = np.append(starts, len(seq))
    return seq, starts


def translation_layout(table: _Table, budget: int, seed: int, target_length: int) -> Layout:
    """The context within `budget` tokens; `fact_starts[i]` is where dictionary LL{i} -> LL{i+1} starts."""
    dictionaries = np.array([table.dictionary(i) for i in range(table.n - 1)], dtype=np.int64)
    fixed = int(table.rows.lengths[dictionaries].sum())
    if fixed > budget:
        raise too_short(f"the {len(dictionaries)} dictionaries", fixed, budget, target_length)
    rng = np.random.default_rng(seed)
    haystack, line_starts = _vocabulary_lines(table, budget - fixed, rng)
    slots = np.sort(rng.choice(line_starts, size=len(dictionaries), replace=True))
    return insert(table.rows, haystack, dictionaries, slots)


# -- prompts --------------------------------------------------------------------------------------------


def _frame(ctx: GenContext, task: str, cot: bool, **fields: object) -> Frame:
    return ctx.frame(user_text(TRANSLATION_HEAD, task, cot=cot, **fields), answer_prefix(task, cot=cot))


def _widest_phrases(ctx: GenContext, languages: Languages, words: int) -> list[str]:
    """Per language, the phrase of `words` dictionary words that takes the most tokens in a question."""
    phrases = []
    for lang in range(languages.num_languages):
        vocab = [chain[lang] for chain in languages.chains]
        bare = [len(ids) for ids in ctx.encoder.encode_many(vocab, cache=False)]
        spaced = [len(ids) for ids in ctx.encoder.encode_many([" " + w for w in vocab], cache=False)]
        first = int(np.argmax(bare))
        rest = sorted((k for k in range(len(vocab)) if k != first), key=lambda k: -spaced[k])[: words - 1]
        phrases.append(" ".join(vocab[k] for k in [first, *rest]))
    return phrases


def widest_frames(ctx: GenContext, languages: Languages, params: TranslationParams) -> list[Frame]:
    """The frames of the three tasks with their widest possible questions for this language set."""
    n = languages.num_languages
    phrases = _widest_phrases(ctx, languages, params.phrase_length[1])
    frames = [_frame(ctx, "letter_coverage", params.cot)]
    for task, pairs in (("single_hop_translation", single_hop_pairs(n)), ("multi_hop_translation",
                                                                          multi_hop_pairs(n))):
        frames += [_frame(ctx, task, params.cot, phrase=phrases[s], source=language_name(s),
                          target=language_name(t)) for s, t in pairs]
    return frames


# -- queries and generators -----------------------------------------------------------------------------


def single_hop_pairs(n: int) -> list[tuple[int, int]]:
    return [(s, s + 1) for s in range(n - 1)]


def multi_hop_pairs(n: int) -> list[tuple[int, int]]:
    return [(s, t) for s in range(n) for t in range(s + 2, n)]


@dataclass(frozen=True)
class _Query:
    fields: dict[str, str]
    references: list[str]
    facts: list[int]  # dictionaries the answer rests on, for the depth
    meta: dict[str, Any]


def _phrase_query(pairs: list[tuple[int, int]], languages: Languages, params: TranslationParams,
                  rng: np.random.Generator) -> _Query:
    source, target = pairs[int(rng.integers(len(pairs)))]
    lo, hi = params.phrase_length
    slots = rng.choice(len(languages.chains), size=int(rng.integers(lo, hi + 1)), replace=False)
    phrase = [languages.chains[int(k)][source] for k in slots]
    reference = " ".join(languages.translate(phrase, target))
    return _Query(
        {"phrase": " ".join(phrase), "source": language_name(source), "target": language_name(target)},
        [reference], list(range(source, target)),
        {"source": language_name(source), "target": language_name(target), "phrase": " ".join(phrase),
         "hops": target - source},
    )


def _query(task: str, languages: Languages, params: TranslationParams, rng: np.random.Generator) -> _Query:
    n = languages.num_languages
    if task == "single_hop_translation":
        return _phrase_query(single_hop_pairs(n), languages, params, rng)
    if task == "multi_hop_translation":
        return _phrase_query(multi_hop_pairs(n), languages, params, rng)
    optimum, triple = best_coverage(letter_masks(languages))
    best = [languages.chains[k][0] for k in triple]
    return _Query({}, [", ".join(best)], [], {
        "optimum": optimum, "best": best,
        "chains": [list(chain) for chain in languages.chains],
        "source_vocabulary": list(languages.vocabularies[0]),
    })


def _generate(
    task: str, ctx: GenContext, params: TranslationParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    # context_rng is consumed in the same order by the three tasks: the languages, then the layout seed.
    languages = instance_languages(params, index, context_rng)
    layout_seed = int(context_rng.integers(2**63))
    query = _query(task, languages, params, rng)
    frame = _frame(ctx, task, params.cot, **query.fields)
    budget = shared_budget(widest_frames(ctx, languages, params), target_length, max_new_tokens,
                           slack=_TAIL_SLACK)
    table = _table(ctx, languages)
    layout = fit(ctx, frame, budget, lambda b: translation_layout(table, b, layout_seed, target_length))
    meta = {
        "task": task, "domain": "translation", "num_languages": languages.num_languages, "cot": params.cot,
        "answer_prefix": frame.answer_prefix, "prompt_fingerprint": prompt_fingerprint(), **query.meta,
    }
    return draft(frame, layout.context, query.references, depth=layout.depth(query.facts),
                 complexity=f"languages={languages.num_languages}", meta=meta)


def generate_single_hop_translation(
    ctx: GenContext, params: TranslationParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Single-hop Translation (retrieval): one dictionary, looked up word by word."""
    return _generate("single_hop_translation", ctx, params, target_length=target_length,
                     max_new_tokens=max_new_tokens, rng=rng, index=index, context_rng=context_rng)


def generate_multi_hop_translation(
    ctx: GenContext, params: TranslationParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Multi-hop Translation (tracking): a chain of dictionaries, keeping every intermediate translation."""
    return _generate("multi_hop_translation", ctx, params, target_length=target_length,
                     max_new_tokens=max_new_tokens, rng=rng, index=index, context_rng=context_rng)


def generate_letter_coverage(
    ctx: GenContext, params: TranslationParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Letter Coverage (global understanding): three LL0 words whose translations start with the most letters."""
    return _generate("letter_coverage", ctx, params, target_length=target_length,
                     max_new_tokens=max_new_tokens, rng=rng, index=index, context_rng=context_rng)
