"""Adaptive runs (`suite.adaptive=true`): the sweep in rounds of ordinary shards, stopping decided cells.

Each round asks, for every (task, length) cell still undecided, for its next positions of the full sweep's plan
(`suite.adaptive_step` of them, growing by the schedule; with `suite.shuffle`, positions in the cell's seeded
random order, so a round is a random sample of the cell), and runs the shards that hold them through the
pipeline's own stages (the engines run only the asked positions, `longeval.run.asked`): `stages.generate`,
`stages.infer`, `stages.score`. Decisions (longeval.stats.adaptive) are recomputed from the scores on disk before every
round, so a crash resumes where it stopped, a finished root does no new inference, and the same seed gives the same
decisions. Extending an adaptive root to the full sweep is a rerun with `suite.adaptive=false` and the root's
shard size and order: the missing shards are simply generated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from longeval.cluster.ray_runtime import init_ray
from longeval.config import Config
from longeval.errors import ConfigError
from longeval.planning.capacity import find_model_arch
from longeval.planning.cost import DEFAULT_GPU, Cost, call_cost, replica_shape
from longeval.planning.plan import Plan, ShardSpec, adaptive_threshold, make_plan, samples_per_length
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run.asked import ask, asked_shards, seed_asked, unmade_shards
from longeval.stages.generate import generate
from longeval.stages.infer import Engines, infer
from longeval.stages.score import score
from longeval.stats.adaptive import (
    ABOVE,
    BELOW,
    CellState,
    Settings,
    assess,
    assess_group,
    effective_length,
    group_effective_length,
    next_group_round,
    next_round,
)
from longeval.store.run_root import RunRoot
from longeval.tasks import skill_group

log = logging.getLogger(__name__)

__all__ = ["Cell", "adaptive_tables", "read_cells", "round_asks", "round_shards", "run_rounds", "settings_for",
           "target_groups", "write_adaptive"]


@dataclass(frozen=True)
class Cell:
    """One (task, length) cell's scored instances, in the order its shards hold them, with their tokens."""

    scores: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """input + output tokens per instance."""
        return self.prompt_tokens + self.output_tokens


def settings_for(cfg: Config) -> Settings:
    suite = cfg.suite
    caps = samples_per_length(cfg)
    return Settings(threshold=adaptive_threshold(cfg) / 100, alpha=1 - suite.adaptive_confidence,
                    round_size=suite.adaptive_step, cap=suite.samples,
                    length_caps=tuple((n, c) for n, c in sorted(caps.items()) if c != suite.samples),
                    without_replacement=bool(suite.shuffle), round_growth=suite.adaptive_growth,
                    round_max=suite.shard_size * suite.adaptive_round_max,
                    alpha_split=suite.adaptive_alpha_split, near_stop=suite.adaptive_near_stop,
                    column_power=suite.adaptive_column_power)


def read_cells(root: RunRoot, scores: pa.Table | None = None, *, plan: Plan | None = None
               ) -> dict[tuple[str, int], Cell]:
    """Per cell (`family/task`, length): the scores on disk in the order the cell's shards hold them (`plan`: its
    instances only, by position; without: every instance, by index), and their tokens."""
    if scores is None:
        scores = root.read_stage("scores", SCORE_SCHEMA)
    inst = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "index", "input_tokens"])
    preds = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "output_tokens"])
    index = dict(zip(inst["instance_id"].to_pylist(), inst["index"].to_pylist(), strict=True))
    inputs = dict(zip(inst["instance_id"].to_pylist(), inst["input_tokens"].to_pylist(), strict=True))
    outputs = dict(zip(preds["instance_id"].to_pylist(), preds["output_tokens"].to_pylist(), strict=True))
    positions = None
    if plan is not None:
        positions = {(s.task, s.target_length, i): p for s in plan.shards
                     for p, i in zip(range(s.start, s.stop), s.indices(), strict=True)}
    rows: dict[tuple[str, int], list[tuple[int, float, int, int]]] = {}
    for r in scores.select(["instance_id", "family", "task", "target_length", "score"]).to_pylist():
        iid = r["instance_id"]
        key = (f"{r['family']}/{r['task']}", r["target_length"])
        at = index.get(iid, 0)
        if positions is not None:
            at = positions.get((*key, at))
            if at is None:  # an instance of another plan on the same root
                continue
        rows.setdefault(key, []).append((at, r["score"], inputs.get(iid, 0), outputs.get(iid, 0)))
    out = {}
    for key, cell in sorted(rows.items()):
        cell.sort()
        out[key] = Cell(scores=np.array([min(1.0, max(0.0, s)) for _, s, _, _ in cell], dtype=np.float64),
                        prompt_tokens=np.array([p for _, _, p, _ in cell], dtype=np.float64),
                        output_tokens=np.array([o for _, _, _, o in cell], dtype=np.float64))
    return out


def gpu_hours(cfg: Config, cells: Mapping[tuple[str, int], Cell]) -> tuple[str, dict[tuple[str, int], float]] | None:
    """The planner's GPU-hours per cell for the instances it holds (`longeval.planning.cost`), on cluster.gpu, or on
    cost.DEFAULT_GPU when the run names none; None when the model's shapes are unknown (an API model)."""
    try:
        arch = find_model_arch(cfg.model)
    except ConfigError:
        arch = None
    if arch is None:
        return None
    gpu = cfg.cluster.gpu or DEFAULT_GPU
    out = {}
    shapes: dict[int, tuple[int, int | None]] = {}
    for (task, length), cell in cells.items():
        if length not in shapes:
            shapes[length] = replica_shape(arch, gpu, cfg.model, length, gpus_per_node=cfg.cluster.gpus_per_node,
                                           num_gpus=cfg.cluster.num_gpus or cfg.cluster.gpus_per_node)
        tp, kv = shapes[length]
        total = Cost()
        for p, o in zip(cell.prompt_tokens.astype(int).tolist(), cell.output_tokens.astype(int).tolist(), strict=True):
            total += call_cost(arch, gpu, prompt_tokens=p, output_tokens=o, tensor_parallel_size=tp, kv_cache_tokens=kv)
        out[(task, length)] = total.gpu_hours
    return gpu, out


def _planned_scores(plan: Plan, cells: Mapping[tuple[str, int], Cell]) -> dict[tuple[str, int], np.ndarray]:
    empty = np.zeros(0)
    return {k: cells[k].scores if k in cells else empty for k in {(s.task, s.target_length) for s in plan.shards}}


def _states(cfg: Config, plan: Plan, cells: Mapping[tuple[str, int], Cell]) -> list[CellState]:
    return assess(_planned_scores(plan, cells), settings_for(cfg))


def target_groups(cfg: Config, tasks: list[str] | set[str]) -> dict[str, list[str]]:
    """The groups `suite.adaptive_target` decides on their mean: none (`tasks`), the suite as one group `all`
    (`suite`), or every skill group and the suite (`groups`)."""
    tasks = sorted(tasks)
    if cfg.suite.adaptive_target == "tasks":
        return {}
    groups: dict[str, list[str]] = {}
    if cfg.suite.adaptive_target == "groups":
        for task in tasks:
            groups.setdefault(skill_group(task), []).append(task)
    groups["all"] = tasks
    return groups


def round_asks(cfg: Config, states: list[CellState], plan: Plan | None = None,
               cells: Mapping[tuple[str, int], Cell] | None = None) -> dict[tuple[str, int], tuple[int, int]]:
    """The next round, per cell: the positions [n, stop) it asks for after the cell's `n` scored instances, for
    every open cell (`suite.adaptive_target=tasks`) or every member cell of a group's needed length (`groups`,
    `suite`: needs `cells`)."""
    settings = settings_for(cfg)
    if cfg.suite.adaptive_target == "tasks":
        extras = next_round(states, settings)
    else:
        plan = plan or make_plan(cfg, check_data=False)
        extras = next_group_round(_planned_scores(plan, cells or {}),
                                  target_groups(cfg, {s.task for s in states}), settings)
    n = {(s.task, s.length): s.n for s in states}
    return {cell: (n[cell], n[cell] + extra) for cell, extra in extras.items()}


def round_shards(cfg: Config, states: list[CellState], plan: Plan | None = None,
                 cells: Mapping[tuple[str, int], Cell] | None = None) -> list[ShardSpec]:
    """The full sweep's own shards (`plan`) that hold the next round's positions (`round_asks`)."""
    plan = plan or make_plan(cfg, check_data=False)
    return asked_shards(plan, round_asks(cfg, states, plan, cells))


def run_rounds(cfg: Config, root: RunRoot, model_path: str, progress=None, *, keep_engines: bool = True) -> int:
    """Rounds until every cell is decided, capped or stopped by the confirmation rule (with
    `suite.adaptive_target` groups or suite: until every targeted group's effective length is decided); returns
    rounds run now.

    A round asks for positions (`longeval.run.asked`), generates the shards that hold them and runs those positions
    only. The engines stay up from round to round (`stages.infer.Engines`), sized once from the suite's plan;
    `keep_engines=False` starts them anew every round (the baseline of `benchmarks/adaptive_engines.py`).
    """
    full = make_plan(cfg, check_data=False)
    seed_asked(root, full)
    engines = Engines(cfg, root, model_path, planned=True)
    try:
        # A round cut short (its positions asked, some not generated or not inferred) is finished first, so the
        # decisions that follow see whole rounds, as in an uninterrupted run; with nothing pending no engine starts.
        unmade = unmade_shards(root, full)
        if unmade:
            init_ray(cfg)
            generate(cfg, Plan(shards=tuple(unmade), pools=full.pools), root, model_path, progress)
        infer(cfg, Plan(shards=(), pools=full.pools), root, model_path, progress, engines=engines)
        rounds = 0
        while True:
            cells = read_cells(root, score(cfg, root), plan=full)
            states = _states(cfg, full, cells)
            asks = round_asks(cfg, states, full, cells)
            if not asks:
                log.info("adaptive: every cell decided or capped after %d new round(s); %d engine start(s)", rounds,
                         engines.started)
                return rounds
            shards = asked_shards(full, asks)
            log.info("adaptive round: %d instances in %d shards for %d open cells",
                     sum(stop - start for start, stop in asks.values()), len(shards), len(asks))
            ask(root, {cell: stop for cell, (_, stop) in asks.items()})  # before any work: a resume finishes these
            plan = Plan(shards=tuple(shards), pools=full.pools)
            init_ray(cfg)  # a resumed root whose last round was whole may reach here without Ray (pipeline.work_left)
            generate(cfg, plan, root, model_path, progress)
            infer(cfg, plan, root, model_path, progress, engines=engines)
            if not keep_engines:
                engines.close()
            rounds += 1
    finally:
        engines.close()


# -- the summary tables -----------------------------------------------------------------------------


CELL_SCHEMA = pa.schema([
    ("task", pa.string()), ("target_length", pa.int64()), ("skill_group", pa.string()), ("instances", pa.int64()),
    ("cap", pa.int64()), ("decision", pa.string()), ("decided_early", pa.bool_()), ("stopped_by", pa.string()),
    ("score", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("beats_shorter", pa.bool_()),
    ("near_threshold", pa.bool_()), ("tokens", pa.int64()), ("full_tokens_est", pa.int64()),
    ("gpu_hours", pa.float64()), ("full_gpu_hours_est", pa.float64())])
LENGTH_SCHEMA = pa.schema([
    ("scope", pa.string()), ("name", pa.string()), ("effective_length", pa.int64()),
    ("effective_length_low", pa.int64()), ("effective_length_high", pa.int64()), ("decided", pa.bool_()),
    ("near_threshold", pa.bool_()), ("noise_low", pa.int64()), ("noise_high", pa.int64()), ("bound", pa.string())])
"""`bound` (both tables): what decided the row: `cells` (a task's own cells), `member bounds` (a group's interval
averages its members' bounds, each at alpha / members: `suite.adaptive_target=tasks`) or `group mean` (the anytime
bound on the stratified mean of the members, longeval.stats.adaptive.stratified_bound: `groups`, `suite`)."""
GROUP_SCHEMA = pa.schema([
    ("group", pa.string()), ("target_length", pa.int64()), ("members", pa.int64()), ("columns", pa.int64()),
    ("score", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("decision", pa.string()),
    ("near_threshold", pa.bool_()), ("bound", pa.string())])
"""Per group and length: the group's score (the mean of its tasks) with its interval in points and decision.
`columns`: draws per member that entered a `group mean` bound (the fewest any member has; null for `member
bounds`)."""


def _stopped_by(s: CellState, cap: int, target: str = "tasks") -> str:
    if s.decision in (ABOVE, BELOW) and s.early:
        return "interval"
    if s.decision == "presumed_below":
        return "confirmation"
    if s.n >= cap:
        return "cap"
    return "" if target == "tasks" else "group"  # sampled for its group's mean, which decided without it


def adaptive_tables(cfg: Config, root: RunRoot, scores: pa.Table | None = None) -> dict[str, pa.Table | dict]:
    """`adaptive` (per cell), `adaptive_lengths` (effective length per task, skill group and suite) and the
    compute spent against the full sweep (`compute`, a dict)."""
    settings = settings_for(cfg)
    plan = make_plan(cfg, check_data=False)
    cells = read_cells(root, scores, plan=plan)
    states = _states(cfg, plan, cells)
    caps = samples_per_length(cfg)
    hours = gpu_hours(cfg, cells)
    rows = []
    for s in states:
        cell = cells.get((s.task, s.length))
        spent = float(cell.tokens.sum()) if cell is not None else 0.0
        per = float(cell.tokens.mean()) if cell is not None and len(cell.tokens) else float(s.length)
        cell_hours = hours[1].get((s.task, s.length)) if hours and cell is not None and s.n else None
        rows.append({"task": s.task, "target_length": s.length, "skill_group": skill_group(s.task),
                     "instances": s.n, "cap": caps[s.length], "decision": s.decision, "decided_early": s.early,
                     "stopped_by": _stopped_by(s, caps[s.length], cfg.suite.adaptive_target),
                     "score": None if s.mean is None else 100 * s.mean, "ci_low": 100 * s.low,
                     "ci_high": 100 * s.high, "beats_shorter": s.beats_shorter,
                     "near_threshold": s.near_threshold, "tokens": int(spent),
                     "full_tokens_est": int(round(per * caps[s.length])), "gpu_hours": cell_hours,
                     "full_gpu_hours_est": None if cell_hours is None else cell_hours / s.n * caps[s.length]})
    lengths = []
    for task in sorted({s.task for s in states}):
        mine = [s for s in states if s.task == task]
        eff = effective_length({s.length: s.decision for s in mine}, {s.length for s in mine if s.near_threshold})
        lengths.append(_length_row("task", task, eff, "cells"))
    groups: dict[str, list[str]] = {}
    for task in sorted({s.task for s in states}):
        groups.setdefault(skill_group(task), []).append(task)
    groups["all"] = sorted({s.task for s in states})
    scores = _planned_scores(plan, cells)
    on_mean = cfg.suite.adaptive_target != "tasks"  # members sampled in equal rounds: the group mean's own bound
    bound = "group mean" if on_mean else "member bounds"
    group_rows = []
    for name, tasks in groups.items():
        member = {k: v for k, v in scores.items() if k[0] in tasks}
        if on_mean:
            per_length, eff = assess_group(member, tasks, settings)
        else:
            per_length, eff = group_effective_length(member, [s for s in states if s.task in tasks], settings)
        lengths.append(_length_row("group", name, eff, bound))
        for g in per_length:
            group_rows.append({"group": name, "target_length": g.length, "members": len(tasks),
                               "columns": getattr(g, "n", None), "score": None if g.mean is None else 100 * g.mean,
                               "ci_low": 100 * g.low, "ci_high": 100 * g.high, "decision": g.decision,
                               "near_threshold": getattr(g, "near_threshold", False), "bound": bound})
    spent = sum(r["tokens"] for r in rows)
    full_est = sum(r["full_tokens_est"] for r in rows)
    compute = {"instances": sum(r["instances"] for r in rows), "full_instances": sum(r["cap"] for r in rows),
               "tokens": spent, "full_tokens_est": full_est,
               "token_share": spent / full_est if full_est else None,
               "cells": len(rows), "decided_early": sum(r["decided_early"] for r in rows),
               "confidence": cfg.suite.adaptive_confidence, "round_instances": settings.round_size,
               "target": cfg.suite.adaptive_target,
               "schedule": {**settings.schedule(), "shard_size": cfg.suite.shard_size}}
    if hours is not None:
        # A cell with no instance yet has no per-instance estimate: it counts 0 both ways.
        spent_h = sum(r["gpu_hours"] or 0.0 for r in rows)
        full_h = sum(r["full_gpu_hours_est"] or 0.0 for r in rows)
        compute.update(gpu=hours[0], gpu_hours=spent_h, full_gpu_hours_est=full_h,
                       gpu_hours_share=spent_h / full_h if full_h else None)
    return {"adaptive": pa.Table.from_pylist(rows, schema=CELL_SCHEMA),
            "adaptive_lengths": pa.Table.from_pylist(lengths, schema=LENGTH_SCHEMA),
            "adaptive_groups": pa.Table.from_pylist(group_rows, schema=GROUP_SCHEMA), "compute": compute}



def _length_row(scope: str, name: str, eff, bound: str) -> dict:
    return {"scope": scope, "name": name, "effective_length": eff.value or None if eff.decided else None,
            "effective_length_low": eff.low or None, "effective_length_high": eff.high or None,
            "decided": eff.decided, "near_threshold": eff.near_threshold, "noise_low": eff.noise_low or None,
            "noise_high": eff.noise_high or None, "bound": bound}


def write_adaptive(cfg: Config, root: RunRoot, scores: pa.Table | None = None) -> dict[str, pa.Table | dict]:
    """Write the adaptive tables under summary/ (Parquet and CSV) and `adaptive.json`; returns them."""
    import pyarrow.csv as pacsv

    tables = adaptive_tables(cfg, root, scores)
    for name in ("adaptive", "adaptive_lengths", "adaptive_groups"):
        root.write_table("summary", name, tables[name])
        sink = pa.BufferOutputStream()
        pacsv.write_csv(tables[name], sink)
        root.write_text(f"summary/{name}.csv", sink.getvalue().to_pybytes().decode("utf-8"))
    root.write_json("adaptive.json", {"cells": tables["adaptive"].to_pylist(),
                                      "effective_lengths": tables["adaptive_lengths"].to_pylist(),
                                      "groups": tables["adaptive_groups"].to_pylist(),
                                      "compute": tables["compute"]})
    return tables
