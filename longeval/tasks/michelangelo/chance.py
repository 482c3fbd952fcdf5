"""Chance rates (Appendix B): what a model that guesses scores, to read every curve against.

The paper's random models, simulated on our generators with a fixed seed:
- Latent List (B.1): a `len` guess is uniform in 0..complexity against a true length uniform in the same
  range; for the other views the guesser builds a list from a random subset of the numbers in the
  relevant operations and of the initial list, shuffled, then answers `print`/`sum` with a random slice of
  it and `min`/`max` with a random element of it. Averaged over complexities (and views) equally.
- MRCR (B.1.1): the output is the random string and a writing chosen uniformly from the conversation
  ("any"), from the writings sharing the asked topic or format ("related"), or from the needles alone
  ("same_key", DeepMind's second noise model).
- IDK (B.2): a uniform guess among four choices scores 25 %. Note that answering "I don't know" every
  time scores 70 %, the share of unanswerable questions.

Our numbers differ from the paper's because the operations, writings and filler are ours (and MRCR's
"any" depends on how many filler turns the conversation holds); `docs/tasks/michelangelo.md` lists both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from longeval.tasks.michelangelo import latent_list as ll
from longeval.tasks.michelangelo import mrcr as mr
from longeval.tasks.michelangelo.idk import IdkParams
from longeval.tasks.michelangelo.writings import WritingPool, load_openai_pool, procedural_pool

PAPER_CHANCE = {
    "latent_list": 0.122,
    "latent_list_by_complexity": {1: 0.169, 5: 0.113, 20: 0.085},
    "mrcr_any_writing": mr.PAPER_CHANCE["any_writing"],
    "mrcr_topic_or_format": mr.PAPER_CHANCE["topic_or_format"],
    "idk": 0.25,
}
"""Appendix B's chance rates as printed."""
MRCR_NOISE_FLOORS = mr.NOISE_FLOORS
MRCR_MODELS = ("any", "related", "same_key")


@dataclass(frozen=True)
class ChanceRate:
    """A simulated chance rate, overall and by the instance configuration it varies with."""

    overall: float
    by_complexity: dict[int, float] = field(default_factory=dict)
    by_view: dict[str, float] = field(default_factory=dict)


def latent_list_chance(params: ll.LatentListParams | None = None, *, samples: int = 600,
                       seed: int = 0) -> ChanceRate:
    """Appendix B.1's random model on our operations: `samples` instances per (complexity, view)."""
    params = params or ll.LatentListParams()
    rng = np.random.default_rng(seed)
    cells: dict[tuple[int, str], float] = {}
    for complexity in params.complexities:
        for view in params.views:
            total = 0.0
            for _ in range(samples):
                total += _latent_list_guess(rng, int(complexity), view, params)
            cells[(int(complexity), view)] = total / samples
    by_complexity = {c: float(np.mean([v for (cc, _), v in cells.items() if cc == c])) for c in params.complexities}
    by_view = {w: float(np.mean([v for (_, ww), v in cells.items() if ww == w])) for w in params.views}
    return ChanceRate(float(np.mean(list(cells.values()))), by_complexity, by_view)


def _latent_list_guess(rng: np.random.Generator, complexity: int, view: str, params: ll.LatentListParams) -> float:
    if view == "len":
        guess, truth = int(rng.integers(0, complexity + 1)), int(rng.integers(0, complexity + 1))
        return ll.latent_list_metric(guess, str(truth), view)
    ops, values = ll.relevant_ops(rng, complexity, low=params.low, high=params.high)
    start, stop = ll.choose_slice(rng, len(values))
    target = ll.view_answer(values, view, start, stop)
    numbers = sorted({op[1][-1] for op in ops if op[0] in ("append", "insert", "remove")})
    keep = [x for x in numbers if rng.random() < 0.5] + [x for x in ll.INITIAL if rng.random() < 0.5]
    guess = [keep[i] for i in rng.permutation(len(keep))]
    if not guess:
        return 0.0
    if view in ("min", "max"):
        return ll.latent_list_metric(guess[int(rng.integers(len(guess)))], target, view)
    i, j = ll.choose_slice(rng, len(guess))
    answer: object = str(guess[i:j]) if view == "print" else sum(guess[i:j])
    return ll.latent_list_metric(answer, target, view)


def _pool(params: mr.MrcrParams) -> WritingPool:
    if params.pool_path:
        return load_openai_pool(params.pool_path, revision=params.pool_revision or "",
                                max_writings=params.pool_max_writings)
    return procedural_pool()


def mrcr_chance(params: mr.MrcrParams | None = None, *, model: str = "related", samples: int = 300,
                filler_turns: int = 64, seed: int = 0) -> ChanceRate:
    """A random writing from the conversation, answered in the right format, scored by `params.grading`.

    Args:
        model: "any" (any writing of a conversation with `filler_turns` filler turns), "related" (sharing
            the asked topic or format: needles and near misses) or "same_key" (needles only).
    """
    if model not in MRCR_MODELS:
        raise ValueError(f"model must be one of {MRCR_MODELS}, got {model!r}")
    params = params or mr.MrcrParams()
    pool = _pool(params)
    keys = sorted(k for k, idx in pool.by_key.items() if len(idx) >= max(params.needles))
    formats = np.array([w.format for w in pool.writings])
    topics = np.array([w.topic for w in pool.writings])
    rng = np.random.default_rng(seed)
    scores: dict[int, list[float]] = {int(n): [] for n in params.needles}
    for s in range(samples):
        n = int(params.needles[s % len(params.needles)])
        fmt, topic = keys[int(rng.integers(len(keys)))]
        own = pool.by_key[(fmt, topic)]
        needles = [own[i] for i in rng.choice(len(own), size=n, replace=False)]
        near_f = np.flatnonzero((formats == fmt) & (topics != topic))
        near_t = np.flatnonzero((formats != fmt) & (topics == topic))
        m_t = min(params.near_misses // 2, len(near_t))
        m_f = min(params.near_misses - m_t, len(near_f))
        near = [int(x) for x in rng.choice(near_f, size=m_f, replace=False)]
        near += [int(x) for x in rng.choice(near_t, size=m_t, replace=False)]
        filler = np.flatnonzero((formats != fmt) & (topics != topic))
        pick = {"same_key": needles, "related": needles + near,
                "any": needles + near + [int(x) for x in rng.choice(filler, size=filler_turns)]}[model]
        target = pool.writings[needles[int(rng.integers(n))]].text
        guess = pool.writings[pick[int(rng.integers(len(pick)))]].text
        rs = mr.random_string(rng, params.random_string_length)
        judged = mr.score_mrcr(f"{rs} {guess}", [target], {"random_string": rs, "grading": params.grading})
        scores[n].append(judged.score)
    by_needles = {n: float(np.mean(v)) for n, v in scores.items() if v}
    return ChanceRate(float(np.mean([x for v in scores.values() for x in v])), by_needles)


def idk_chance(params: IdkParams | None = None) -> float:
    """Appendix B.2: one of four choices at random."""
    return 0.25


def idk_always_unknown(params: IdkParams | None = None) -> float:
    """The score of a model that always answers "I don't know": the share of unanswerable questions."""
    return (params or IdkParams()).unknown_per_10 / 10


def chance_table(tasks: list[str]) -> pa.Table:
    """The chance rate of each Michelangelo task in a run, ours beside the paper's, ×100 like the scores.

    A report prints these next to the scores: a Latent List score of 25 is what guessing gets here.
    """
    ours = {
        "latent_list": (latent_list_chance().overall, PAPER_CHANCE["latent_list"],
                        "random list built from the context's numbers (B.1)"),
        "mrcr": (mrcr_chance(model="related").overall, PAPER_CHANCE["mrcr_topic_or_format"],
                 "a random writing sharing the asked topic or format (B.1.1)"),
        "idk": (idk_chance(), PAPER_CHANCE["idk"], "one of four choices at random (B.2)"),
    }
    rows = [{"task": t, "chance": round(100 * ours[t][0], 2), "paper": round(100 * ours[t][1], 2),
             "model": ours[t][2]} for t in tasks if t in ours]
    return pa.Table.from_pylist(rows, schema=pa.schema([("task", pa.string()), ("chance", pa.float64()),
                                                        ("paper", pa.float64()), ("model", pa.string())]))
