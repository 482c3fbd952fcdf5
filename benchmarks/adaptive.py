#!/usr/bin/env python
"""Replay of the adaptive sweep (longeval.stats.adaptive) on full-sweep scores, in many random orders.

Run from the repository root:

    .venv/bin/python benchmarks/adaptive.py                        # the synthetic profiles, rounds of 10
    .venv/bin/python benchmarks/adaptive.py --round 25             # rounds of a full sweep's shard
    .venv/bin/python benchmarks/adaptive.py --root runs/my-full-run
    .venv/bin/python benchmarks/adaptive.py --suite --replays 200 --task-replays 20   # suite targets (issue #25)
    .venv/bin/python benchmarks/adaptive.py --suite --targets suite --replays 200 --round 1 --growth 1.25 \
        --round-max 10 --alpha-split length                        # the suite target's defaults (since 2026-11-27)

Each replay shuffles every (task, length) cell's instances, then runs the procedure of an adaptive run: a round of
`--round` instances for every undecided cell (10: an adaptive run's default shard), decisions from the confidence
bounds, the confirmation rule above a task's first failed length, until no cell is open or every open one reached
the cell's full count (the cap). Printed per profile (or per task of a run root): how often the adaptive effective
length equals the full sweep's, how often it is flagged near the threshold (`near%`: decided, but a full sweep with
other instances could give another length), how often it is reported undecided, how often it is wrong, and wrong
without the flag (`unflg%`), the share of the full sweep's tokens spent, the mean number of rounds, and for the
synthetic profiles the share of GPU-hours (longeval.planning.cost: Llama-3.1-8B on an A100 80GB, whose attention makes
long cells dearer per token). Tokens are target_length x instances for the synthetic profiles, and each instance's input
+ output tokens for a run root. Targets (printed, not asserted): >= 95 % same effective length for <= 10 % of the
tokens on profiles not near the threshold; near it, flagged or undecided rather than wrong. `--per-cell` spends
alpha per cell instead of splitting it over a task's lengths (Settings.per_task). `--suite`: the suite's effective
length on suite curves of 13 tasks with per-task spread, decided per cell (today's run) and on the suite's mean
(`suite.adaptive_target=suite`), with the pooled oracle floor and the ratio to it (`suite_main`). `--growth`,
`--round-max`: the round schedule (Settings.round_growth, round_max; `--round` is then the first round and the
unit); `--alpha-split length`: alpha over the lengths in proportion to the length (the oracle bets at the same
per-length alpha); `--near-stop`: group lengths inside the full sweep's noise band stop undecided.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
PROFILES: dict[str, tuple[tuple[float, ...], bool]] = {
    # name: (P(score = 1) per length, near the threshold?)
    "sharp drop": ((1.0, 0.99, 0.98, 0.2, 0.05, 0.0), False),
    "gradual decline": ((0.99, 0.97, 0.94, 0.75, 0.55, 0.35), False),
    "plateau near threshold": ((0.9, 0.87, 0.86, 0.85, 0.84, 0.83), True),
    "non-monotone": ((0.99, 0.6, 0.98, 0.97, 0.2, 0.1), False),
}


@dataclass(frozen=True)
class Outcome:
    effective: dict[str, int | None]
    near: dict[str, bool]
    tokens: float
    instances: int
    rounds: int
    gpu_seconds: float = 0.0


def full_effective(cells: Mapping[tuple[str, int], np.ndarray], threshold: float) -> dict[str, int]:
    """RULER's effective length per task from every instance: the largest length whose mean exceeds it (0: none)."""
    out: dict[str, int] = {}
    for (task, length), scores in sorted(cells.items()):
        out.setdefault(task, 0)
        if scores.mean() > threshold:
            out[task] = max(out[task], length)
    return out


def replay(cells: Mapping[tuple[str, int], np.ndarray], tokens: Mapping[tuple[str, int], np.ndarray],
           settings, rng: np.random.Generator, costs: Mapping[tuple[str, int], float] | None = None) -> Outcome:
    """One adaptive run over the cells' instances in a random order."""
    from longeval.stats.adaptive import assess, effective_length, next_round

    order = {k: rng.permutation(len(v)) for k, v in sorted(cells.items())}
    used = dict.fromkeys(cells, 0)
    memo: dict = {}
    rounds = 0
    while True:
        states = assess({k: cells[k][order[k][:used[k]]] for k in cells}, settings, memo=memo)
        alloc = next_round(states, settings)
        if not alloc:
            break
        rounds += 1
        for key, extra in alloc.items():
            used[key] += extra
    effective, near = {}, {}
    for task in sorted({t for t, _ in cells}):
        mine = [s for s in states if s.task == task]
        eff = effective_length({s.length: s.decision for s in mine}, {s.length for s in mine if s.near_threshold})
        effective[task], near[task] = eff.value, eff.near_threshold
    spent = sum(float(tokens[k][order[k][:used[k]]].sum()) for k in cells)
    seconds = sum(costs[k] * used[k] for k in cells) if costs else 0.0
    return Outcome(effective=effective, near=near, tokens=spent, instances=sum(used.values()), rounds=rounds,
                   gpu_seconds=seconds)


def oracle_share(cells: Mapping[tuple[str, int], np.ndarray], tokens: Mapping[tuple[str, int], np.ndarray],
                 settings) -> float:
    """The share of the full sweep's tokens an oracle would spend: a sequential test that knows each cell's
    score distribution bets the growth-optimal (Kelly) constant fraction against the threshold and needs about
    log(1 / alpha) / g* instances (Wald), g* = max over bets of E log(1 + bet (X - threshold)); never more than
    the cap. No valid procedure that must learn the distribution does better on average: the floor to compare
    the adaptive share with."""
    from scipy.optimize import minimize_scalar

    m, spent = settings.threshold, 0.0
    total = sum(float(t.sum()) for t in tokens.values())
    for key, x in cells.items():
        y = np.clip(x, 0.0, 1.0) - m
        lo, hi = -1 / (1 - m) + 1e-9, 1 / m - 1e-9
        best = minimize_scalar(lambda b, y=y: -np.mean(np.log1p(b * y)), bounds=(lo, hi), method="bounded")
        growth = -best.fun
        n = len(x) if growth <= 0 else min(len(x), np.log(1 / settings.alpha) / growth)
        spent += n * float(tokens[key].mean())
    return spent / total


def evaluate(name: str, cells, tokens, settings, *, replays: int, seed: int,
             costs: Mapping[tuple[str, int], float] | None = None) -> list[str]:
    """Replays of one set of cells; one printed line per task. `costs`: GPU-seconds of one instance per cell."""
    full = full_effective(cells, settings.threshold)
    total = sum(float(t.sum()) for t in tokens.values())
    rng = np.random.default_rng(seed)
    outcomes = [replay(cells, tokens, settings, rng, costs) for _ in range(replays)]
    share = np.array([o.tokens / total for o in outcomes])
    gpu = ""
    if costs:
        full_seconds = sum(costs[k] * len(v) for k, v in cells.items())
        gpu = f" {100 * np.mean([o.gpu_seconds / full_seconds for o in outcomes]):7.1f}"
    oracle = 100 * oracle_share(cells, tokens, settings)
    lines = []
    for task, want in full.items():
        got = [o.effective[task] for o in outcomes]
        same = np.mean([g == want for g in got])
        undecided = np.mean([g is None for g in got])
        wrong = 1 - same - undecided
        near = np.mean([o.near[task] for o in outcomes])
        unflagged = np.mean([g is not None and g != want and not o.near[task]
                             for g, o in zip(got, outcomes, strict=True)])
        lines.append(f"{name:<24} {task:<22} {want:>7} {100 * same:6.1f} {100 * near:6.1f} {100 * undecided:6.1f}"
                     f" {100 * wrong:6.1f} {100 * unflagged:6.1f}"
                     f" {100 * share.mean():7.1f} {100 * share.max():7.1f} {oracle:7.1f}"
                     f" {np.mean([o.rounds for o in outcomes]):6.1f}{gpu}")
    return lines


def synthetic_costs(output_tokens: int = 32) -> dict[tuple[str, int], float]:
    """GPU-seconds of one synthetic instance per length: Llama-3.1-8B on an A100 80GB (longeval.planning.cost), a prompt
    of the whole length, batched as the planner would."""
    from longeval.config import ModelConfig
    from longeval.planning.capacity import ModelArch
    from longeval.planning.cost import call_cost, replica_shape

    arch = ModelArch(num_hidden_layers=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                     num_attention_heads=32, hidden_size=4096, intermediate_size=14336, vocab_size=128256)
    model = ModelConfig(max_model_len=131072)
    out = {}
    for n in LENGTHS:
        tp, kv = replica_shape(arch, "a100_80gb", model, n, num_gpus=8, gpus_per_node=8)
        out[("synthetic", n)] = call_cost(arch, "a100_80gb", prompt_tokens=n - output_tokens,
                                          output_tokens=output_tokens, tensor_parallel_size=tp,
                                          kv_cache_tokens=kv).gpu_seconds
    return out


def synthetic(values: tuple[float, ...], samples: int, seed: int):
    rng = np.random.default_rng(seed)
    cells = {("synthetic", n): (rng.random(samples) < p).astype(np.float64) for n, p in zip(LENGTHS, values,
                                                                                          strict=True)}
    tokens = {k: np.full(samples, float(k[1])) for k in cells}
    return cells, tokens


SUITE_TASKS = 13
SUITE_PROFILES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # name: (the suite's mean P(score = 1) per length, the spread between its 13 tasks per length, +-: half of it)
    "suite sharp drop": ((0.97, 0.96, 0.93, 0.60, 0.40, 0.25), (0.04, 0.06, 0.10, 0.20, 0.20, 0.20)),
    "suite gradual": ((0.96, 0.94, 0.90, 0.80, 0.70, 0.60), (0.04, 0.08, 0.15, 0.20, 0.20, 0.20)),
    "suite early fail": ((0.90, 0.80, 0.70, 0.60, 0.50, 0.40), (0.10, 0.20, 0.20, 0.20, 0.20, 0.20)),
    "suite strong": ((0.99, 0.98, 0.97, 0.95, 0.92, 0.89), (0.01, 0.02, 0.04, 0.06, 0.08, 0.10)),
    "suite collapsing tasks": ((0.97, 0.95, 0.93, 0.89, 0.55, 0.35), (0.04, 0.06, 0.10, 0.12, 0.20, 0.20)),
    "suite non-monotone": ((0.95, 0.83, 0.93, 0.91, 0.60, 0.40), (0.06, 0.20, 0.10, 0.12, 0.20, 0.20)),
    "suite near threshold": ((0.92, 0.90, 0.88, 0.858, 0.85, 0.80), (0.08, 0.10, 0.12, 0.14, 0.15, 0.20)),
}
SUITE_PROFILES.update({f"flat {name}": (values, (0.0,) * len(LENGTHS)) for name, (values, _) in PROFILES.items()})
"""Suite curves with per-task spread: task i of 13 sits at mean + spread * (i / 6 - 1) (up to 40 points between
tasks at one length), clipped to [0, 1], so some tasks sit at 100 % while others collapse; tasks 10-12 score
partial credit (recall over four values, Binomial(4, p) / 4), the rest 0/1. The `flat` curves are the
single-task profiles above with every task at the profile's P (no spread)."""


def suite_synthetic(means: tuple[float, ...], spreads: tuple[float, ...], samples: int, seed: int):
    rng = np.random.default_rng(seed)
    cells = {}
    for n, mean, spread in zip(LENGTHS, means, spreads, strict=True):
        for i in range(SUITE_TASKS):
            p = float(np.clip(mean + spread * (i / 6 - 1), 0, 1))
            task = f"task{i:02d}"
            cells[(task, n)] = (rng.binomial(4, p, samples) / 4 if i >= 10
                                else (rng.random(samples) < p).astype(np.float64))
    tokens = {k: np.full(samples, float(k[1])) for k in cells}
    return cells, tokens


def suite_full(cells: Mapping[tuple[str, int], np.ndarray], settings) -> tuple[int, bool]:
    """The full sweep's suite effective length (the largest length whose mean over the tasks exceeds the
    threshold, 0: none), and whether it is within the full sweep's noise of the threshold: a length that could
    move it (the effective length or a longer one) has a score within the full sweep's own sampling noise of the
    threshold (longeval.stats.adaptive.near_threshold), so a full sweep with other instances could give another."""
    from longeval.stats.adaptive import near_threshold

    tasks = sorted({t for t, _ in cells})
    means = {n: np.mean([cells[(t, n)].mean() for t in tasks]) for n in LENGTHS}
    full = max((n for n in LENGTHS if means[n] > settings.threshold), default=0)
    near = any(near_threshold([cells[(t, n)] for t in tasks], settings.cap_for(n), settings)
               for n in LENGTHS if n >= full)
    return full, near


def suite_replay(cells, settings, rng: np.random.Generator, costs: Mapping[int, float], *, target: str
                 ) -> tuple[int | None, bool, float, float, int]:
    """One adaptive run deciding the suite's effective length: `target="suite"` on the stratified mean
    (longeval.stats.adaptive.assess_group, rounds of columns over the needed lengths), `"tasks"` per cell as today
    (assess / next_round until every cell stops, then the suite's interval from the members' averaged bounds).
    Returns (effective length or None, near flag, tokens, GPU-seconds, rounds)."""
    from longeval.stats.adaptive import assess, assess_group, group_effective_length, next_group_round, next_round

    order = {k: rng.permutation(len(v)) for k, v in sorted(cells.items())}
    used = dict.fromkeys(cells, 0)
    tasks = sorted({t for t, _ in cells})
    memo: dict = {}
    rounds = 0
    while True:
        drawn = {k: cells[k][order[k][:used[k]]] for k in cells}
        if target == "suite":
            alloc = next_group_round(drawn, {"all": tasks}, settings)
        else:
            alloc = next_round(assess(drawn, settings, memo=memo), settings)
        if not alloc:
            break
        rounds += 1
        for key, extra in alloc.items():
            used[key] += extra
    if target == "suite":
        _, eff = assess_group(drawn, tasks, settings)
    else:
        with_bounds = replace(settings, intervals=True)
        _, eff = group_effective_length(drawn, assess(drawn, with_bounds), with_bounds)
    spent = sum(float(k[1]) * used[k] for k in cells)
    return eff.value, eff.near_threshold, spent, sum(costs[k[1]] * used[k] for k in cells), rounds


def suite_oracle_share(cells, settings, full: int) -> float:
    """The pooled oracle floor: an oracle that knows every task's score distribution decides only the lengths
    that can move the suite's effective length (the full sweep's, and every longer one; shorter ones need
    nothing), each by betting the growth-optimal constant fraction on the column averages (one draw of each task)
    against the threshold at the run's per-length alpha: log(1 / alpha) / g* columns (Wald), g* = max over bets of
    E log(1 + bet (z - threshold)), estimated on 20,000 columns; never more than the cap."""
    from scipy.optimize import minimize_scalar

    rng = np.random.default_rng(0)
    tasks = sorted({t for t, _ in cells})
    alphas = settings.length_alphas(LENGTHS)
    m, spent = settings.threshold, 0.0
    total = sum(float(k[1]) * len(v) for k, v in cells.items())
    for n in LENGTHS:
        if n < full:
            continue
        y = np.mean([rng.choice(cells[(t, n)], 20000) for t in tasks], axis=0) - m
        lo, hi = -1 / (1 - m) + 1e-9, 1 / m - 1e-9
        growth = -minimize_scalar(lambda b, y=y: -np.mean(np.log1p(b * y)), bounds=(lo, hi), method="bounded").fun
        cap = settings.cap_for(n)
        columns = cap if growth <= 0 else min(cap, np.log(1 / alphas[n]) / growth)
        spent += columns * len(tasks) * n
    return spent / total


def suite_main(args, settings) -> None:
    """The suite profiles: the suite's effective length decided per cell (today's `tasks` target) and on the
    stratified mean (`suite`), the same replays (orders) for both."""
    costs = {n: c for (_, n), c in synthetic_costs().items()}
    print(f"replays {args.replays}, round {args.round} per task, confidence {args.confidence},"
          f" threshold {args.threshold}, {SUITE_TASKS} tasks")
    print(f"{'profile':<28} {'target':<6} {'full EL':>7} {'near':>4} {'same%':>6} {'near%':>6} {'undec%':>6}"
          f" {'wrong%':>6} {'unflg%':>6} {'tokens%':>7} {'max%':>7} {'oracle%':>7} {'ratio':>6} {'rounds':>6}"
          f" {'GPU-h%':>7}")
    shares: dict[str, list[float]] = {t: [] for t in args.targets.split(",")}
    for i, (name, (means, spreads)) in enumerate(SUITE_PROFILES.items()):
        if args.profiles and name not in args.profiles.split(","):
            continue
        cells, _ = suite_synthetic(means, spreads, args.samples, args.seed + i)
        full, near = suite_full(cells, settings)
        total = sum(float(k[1]) * len(v) for k, v in cells.items())
        full_seconds = sum(costs[k[1]] * len(v) for k, v in cells.items())
        oracle = 100 * suite_oracle_share(cells, settings, full)
        for target in args.targets.split(","):
            rng = np.random.default_rng(args.seed + i)
            replays = args.replays if target == "suite" else args.task_replays
            out = [suite_replay(cells, settings, rng, costs, target=target) for _ in range(replays)]
            got = [o[0] for o in out]
            share = 100 * np.array([o[2] / total for o in out])
            same = 100 * np.mean([g == full for g in got])
            undecided = 100 * np.mean([g is None for g in got])
            unflagged = 100 * np.mean([g is not None and g != full and not o[1] for g, o in zip(got, out,
                                                                                                 strict=True)])
            shares[target].append((share.mean(), near))
            print(f"{name:<28} {target:<6} {full:>7} {'yes' if near else 'no':>4} {same:6.1f}"
                  f" {100 * np.mean([o[1] for o in out]):6.1f} {undecided:6.1f} {100 - same - undecided:6.1f}"
                  f" {unflagged:6.1f} {share.mean():7.1f} {share.max():7.1f} {oracle:7.1f}"
                  f" {share.mean() / oracle:6.3f} {np.mean([o[4] for o in out]):6.1f}"
                  f" {100 * np.mean([o[3] for o in out]) / full_seconds:7.1f}")
    for target, values in shares.items():
        away = [v for v, near in values if not near]
        print(f"target {target}: mean token share {np.mean([v for v, _ in values]):.1f} % over the {len(values)}"
              f" curves, {np.mean(away):.1f} % over the {len(away)} not near the threshold")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=None, help="a finished full run's root: replay its scores instead")
    p.add_argument("--replays", type=int, default=500)
    p.add_argument("--samples", type=int, default=500, help="instances per cell of the synthetic full sweep")
    p.add_argument("--round", type=int, default=10, help="instances per undecided cell and round")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--threshold", type=float, default=85.6, help="in points (0-100), as suite.effective_threshold")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-cell", action="store_true", help="alpha per cell, not split over a task's lengths")
    p.add_argument("--suite", action="store_true",
                   help="the suite curves (13 tasks with per-task spread): the suite's effective length decided"
                        " per cell and on the stratified mean")
    p.add_argument("--targets", default="tasks,suite", help="with --suite: which of tasks,suite to replay")
    p.add_argument("--profiles", default="", help="with --suite: only these suite profiles (comma-separated names)")
    p.add_argument("--task-replays", type=int, default=50,
                   help="with --suite: replays of the per-cell run (78 cells, slow: ~2 s each)")
    p.add_argument("--growth", type=float, default=1.0,
                   help="round schedule: each round takes a length from n to about growth * n draws (1: constant"
                        " rounds of --round; Settings.round_growth)")
    p.add_argument("--round-max", type=int, default=0, help="largest round of the schedule (0: no limit)")
    p.add_argument("--alpha-split", default="equal", choices=("equal", "length"),
                   help="alpha over the lengths: equal shares, or in proportion to the length (Settings.alpha_split)")
    p.add_argument("--near-stop", action="store_true",
                   help="with --suite: stop a length, undecided, once its bounds lie within the full sweep's noise"
                        " band of the threshold (Settings.near_stop)")
    args = p.parse_args(argv)
    schedule = {"round_growth": args.growth, "round_max": args.round_max, "alpha_split": args.alpha_split,
                "near_stop": args.near_stop}

    from longeval.stats.adaptive import Settings

    if args.suite:
        return suite_main(args, Settings(threshold=args.threshold / 100, alpha=1 - args.confidence,
                                         round_size=args.round, cap=args.samples, intervals=False,
                                         per_task=not args.per_cell, **schedule))
    print(f"replays {args.replays}, round {args.round}, confidence {args.confidence}, threshold {args.threshold}")
    print(f"{'profile':<24} {'task':<22} {'full EL':>7} {'same%':>6} {'near%':>6} {'undec%':>6} {'wrong%':>6}"
          f" {'unflg%':>6} {'tokens%':>7} {'max%':>7} {'oracle%':>7} {'rounds':>6}"
          + ("" if args.root else f" {'GPU-h%':>7}"))
    if args.root:
        from longeval.run.adaptive_rounds import read_cells
        from longeval.store.run_root import RunRoot

        data = read_cells(RunRoot(args.root))
        cap = min(len(v.scores) for v in data.values())
        cells = {k: v.scores[:cap] for k, v in data.items()}
        tokens = {k: v.tokens[:cap] for k, v in data.items()}
        settings = Settings(threshold=args.threshold / 100, alpha=1 - args.confidence, round_size=args.round,
                            cap=cap, intervals=False, per_task=not args.per_cell, **schedule)
        for line in evaluate(args.root.rstrip("/").split("/")[-1], cells, tokens, settings,
                             replays=args.replays, seed=args.seed):
            print(line)
        return
    settings = Settings(threshold=args.threshold / 100, alpha=1 - args.confidence, round_size=args.round,
                        cap=args.samples, intervals=False, per_task=not args.per_cell, **schedule)
    costs = synthetic_costs()
    for i, (name, (values, _near)) in enumerate(PROFILES.items()):
        cells, tokens = synthetic(values, args.samples, args.seed + i)
        for line in evaluate(name, cells, tokens, settings, replays=args.replays, seed=args.seed + i, costs=costs):
            print(line)


if __name__ == "__main__":
    main()
