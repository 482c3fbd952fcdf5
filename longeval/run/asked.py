"""An adaptive run's asked positions: how far into each (task, length) cell's order its rounds have asked.

Why a record: a round is counted in instances (`suite.adaptive_step`, one column per member task for a group
target), while a shard, the unit of generation, files and resume, holds more (two by default). A round generates
whole shards and runs only the positions it asked for; the rest of a shard waits for a later round. A resumed
run finishes exactly the positions its cut-short round asked for, never the rest of a shard: that would add a
draw the uninterrupted run did not take, and the decisions that follow would differ.

The record is one small JSON file in the run root, written before the round's shards are generated, and only ever
raised. A root without one (an adaptive run from before the record, whose rounds were whole shards) asked for
everything it generated.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from longeval.config import Config
from longeval.planning.plan import Plan, ShardSpec, make_plan
from longeval.store.run_root import RunRoot

__all__ = ["ASKED_FILE", "ask", "asked_shards", "only_asked", "read_asked", "seed_asked", "unmade_shards"]

ASKED_FILE = "adaptive_asked.json"

Cell = tuple[str, int]
"""(`family/task`, target length)."""


def read_asked(root: RunRoot) -> dict[Cell, int] | None:
    """Per cell, the positions [0, asked) its rounds asked for; None when the root keeps no record."""
    record = root.json_if_exists(ASKED_FILE)
    if record is None:
        return None
    return {(c["task"], int(c["target_length"])): int(c["asked"]) for c in record["cells"]}


def ask(root: RunRoot, asks: Mapping[Cell, int]) -> dict[Cell, int]:
    """Raise the record to `asks` (a cell never goes back: a position once asked stays asked) and write it."""
    merged = dict(read_asked(root) or {})
    for cell, stop in asks.items():
        merged[cell] = max(merged.get(cell, 0), int(stop))
    root.write_json(ASKED_FILE, {"cells": [{"task": t, "target_length": n, "asked": a}
                                           for (t, n), a in sorted(merged.items())]})
    return merged


def seed_asked(root: RunRoot, plan: Plan) -> None:
    """Start the record of a root that has none: every position its generated shards hold was asked for (its
    rounds were whole shards). A root that keeps a record is left as it is."""
    if root.exists(ASKED_FILE):
        return
    written = root.shard_names("instances")
    asks: dict[Cell, int] = {}
    for s in plan.shards:
        if s.name in written:
            cell = (s.task, s.target_length)
            asks[cell] = max(asks.get(cell, 0), s.stop)
    ask(root, asks)


def asked_shards(plan: Plan, asks: Mapping[Cell, tuple[int, int]]) -> list[ShardSpec]:
    """The plan's shards that hold positions [start, stop) of a cell (`asks`: cell -> (start, stop))."""
    out = []
    for s in plan.shards:
        want = asks.get((s.task, s.target_length))
        if want is not None and s.stop > want[0] and s.start < want[1]:
            out.append(s)
    return out


def unmade_shards(root: RunRoot, plan: Plan) -> list[ShardSpec]:
    """The shards holding asked positions that the root does not hold yet: a round cut short while generating."""
    asked = read_asked(root) or {}
    written = root.shard_names("instances")
    return [s for s in asked_shards(plan, {cell: (0, stop) for cell, stop in asked.items()}) if s.name not in written]


def only_asked(cfg: Config, root: RunRoot, instances: pa.Table, plan: Plan | None = None) -> pa.Table:
    """The rows of `instances` (with family, task, target_length, index) at positions their cell's rounds asked
    for: in an adaptive run with a record, what the engines run and what counts as planned. Unchanged otherwise
    (a full sweep, also one completing an adaptive root, runs everything)."""
    if not cfg.suite.adaptive or not instances.num_rows:
        return instances
    asked = read_asked(root)
    if asked is None:
        return instances
    plan = plan or make_plan(cfg, check_data=False)
    position = {(s.task, s.target_length, i): p for s in plan.shards if (s.task, s.target_length) in asked
                for p, i in zip(range(s.start, s.stop), s.indices(), strict=True)}
    keys = zip(instances["family"].to_pylist(), instances["task"].to_pylist(),
               instances["target_length"].to_pylist(), instances["index"].to_pylist(), strict=True)
    mask = [position.get((f"{f}/{t}", n, i), -1) in range(asked.get((f"{f}/{t}", n), 0))
            for f, t, n, i in keys]
    return instances.filter(pa.array(mask, pa.bool_()))
