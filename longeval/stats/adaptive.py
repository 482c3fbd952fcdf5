"""Adaptive length sweeps: anytime-valid confidence bounds, per-cell decisions and the next round's allocation.

Pure functions, no Ray and no I/O: `longeval.run.adaptive_rounds` feeds them the scores on disk, and
`benchmarks/adaptive.py` replays them on recorded or synthetic scores.

The bounds are betting confidence sequences of Waudby-Smith & Ramdas, "Estimating means of bounded random
variables by betting", JRSS-B 86(1), 2024 (arXiv:2010.09686), with their diversified-Kelly (dKelly) capital: a
bettor who claims the mean exceeds a candidate m splits her wealth over constant fractions f_d of the largest
safe bet,

    K_t(m) = (1/D) sum_d prod_{i<=t} (1 + f_d (X_i - m_i) / m_i),   f_d = d / (D + 1),  d = 1..D,

and the bettor on the other side does the same with (m_i - X_i) / (1 - m_i). (A group's column averages use
fractions packed towards the largest bet, `column_fractions`: their variance is about 1/k of one task's.)
m_i is what X_i's conditional mean would be if the mean were m: m itself for i.i.d. scores; for scores drawn in
a uniformly random order without replacement from the N instances of a full sweep's cell (an adaptive run's
shuffled cell), the mean the instances not yet drawn would need, (N m - X_1 - ... - X_{i-1}) / (N - i + 1)
(Waudby-Smith & Ramdas, "Confidence sequences for sampling without replacement", NeurIPS 2020). If the mean is
m or less, every term is a nonnegative supermartingale (the bets are >= 0 and E[X_i - m_i | past] <= 0), so by
Ville's inequality

    P(for some t: K_t(m) >= 1 / alpha) <= alpha   for every m at or above the mean,

and m is ruled out as a lower bound once its capital reaches 1 / alpha: the lower confidence sequence. The upper
one is the mirror image. Each bound holds at every t at once with probability >= 1 - alpha, so a cell may be
looked at after every round and stopped whenever a bound clears the threshold (optional stopping) without
inflating the error. A cell is decided `above` when its lower bound passes the threshold: if its mean is in fact
at or below it, that needs the lower bound to be wrong, probability <= alpha; `below` likewise. So each decision
is wrong with probability <= alpha; the two bounds together cover the mean with probability >= 1 - 2 alpha.
Without replacement "the mean" is the full sweep's score of the cell, known exactly once all N are drawn.

Why this capital (benchmarks/README.md has the replays): a decision needs only the bound on its own side, and a
one-sided bettor never loses wealth betting the wrong way; mixing constant bets (a Bayes mixture of alternatives
for 0/1 scores) learns the growth-optimal bet with log(n) regret, which matters for cells near the threshold,
the ones that cost. Against the two-sided aGRAPA sequence used before, the gradual-decline profile at rounds
of 10 spends 8.9 % of the full sweep's tokens instead of 10.1 %, with the same effective length.

The capital is decreasing in m (increasing for the upper bettor), so the excluded candidates form an interval
and each bound is found by bisection; bounds are reported rounded outward to a step of 1/1000. k cells' bounds
all hold at once with probability >= 1 - k * alpha (union bound), so a task's alpha is split over its lengths
(Settings.per_task): its effective length, which needs all of them right, is then wrong with probability <= alpha.
Group bounds split it further over the member tasks.

A decision is about the full sweep's score; where that score is itself within its sampling noise of the threshold
(`near_threshold`), the cell and any effective length it could move are flagged rather than passed off as firm.

One module, though over 600 lines: the group targets' bounds (its last section) are this same betting sequence run
on column averages, with the same `Settings`, fractions, bisection and decisions, and the derivation above is theirs
too; apart, each half would import the other's private pieces.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

__all__ = [
    "ABOVE",
    "BELOW",
    "PRESUMED_BELOW",
    "UNDECIDED",
    "CellState",
    "EffectiveLength",
    "FRACTIONS",
    "GroupState",
    "Settings",
    "assess",
    "assess_group",
    "bound",
    "column_fractions",
    "crossed",
    "side",
    "effective_length",
    "group_effective_length",
    "interval",
    "near_threshold",
    "noise_band",
    "log_capital",
    "next_group_round",
    "next_round",
    "stratified_bound",
    "stratified_columns",
    "stratified_interval",
    "stratified_side",
]

ABOVE = "above"
BELOW = "below"
UNDECIDED = "undecided"
PRESUMED_BELOW = "presumed_below"
"""Above the task's first confidently failed length, one confirmation round showed a mean under the threshold:
sampling stopped there without a decision (reported as such, never as a confident `below`)."""

UP, DOWN = 1, -1
"""The two bettors: UP claims the mean exceeds m (gives the lower bound), DOWN that it is below (the upper)."""

FRACTIONS = np.arange(1, 31) / 31
"""dKelly's constant bets, as fractions of the largest bet that keeps wealth nonnegative (1/m up, 1/(1-m) down)."""
_STEP = 0.001


def _scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(scores, dtype=np.float64)
    if np.any((x < 0) | (x > 1)):
        raise ValueError("the confidence sequence needs scores in [0, 1]")
    return x


def null_means(x: np.ndarray, m: float, population: int | None) -> np.ndarray:
    """What each observation's conditional mean would be if the mean were `m`: `m` itself for i.i.d. draws; for
    draws without replacement from `population` instances of mean m, the mean of those not yet drawn,
    (population * m - sum so far) / (instances left), as in Waudby-Smith & Ramdas, "Confidence sequences for
    sampling without replacement", NeurIPS 2020."""
    if population is None:
        return np.full(x.shape, float(m))
    n = x.shape[-1]
    if n > population:
        raise ValueError(f"{n} scores drawn without replacement from {population} instances")
    before = np.cumsum(x, axis=-1) - x
    return (population * m - before) / (population - np.arange(n))


def log_capital(scores: Sequence[float] | np.ndarray, m: float, *, side: int,
                population: int | None = None, fractions: np.ndarray = FRACTIONS) -> np.ndarray:
    """Log of the dKelly capital of betting that the mean is above (`side=UP`) or below (`DOWN`) the candidate
    `m` in (0, 1), after each observation; `scores` is (..., n), the result has the same shape.

    `population`: the scores are drawn in a uniformly random order without replacement from that many instances
    (an adaptive run's shuffled cell), and `m` is a candidate for their mean, the full sweep's score. The bettor
    then bets against the mean of the instances not yet drawn; a null that the draws have made impossible (the
    rest would need a mean below 0 or above 1) has infinite capital from that draw on.

    `fractions`: the constant bets the capital is spread over equally (the mixture's prior), fixed before any
    draw; dKelly's uniform grid unless a group's column averages are bet on (`column_fractions`)."""
    x = _scores(scores)
    mt = null_means(x, m, population)
    impossible = np.zeros(x.shape, dtype=bool)
    if population is not None:  # the draws so far already total more (less) than the whole cell could
        rest = population * m - np.cumsum(x, axis=-1)  # what the instances not yet drawn would have to total
        impossible = rest < -1e-9 if side == UP else rest > population - np.arange(1, x.shape[-1] + 1) + 1e-9
    if side == UP:
        step = np.where(mt > 0, (x - mt) / np.where(mt > 0, mt, 1.0), 0.0)
    else:
        step = np.where(mt < 1, (mt - x) / np.where(mt < 1, 1 - mt, 1.0), 0.0)
    total = np.full(x.shape, -np.inf)
    for fraction in fractions:  # each bet keeps at least 1 - fraction of the wealth: no log 0
        total = np.logaddexp(total, np.cumsum(np.log1p(fraction * step), axis=-1))
    total = total - math.log(len(fractions))
    return np.where(np.logical_or.accumulate(impossible, axis=-1), np.inf, total)


def crossed(scores: Sequence[float] | np.ndarray, m: float, *, alpha: float, side: int,
            population: int | None = None, fractions: np.ndarray = FRACTIONS) -> np.ndarray:
    """Whether the `side` bettor against `m` has reached 1 / alpha by each observation (once out, out for good):
    for UP, `m` is below the lower bound; for DOWN, above the upper bound."""
    logk = log_capital(scores, m, side=side, population=population, fractions=fractions)
    return np.logical_or.accumulate(logk >= math.log(1 / alpha), axis=-1)


def side(scores: Sequence[float] | np.ndarray, m: float, *, alpha: float, population: int | None = None,
         fractions: np.ndarray = FRACTIONS) -> int:
    """+1 when the lower bound has passed `m`, -1 when the upper bound has, else 0.

    Both can pass (the bounds crossed, a rare and valid outcome): the one that passed first decides, as it
    would have when the run stopped there."""
    x = _scores(scores)
    if x.size == 0:
        return 0
    first = {}
    for s in (UP, DOWN):
        hits = np.flatnonzero(crossed(x, m, alpha=alpha, side=s, population=population, fractions=fractions))
        if hits.size:
            first[s] = hits[0]
    return min(first, key=first.get) if first else 0


def bound(scores: Sequence[float] | np.ndarray, *, alpha: float, side: int, population: int | None = None,
          fractions: np.ndarray = FRACTIONS) -> float:
    """The lower (`side=UP`) or upper (`DOWN`) confidence bound after the last observation, rounded outward to
    1/1000: the edge of the candidates that bettor has ruled out (none: 0 or 1)."""
    x = _scores(scores)
    if x.size == 0:
        return 0.0 if side == UP else 1.0
    # ruled-out candidates form [0, edge) for UP and (edge, 1] for DOWN; bisect on the edge
    inside, out = (1.0, 0.0) if side == UP else (0.0, 1.0)
    for _ in range(24):  # to 1e-7, well inside the reported step
        mid = (inside + out) / 2
        if crossed(x, mid, alpha=alpha, side=side, population=population, fractions=fractions)[-1]:
            out = mid
        else:
            inside = mid
    if side == UP:
        return max(0.0, math.floor(inside / _STEP) * _STEP)
    return min(1.0, math.ceil(inside / _STEP) * _STEP)


def interval(scores: Sequence[float] | np.ndarray, *, alpha: float, population: int | None = None,
             fractions: np.ndarray = FRACTIONS) -> tuple[float, float]:
    """(lower bound, upper bound), each at 1 - alpha; (0, 1) when empty. Bounds that crossed (rare) give the
    last mean twice."""
    low = bound(scores, alpha=alpha, side=UP, population=population, fractions=fractions)
    high = bound(scores, alpha=alpha, side=DOWN, population=population, fractions=fractions)
    if low > high:
        mean = float(np.mean(scores))
        return mean, mean
    return low, high


COLUMN_POWER = 8.0
"""The power of `column_fractions` (benchmarks/README.md, "A prior for the column averages")."""


@dataclass(frozen=True)
class Settings:
    """What the procedure needs: threshold on the [0, 1] score scale, the per-cell error, the sizes."""

    threshold: float
    alpha: float = 0.05
    round_size: int = 25
    """New instances per undecided cell and round (a multiple of the shard size in a run)."""
    cap: int = 500
    """Most instances any cell gets (the full sweep's count); a cell still undecided there stays undecided."""
    length_caps: tuple[tuple[int, int], ...] = ()
    """(length, cap) pairs where a length's cap differs from `cap` (Michelangelo's stacked subsets)."""
    confirm: int = 25
    """Instances a cell above its task's first confidently failed length gets before the confirmation rule may
    stop it (a few instances of a cell at 97 % would show a mean under the threshold too often)."""
    intervals: bool = True
    """Compute each cell's bounds (a bisection each); decisions need only the capital at the threshold, so
    replays switch it off."""
    without_replacement: bool = True
    """A cell's scores come in a uniformly random order from its cap's instances (`suite.shuffle`, and every
    replay): the bounds are then for the full sweep's score of the cell, and tighten as the cell nears its cap.
    False: i.i.d. draws, the bounds for the mean of the task's instance distribution."""
    per_task: bool = True
    """Split alpha over a task's lengths (Bonferroni), so that all of a task's decisions, hence its effective
    length, are right at once with probability >= 1 - alpha. False: alpha per cell, k lengths near the threshold
    compound to k * alpha."""

    round_growth: float = 1.0
    """Round schedule: a cell (or a group's length) at n draws is brought to n + step, the step the largest
    multiple of `round_size` not above (round_growth - 1) * n, at least `round_size` and at most `round_max`.
    1.0: constant rounds of `round_size` (as before). Above 1, rounds start small (a length far from the
    threshold decides in a few draws) and grow geometrically for the lengths that stay open, so the number of
    rounds stays small; the bounds are anytime-valid, so the schedule (a function of n only) costs no validity."""
    round_max: int = 0
    """Largest step of the schedule (0: no limit); a multiple of `round_size`. Limits the overshoot past the
    draw where a long-open length (one near the threshold, the dearest) decides."""
    alpha_split: str = "equal"
    """How a task's (or group's) alpha is split over its lengths (Bonferroni, `per_task`): `equal`, alpha / k
    each; `length`, in proportion to the length (a proxy for the tokens one instance costs), fixed before any
    draw: the long, dear lengths get the larger share and decide sooner, the short ones cost little more. Either
    way the shares sum to alpha, so the effective length keeps its guarantee."""

    column_power: float = COLUMN_POWER
    """The prior of a group's bettors (`column_fractions`): how fast a group length decides. 1 is the uniform grid
    every group bet on before; a run root keeps the one it was sampled with (`suite.adaptive_column_power`), since
    switching bettors mid-run would be two tests, not one."""
    near_stop: bool = False
    """Group targets only: stop sampling a length, undecided and flagged `near_threshold`, once its stratified
    bounds both lie within the full sweep's own noise band of the threshold (`noise_band`): the full sweep's
    answer there is a coin flip, so the run reports the range a full sweep could give instead of paying to learn
    which side these instances fall on. Never changes a decision; off: such a length is sampled to its cap."""

    def cap_for(self, length: int) -> int:
        return dict(self.length_caps).get(length, self.cap)

    def schedule(self) -> dict[str, int | float | str | bool]:
        """How the run sampled, for its outputs (`compute.schedule` in adaptive.json): the first round's instances
        per cell (a group's length: per member task), the growth, the largest round (0: no limit), the alpha split
        and the near stop. A reader of the results needs them to know at which draws the bounds were looked at and
        what share of alpha each length's decision had. `column_power`: the prior of a group's bettors
        (`column_fractions`), which set how fast a group length decides."""
        return {"round_start": self.round_size, "growth": self.round_growth, "round_max": self.round_max,
                "alpha_split": self.alpha_split, "near_stop": self.near_stop, "column_power": self.column_power}

    def next_count(self, n: int, cap: int) -> int:
        """Draws a cell (or a group's length, in columns) at `n` draws has after its next round, never past `cap`
        (`round_growth`, `round_max`). A function of n only, so the same scores give the same rounds."""
        step = max(self.round_size, int((self.round_growth - 1) * n) // self.round_size * self.round_size)
        if self.round_max:
            step = min(step, max(self.round_size, self.round_max))
        return min(cap, n + step)

    def length_alphas(self, lengths: Collection[int]) -> dict[int, float]:
        """Each length's alpha within one task or group of these lengths (`per_task`, `alpha_split`)."""
        lengths = sorted(set(lengths))
        if not self.per_task:
            return dict.fromkeys(lengths, self.alpha)
        if self.alpha_split == "length":
            return {n: self.alpha * n / sum(lengths) for n in lengths}
        if self.alpha_split != "equal":
            raise ValueError(f"alpha_split={self.alpha_split!r}; choices: equal, length")
        return dict.fromkeys(lengths, self.alpha / len(lengths))

    def population(self, length: int) -> int | None:
        return self.cap_for(length) if self.without_replacement else None

    def cell_alpha(self, lengths: int) -> float:
        """Each bound's error in a task of `lengths` lengths."""
        return self.alpha / lengths if self.per_task else self.alpha


@dataclass(frozen=True)
class CellState:
    task: str
    length: int
    n: int
    mean: float | None
    low: float
    high: float
    decision: str
    """ABOVE / BELOW (the lower bound is above the threshold / the upper bound below), UNDECIDED, or
    PRESUMED_BELOW (confirmation rule)."""
    stopped: bool
    """No more instances: decided, at the cap, or stopped by the confirmation rule."""
    early: bool
    """Decided (above or below) before the cap."""
    confirmation: bool
    """Above the task's first confidently failed length: sampled only for confirmation unless it looks above."""
    beats_shorter: bool
    """Monotonicity flag: confidently above while a shorter length of the task is confidently below."""
    near_threshold: bool = False
    """Decided, but the threshold lies within the full sweep's own sampling noise of the score (see
    `near_threshold`): a full sweep with other instances could decide the other way."""


def assess(cells: Mapping[tuple[str, int], Sequence[float]], settings: Settings, *,
           memo: dict | None = None) -> list[CellState]:
    """Every cell's interval and decision from its scores so far (in the order drawn), sorted by task and length.

    `memo` (replays): a dict kept across calls whose cells only ever grow, so a cell seen with the same count
    is not recomputed.
    """
    lengths_of: dict[str, list[int]] = {}
    for task, length in cells:
        lengths_of.setdefault(task, []).append(length)
    alphas = {task: settings.length_alphas(lengths) for task, lengths in lengths_of.items()}
    base: dict[tuple[str, int], tuple[int, float | None, float, float, str, bool]] = {}
    for key, values in cells.items():
        values = np.asarray(values, dtype=np.float64)
        if memo is not None and (key, len(values)) in memo:
            base[key] = memo[(key, len(values))]
            continue
        alpha = alphas[key[0]][key[1]]
        population = settings.population(key[1])
        if population is not None and len(values) == population:  # every instance drawn: the score is known
            low = high = float(values.mean())
            decision = ABOVE if low > settings.threshold else BELOW  # RULER: a length counts when it exceeds it
        else:
            low, high = (interval(values, alpha=alpha, population=population) if settings.intervals
                         else (math.nan, math.nan))
            decision = {1: ABOVE, -1: BELOW, 0: UNDECIDED}[side(values, settings.threshold, alpha=alpha,
                                                                population=population)]
        near = decision in (ABOVE, BELOW) and near_threshold([values], settings.cap_for(key[1]), settings)
        base[key] = (len(values), float(values.mean()) if len(values) else None, low, high, decision, near)
        if memo is not None:
            memo[(key, len(values))] = base[key]
    out = []
    for task in sorted({t for t, _ in base}):
        lengths = sorted(n for t, n in base if t == task)
        failed = [n for n in lengths if base[(task, n)][4] == BELOW]
        first_failed = failed[0] if failed else None
        for length in lengths:
            n, mean, low, high, decision, near = base[(task, length)]
            cap = settings.cap_for(length)
            confirmation = first_failed is not None and length > first_failed
            if (confirmation and decision == UNDECIDED and n >= settings.confirm and mean is not None
                    and mean < settings.threshold and n < cap):
                decision = PRESUMED_BELOW
            decided = decision in (ABOVE, BELOW)
            out.append(CellState(
                task=task, length=length, n=n, mean=mean, low=low, high=high, decision=decision,
                stopped=decided or decision == PRESUMED_BELOW or n >= cap,
                early=decided and n < cap, confirmation=confirmation,
                beats_shorter=decision == ABOVE and first_failed is not None and length > first_failed,
                near_threshold=near))
    return out


def next_round(states: Sequence[CellState], settings: Settings) -> dict[tuple[str, int], int]:
    """New instances per cell for the next round: a round for every cell not stopped, never past the cap."""
    return {(s.task, s.length): settings.next_count(s.n, settings.cap_for(s.length)) - s.n
            for s in states if not s.stopped}


@dataclass(frozen=True)
class EffectiveLength:
    """The largest length whose score is above the threshold, as far as the intervals tell.

    `low`: the largest length confidently above (0: none); `high`: the largest length not (presumed) below
    (0: none). `value` is set only when they agree; otherwise the effective length is undecided.
    `noise_low`/`noise_high`: the same with the decisions within the full sweep's own sampling noise of the
    threshold (CellState.near_threshold) left open: the range a full sweep with other instances could land in.
    """

    low: int
    high: int
    noise_low: int = 0
    noise_high: int = 0

    @property
    def decided(self) -> bool:
        return self.low == self.high

    @property
    def value(self) -> int | None:
        return self.low if self.decided else None

    @property
    def near_threshold(self) -> bool:
        """Decided, but a near-threshold decision could move it."""
        return self.decided and not self.noise_low == self.low == self.noise_high


def effective_length(decisions: Mapping[int, str], near: Collection[int] = ()) -> EffectiveLength:
    """From the decisions per length of one task (or group); `near`: the lengths decided near the threshold."""
    def edges(d: Mapping[int, str]) -> tuple[int, int]:
        above = [n for n, x in d.items() if x == ABOVE]
        open_ = [n for n, x in d.items() if x not in (BELOW, PRESUMED_BELOW)]
        return max(above, default=0), max(open_, default=0)

    low, high = edges(decisions)
    noise = edges({n: UNDECIDED if n in near else x for n, x in decisions.items()})
    return EffectiveLength(low=low, high=high, noise_low=noise[0], noise_high=noise[1])


@dataclass(frozen=True)
class GroupLength:
    length: int
    mean: float | None
    low: float
    high: float
    decision: str


def group_effective_length(cells: Mapping[tuple[str, int], Sequence[float]], states: Sequence[CellState],
                           settings: Settings) -> tuple[list[GroupLength], EffectiveLength]:
    """A group's score per length (the mean of its tasks, as RULER's length score) with an interval, and its
    effective length. Each group bound averages the member cells' bounds on its side, each at alpha / (tasks in
    the group), and alpha split over the lengths as for a task (Settings.per_task), so the group's effective
    length is right with probability >= 1 - alpha. A length where a member cell was presumed below is presumed
    below. `near_threshold` flags the group's score per length as for a cell."""
    tasks = sorted({t for t, _ in cells})
    presumed = {s.length for s in states if s.decision == PRESUMED_BELOW and s.task in tasks}
    lengths = sorted({n for _, n in cells})
    alphas = settings.length_alphas(lengths)
    rows, near = [], set()
    for length in lengths:
        members = [np.asarray(cells.get((t, length), ()), dtype=np.float64) for t in tasks]
        low, high = _mean_interval(members, alpha=alphas[length] / len(tasks), population=settings.population(length))
        means = [float(m.mean()) for m in members if len(m)]
        mean = float(np.mean(means)) if len(means) == len(members) else None
        decision = _decide(low, high, settings.threshold)
        if decision == UNDECIDED and length in presumed:
            decision = PRESUMED_BELOW
        if decision in (ABOVE, BELOW) and near_threshold(members, settings.cap_for(length), settings):
            near.add(length)
        rows.append(GroupLength(length=length, mean=mean, low=low, high=high, decision=decision))
    return rows, effective_length({r.length: r.decision for r in rows}, near)


def noise_band(members: Sequence[np.ndarray], full: int, settings: Settings) -> float:
    """Half-width of the full sweep's own noise about a score (one cell, or the mean of a group's cells): the
    fixed-n, two-sided 1 - alpha normal interval of a mean over `full` instances per cell, with the spread
    estimated from the scores so far (0.25 per cell with fewer than two)."""
    spread = math.sqrt(sum(float(m.var(ddof=1)) if len(m) > 1 else 0.25 for m in members) / full) / len(members)
    return NormalDist().inv_cdf(1 - settings.alpha / 2) * spread


def near_threshold(members: Sequence[np.ndarray], full: int, settings: Settings) -> bool:
    """Whether the threshold lies within the full sweep's own sampling noise of this score (one cell, or the mean
    of a group's cells): inside the fixed-n, two-sided 1 - alpha normal interval of a mean over `full` instances
    per cell, with the spread estimated from the scores so far. A full sweep with other instances (another seed)
    could then land on the other side. A cell decided early is rarely near: its anytime bound cleared with fewer
    instances, which takes a mean further away."""
    if any(len(m) == 0 for m in members):
        return False
    mean = float(np.mean([m.mean() for m in members]))
    return abs(mean - settings.threshold) <= noise_band(members, full, settings)


def _mean_interval(members: Sequence[np.ndarray], *, alpha: float, population: int | None) -> tuple[float, float]:
    bounds = [(float(m.mean()),) * 2 if population is not None and len(m) == population  # the score is known
              else interval(m, alpha=alpha, population=population) for m in members]
    return float(np.mean([b[0] for b in bounds])), float(np.mean([b[1] for b in bounds]))


def _decide(low: float, high: float, threshold: float) -> str:
    return ABOVE if low > threshold else BELOW if high < threshold else UNDECIDED


# -- Group targets: one confidence sequence for the stratified mean of a group's tasks ------------------------------

def column_fractions(members: int, power: float = COLUMN_POWER) -> np.ndarray:
    """dKelly's fractions for a group's column averages: 1 - (1 - d/31)^p, d = 1..30, p = `power` for a group of
    two or more tasks (the uniform grid for one), at most 0.999.

    Why: the growth-optimal bet against the threshold m for a stream of variance s^2 and mean mu is about
    (mu - m) / s^2, and a column average of k tasks has about 1/k of a single task's variance, so for a group its
    optimal fraction of the largest safe bet sits near 1 unless mu is within a point of the threshold; the
    uniform grid, right for one task's 0/1 scores (a uniform prior over the alternative mean), then spends most
    of its wealth on bets too small. Any fixed mixture of constant bets in [0, 1) keeps the capital a nonnegative
    supermartingale under the null, so the prior changes only speed, never validity."""
    if members < 2:
        return FRACTIONS
    return np.minimum(1 - (1 - FRACTIONS) ** power, 0.999)


def _members(members: Sequence[Sequence[float] | np.ndarray]) -> int:
    return members.shape[-2] if isinstance(members, np.ndarray) else len(members)


def stratified_columns(members: Sequence[Sequence[float] | np.ndarray]) -> np.ndarray:
    """The column averages z_j = (1/k) sum_t x_{t,j} of k member tasks' j-th draws, j up to the fewest draws any
    member has (later draws of the others wait for theirs). Accepts (..., k, n) arrays as well (replays)."""
    if isinstance(members, np.ndarray):
        return _scores(members).mean(axis=-2)
    if not members:
        raise ValueError("a group needs at least one member task")
    n = min(len(m) for m in members)
    return _scores(np.stack([np.asarray(m, dtype=np.float64)[:n] for m in members])).mean(axis=0)


def stratified_side(members: Sequence[Sequence[float] | np.ndarray], m: float, *, alpha: float,
                    population: int | None = None) -> int:
    """`side` for the stratified mean (1/k) sum_t mu_t of k member tasks, each drawn in its own uniformly random
    order without replacement from `population` instances, bet on the column averages (`stratified_bound`)."""
    return side(stratified_columns(members), m, alpha=alpha, population=population,
                fractions=column_fractions(_members(members)))


def stratified_bound(members: Sequence[Sequence[float] | np.ndarray], *, alpha: float, side: int,
                     population: int | None = None) -> float:
    """Lower (`UP`) or upper (`DOWN`) anytime bound for the stratified mean of a group's tasks at one length, the
    group's full-sweep score (the mean of its tasks' scores, each task weighed equally as RULER's length score).

    Why a single sequence is valid: with every member drawn in equal rounds (the j-th draw of each task, each in
    its own uniformly random order without replacement from N instances), the conditional mean of the column
    average z_j given all earlier columns is (1/k) sum_t (N mu_t - S_t) / (N - j + 1) = (N mu - Z_{j-1}) /
    (N - j + 1), with Z_{j-1} = z_1 + ... + z_{j-1}: linear in the task means, so it depends on them only
    through their average mu. That is exactly the null mean of Waudby-Smith & Ramdas's without-replacement
    betting sequence (NeurIPS 2020) for the stream z_1, z_2, ... in [0, 1] with population N and mean mu, so the
    bettor's capital against any m >= mu is a nonnegative supermartingale and Ville's inequality gives
    P(some j: bound wrong) <= alpha, however the per-task split of mu lies. Per-task spread does not enter the
    column averages' noise (stratification), which is why the bound is far tighter than the average of k member
    bounds at alpha / k. Needs equal populations and uses equal draw counts; the general case (unequal strata or
    allocations) is a union-intersection test over the strata means (Spertus & Stark, "Sweeter than SUITE",
    E-Vote-ID 2022), not needed here."""
    return bound(stratified_columns(members), alpha=alpha, side=side, population=population,
                 fractions=column_fractions(_members(members)))


def stratified_interval(members: Sequence[Sequence[float] | np.ndarray], *, alpha: float,
                        population: int | None = None) -> tuple[float, float]:
    """(lower, upper) `stratified_bound`s, each at 1 - alpha; the known mean twice once every member is complete."""
    z = stratified_columns(members)
    if population is not None and len(z) == population:
        return float(z.mean()), float(z.mean())
    return interval(z, alpha=alpha, population=population, fractions=column_fractions(_members(members)))


@dataclass(frozen=True)
class GroupState:
    """One length of a group decided on its stratified mean (`assess_group`)."""

    length: int
    decision: str
    """ABOVE / BELOW by the stratified bounds (or the exact mean at the cap), else UNDECIDED."""
    n: int
    """Columns: draws per member task that enter the bound (the fewest any member has)."""
    mean: float | None
    low: float
    high: float
    needed: bool
    """Could still change the group's effective length: undecided, below the cap, not stopped near the threshold,
    and no longer length is confidently above (RULER counts the largest length above the threshold, so a shorter
    one cannot move it)."""
    near_threshold: bool = False
    """Decided within the full sweep's noise of the threshold, or (`Settings.near_stop`) undecided and stopped
    there: both bounds inside that noise band."""


def assess_group(cells: Mapping[tuple[str, int], Sequence[float]], tasks: Collection[str], settings: Settings,
                 ) -> tuple[list[GroupState], EffectiveLength]:
    """A group's decisions per length on its stratified mean, and its effective length.

    alpha is split over the group's lengths (Settings.per_task), so the group's effective length is the full
    sweep's with probability >= 1 - alpha. No monotonicity is assumed: a length above a confidently failed one
    is sampled until decided like any other (pooled over the members, a length far below decides in a round or
    two). The one use of the length structure is sound under RULER's definition: once a length is confidently
    above, the shorter lengths cannot change the answer and are no longer sampled."""
    tasks = sorted(tasks)
    lengths = sorted({n for t, n in cells if t in tasks})
    alphas = settings.length_alphas(lengths)
    fractions = column_fractions(len(tasks), settings.column_power)
    base = []
    for length in lengths:
        alpha = alphas[length]
        members = [np.asarray(cells.get((t, length), ()), dtype=np.float64) for t in tasks]
        population = settings.population(length)
        z = stratified_columns(members)
        if len(z) == 0:
            low, high, decision, mean = 0.0, 1.0, UNDECIDED, None
        else:
            mean = float(z.mean())
            if population is not None and len(z) == population:
                low = high = mean
                decision = ABOVE if mean > settings.threshold else BELOW
            else:
                low, high = (interval(z, alpha=alpha, population=population, fractions=fractions)
                             if settings.intervals else (math.nan, math.nan))
                decision = {1: ABOVE, -1: BELOW, 0: UNDECIDED}[side(z, settings.threshold, alpha=alpha,
                                                                    population=population, fractions=fractions)]
        trimmed = [m[:len(z)] for m in members]
        near = decision in (ABOVE, BELOW) and near_threshold(trimmed, settings.cap_for(length), settings)
        if decision == UNDECIDED and settings.near_stop and len(z) > 1:
            near = _inside_noise(z, trimmed, alpha=alpha, population=population, full=settings.cap_for(length),
                                 settings=settings, fractions=fractions)
        base.append((length, len(z), mean, low, high, decision, near))
    longest_above = max((b[0] for b in base if b[5] == ABOVE), default=0)
    states = [GroupState(length=length, n=n, mean=mean, low=low, high=high, decision=decision,
                         needed=(decision == UNDECIDED and not near and n < settings.cap_for(length)
                                 and length > longest_above),
                         near_threshold=near)
              for length, n, mean, low, high, decision, near in base]
    # an undecided length shorter than one confidently above moves neither edge (both take the largest length)
    return states, effective_length({s.length: s.decision for s in states},
                                    {s.length for s in states if s.near_threshold})


def _inside_noise(z: np.ndarray, members: Sequence[np.ndarray], *, alpha: float, population: int | None, full: int,
                  settings: Settings, fractions: np.ndarray = FRACTIONS) -> bool:
    """Whether both stratified bounds lie within the full sweep's noise band of the threshold (`near_stop`): the
    lower bound has passed threshold - band and the upper bound threshold + band."""
    band = noise_band(members, full, settings)
    low_edge, high_edge = settings.threshold - band, settings.threshold + band
    return bool(band > 0 and low_edge > 0 and high_edge < 1
                and crossed(z, low_edge, alpha=alpha, side=UP, population=population, fractions=fractions)[-1]
                and crossed(z, high_edge, alpha=alpha, side=DOWN, population=population, fractions=fractions)[-1])


def next_group_round(cells: Mapping[tuple[str, int], Sequence[float]], groups: Mapping[str, Collection[str]],
                     settings: Settings) -> dict[tuple[str, int], int]:
    """New instances per (task, length) so that every group's needed lengths gain one round of columns: each member
    is brought to (columns so far + round_size), never past the cap. A task in several groups gets the most any of
    them asks for.

    Allocation goes to the lengths that decide the answer: a needed length waits while a longer needed one looks
    above (its mean so far exceeds the threshold), since if that one is decided above, the shorter cannot move
    the effective length. This only orders the sampling; every decision is still taken by its own bound."""
    want: dict[tuple[str, int], int] = {}
    for tasks in groups.values():
        states, _ = assess_group(cells, tasks, replace(settings, intervals=False))
        for s in states:
            if not s.needed or any(o.needed and o.length > s.length and o.mean is not None
                                   and o.mean > settings.threshold for o in states):
                continue
            target = settings.next_count(s.n, settings.cap_for(s.length))
            for t in tasks:
                have = len(cells.get((t, s.length), ()))
                if target > have:
                    want[(t, s.length)] = max(want.get((t, s.length), 0), target - have)
    return want
