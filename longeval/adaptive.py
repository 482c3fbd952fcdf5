"""Adaptive length sweeps: anytime-valid intervals, per-cell decisions and the next round's allocation.

Pure functions, no Ray and no I/O: `longeval.adaptive_run` feeds them the scores on disk, and
`benchmarks/adaptive.py` replays them on recorded or synthetic scores.

The interval is a betting confidence sequence of Waudby-Smith & Ramdas, "Estimating means of bounded random
variables by betting", JRSS-B 86(1), 2024 (arXiv:2010.09686): for each candidate mean m, the capital
K_t(m) = prod_{i<=t} (1 + lambda_i(m) (X_i - m)) with their aGRAPA bets lambda_i(m) (approximate growth-rate
adaptive, computed from X_1..X_{i-1} only, truncated to [-3/4 / (1 - m), 3/4 / m]); m is excluded once K_t(m)
reaches 1 / alpha. Under m = mu the capital is a nonnegative martingale, so by Ville's inequality, for scores
X_1, X_2, ... in [0, 1] with a common conditional mean mu (a cell's i.i.d. instances, taken in an order fixed
before seeing them),

    P(for some n >= 1: mu is excluded) <= alpha,

i.e. the intervals may be looked at after every observation and sampling stopped whenever they decide
(optional stopping) without inflating the error. Excluded values stay excluded (the running intersection),
which keeps the guarantee. It holds per cell: k cells all cover at once with probability >= 1 - k * alpha
(union bound); group intervals below use alpha / k per member cell for that reason. Intervals are reported on
a grid of step 1/1000, widened by one step so the rounding is conservative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ABOVE",
    "BELOW",
    "PRESUMED_BELOW",
    "UNDECIDED",
    "CellState",
    "EffectiveLength",
    "Settings",
    "assess",
    "excluded",
    "log_capital",
    "side",
    "effective_length",
    "group_effective_length",
    "interval",
    "next_round",
]

ABOVE = "above"
BELOW = "below"
UNDECIDED = "undecided"
PRESUMED_BELOW = "presumed_below"
"""Above the task's first confidently failed length, one confirmation round showed a mean under the threshold:
sampling stopped there without a decision (reported as such, never as a confident `below`)."""

_C = 0.75  # bets are truncated to [-c / (1 - m), c / m] (WSR 2024 use c = 1/2 or 3/4)
_GRID = np.linspace(0.0005, 0.9995, 1000)
_STEP = 0.001


def log_capital(scores: Sequence[float] | np.ndarray, m: float | np.ndarray, *, alpha: float) -> np.ndarray:
    """Log of the capital of betting against mean `m`, after each observation.

    `scores` is (..., n); `m` a scalar, or a 1-D grid of candidates (results are then (..., n, len(m))).
    The bet before observation t is aGRAPA's, (mu_hat - m) / (sigma_hat^2 + (mu_hat - m)^2), from the
    observations before t only (predictable), so under m = mu the capital is a nonnegative martingale.
    """
    del alpha  # the bets do not depend on it; kept so every function of the sequence takes the same arguments
    x = np.asarray(scores, dtype=np.float64)
    if np.any((x < 0) | (x > 1)):
        raise ValueError("the confidence sequence needs scores in [0, 1]")
    t = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    mu_hat = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)
    var_hat = (0.25 + np.cumsum((x - mu_hat) ** 2, axis=-1)) / (t + 1)
    prev_mu = np.concatenate([np.full(x.shape[:-1] + (1,), 0.5), mu_hat[..., :-1]], axis=-1)
    prev_var = np.concatenate([np.full(x.shape[:-1] + (1,), 0.25), var_hat[..., :-1]], axis=-1)
    m = np.asarray(m, dtype=np.float64)
    axis = -1
    if m.ndim:
        x, prev_mu, prev_var, axis = x[..., None], prev_mu[..., None], prev_var[..., None], -2
    gap = prev_mu - m
    bets = np.clip(gap / (prev_var + gap**2), -_C / (1 - m), _C / m)
    return np.cumsum(np.log1p(bets * (x - m)), axis=axis)


def excluded(scores: Sequence[float] | np.ndarray, m: float, *, alpha: float) -> np.ndarray:
    """Whether `m` is outside the confidence sequence after each observation (once out, out for good)."""
    logk = log_capital(scores, m, alpha=alpha)
    return np.logical_or.accumulate(logk >= math.log(1 / alpha), axis=-1)


def side(scores: Sequence[float] | np.ndarray, m: float, *, alpha: float) -> int:
    """+1 when the sequence lies wholly above `m` (every candidate <= m excluded), -1 wholly below, else 0.

    A betting sequence need not be an interval, so excluding `m` alone is not enough: once it is out (cheap,
    one candidate), every grid candidate on the other side is checked too.
    """
    x = np.asarray(scores, dtype=np.float64)
    if x.size == 0:
        return 0
    crossed = np.flatnonzero(log_capital(x, m, alpha=alpha) >= math.log(1 / alpha))
    if crossed.size == 0:
        return 0
    up = x[: crossed[0] + 1].mean() > m  # the capital grew by betting on the side the data lie
    others = _GRID[np.less_equal(_GRID, m)] if up else _GRID[np.greater_equal(_GRID, m)]
    if others.size and not (log_capital(x, others, alpha=alpha) >= math.log(1 / alpha)).any(axis=0).all():
        return 0
    return 1 if up else -1


def interval(scores: Sequence[float] | np.ndarray, *, alpha: float) -> tuple[float, float]:
    """The confidence sequence after the last observation (every candidate never excluded); (0, 1) when empty."""
    x = np.asarray(scores, dtype=np.float64)
    if x.size == 0:
        return 0.0, 1.0
    logk = log_capital(x, _GRID, alpha=alpha)
    inside = ~(logk >= math.log(1 / alpha)).any(axis=0)
    if not inside.any():  # every candidate excluded at some time (a rare, valid outcome): the last mean
        mean = float(x.mean())
        return mean, mean
    kept = _GRID[inside]
    return max(0.0, float(kept.min()) - _STEP), min(1.0, float(kept.max()) + _STEP)


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
    """Compute each cell's interval (a grid of candidates); decisions need only the threshold's capital, so
    replays switch it off."""


    def cap_for(self, length: int) -> int:
        return dict(self.length_caps).get(length, self.cap)


@dataclass(frozen=True)
class CellState:
    task: str
    length: int
    n: int
    mean: float | None
    low: float
    high: float
    decision: str
    """ABOVE / BELOW (the interval is wholly on one side), UNDECIDED, or PRESUMED_BELOW (confirmation rule)."""
    stopped: bool
    """No more instances: decided, at the cap, or stopped by the confirmation rule."""
    early: bool
    """Decided (above or below) before the cap."""
    confirmation: bool
    """Above the task's first confidently failed length: sampled only for confirmation unless it looks above."""
    beats_shorter: bool
    """Monotonicity flag: confidently above while a shorter length of the task is confidently below."""


def assess(cells: Mapping[tuple[str, int], Sequence[float]], settings: Settings, *,
           memo: dict | None = None) -> list[CellState]:
    """Every cell's interval and decision from its scores so far (in instance order), sorted by task and length.

    `memo` (replays): a dict kept across calls whose cells only ever grow, so a cell seen with the same count
    is not recomputed.
    """
    base: dict[tuple[str, int], tuple[int, float | None, float, float, str]] = {}
    for key, values in cells.items():
        values = np.asarray(values, dtype=np.float64)
        if memo is not None and (key, len(values)) in memo:
            base[key] = memo[(key, len(values))]
            continue
        low, high = interval(values, alpha=settings.alpha) if settings.intervals else (math.nan, math.nan)
        decision = {1: ABOVE, -1: BELOW, 0: UNDECIDED}[side(values, settings.threshold, alpha=settings.alpha)]
        base[key] = (len(values), float(values.mean()) if len(values) else None, low, high, decision)
        if memo is not None:
            memo[(key, len(values))] = base[key]
    out = []
    for task in sorted({t for t, _ in base}):
        lengths = sorted(n for t, n in base if t == task)
        failed = [n for n in lengths if base[(task, n)][4] == BELOW]
        first_failed = failed[0] if failed else None
        for length in lengths:
            n, mean, low, high, decision = base[(task, length)]
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
                beats_shorter=decision == ABOVE and first_failed is not None and length > first_failed))
    return out


def next_round(states: Sequence[CellState], settings: Settings) -> dict[tuple[str, int], int]:
    """New instances per cell for the next round: a round for every cell not stopped, never past the cap."""
    return {(s.task, s.length): min(settings.round_size, settings.cap_for(s.length) - s.n)
            for s in states if not s.stopped}


@dataclass(frozen=True)
class EffectiveLength:
    """The largest length whose score is above the threshold, as far as the intervals tell.

    `low`: the largest length confidently above (0: none); `high`: the largest length not (presumed) below
    (0: none). `value` is set only when they agree; otherwise the effective length is undecided.
    """

    low: int
    high: int

    @property
    def decided(self) -> bool:
        return self.low == self.high

    @property
    def value(self) -> int | None:
        return self.low if self.decided else None


def effective_length(decisions: Mapping[int, str]) -> EffectiveLength:
    """From the decisions per length of one task (or group)."""
    above = [n for n, d in decisions.items() if d == ABOVE]
    open_ = [n for n, d in decisions.items() if d not in (BELOW, PRESUMED_BELOW)]
    return EffectiveLength(low=max(above, default=0), high=max(open_, default=0))


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
    effective length. The interval averages the member cells' bounds, each at alpha / (cells in the group), so
    it covers with probability >= 1 - alpha. A length where a member cell was presumed below is presumed below."""
    tasks = sorted({t for t, _ in cells})
    presumed = {s.length for s in states if s.decision == PRESUMED_BELOW and s.task in tasks}
    rows = []
    for length in sorted({n for _, n in cells}):
        members = [np.asarray(cells.get((t, length), ()), dtype=np.float64) for t in tasks]
        alpha = settings.alpha / len(tasks)
        bounds = [interval(m, alpha=alpha) for m in members]
        low = float(np.mean([b[0] for b in bounds]))
        high = float(np.mean([b[1] for b in bounds]))
        means = [float(m.mean()) for m in members if len(m)]
        mean = float(np.mean(means)) if len(means) == len(members) else None
        decision = ABOVE if low > settings.threshold else BELOW if high < settings.threshold else UNDECIDED
        if decision == UNDECIDED and length in presumed:
            decision = PRESUMED_BELOW
        rows.append(GroupLength(length=length, mean=mean, low=low, high=high, decision=decision))
    return rows, effective_length({r.length: r.decision for r in rows})
