"""Two-call tasks: the second call's instances, built from the first call's outputs.

LongBench v2's chain-of-thought setting (its Appendix D.3) asks twice: first for the reasoning, then for the
answer with that reasoning quoted. A task opts in with `TaskSpec.followup` and marks the first-call instances
with `"followup": true` in their meta. After each inference round the pipeline writes a follow-up instance
for every marked instance that has a final prediction and no follow-up yet, and infers again; only the last
call of a chain is scored, so every item counts once. A first call that could not be sent (prompt too long)
gets a follow-up that is recorded as failed the same way, never dropped. A task's `followup` may return None
for an output that needs no second call (TAIL's judge only sees answers its parser cannot map): that first call
is then the last of its chain and is scored.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from longeval.config import Config
from longeval.records import (
    INSTANCE_SCHEMA,
    PREDICTION_SCHEMA,
    ErrorKind,
    Prediction,
    content_id,
    prediction_table,
)
from longeval.scoring.deadline import import_plugins
from longeval.stages.generate import make_context
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName
from longeval.tasks import TASKS, get_task
from longeval.tasks.base import make_instance

PARENT_KEY = "parent_id"
FOLLOWUP_KEY = "followup"


def followup_id(parent_id: str) -> str:
    return content_id(parent_id, "followup")


def parents_with_followups(instances: pa.Table) -> set[str]:
    """Ids of first calls whose follow-up instance exists: they are intermediate, not scored."""
    if "meta" not in instances.column_names:
        return set()
    found = set()
    for meta in pc.filter(instances["meta"], pc.match_substring(instances["meta"], f'"{PARENT_KEY}"')).to_pylist():
        found.add(json.loads(meta)[PARENT_KEY])
    return found


@dataclass(frozen=True)
class FirstCall:
    """What a first call's follow-up is built from: never its prompt or token ids, which are most of a shard."""

    instance_id: str
    family: str
    task: str
    target_length: int
    seed: int
    shard_index: int
    index: int
    meta: str


PARENT_COLUMNS = [f.name for f in dataclasses.fields(FirstCall)]


def two_call_shards(root: RunRoot) -> list[str]:
    """The committed instance shards of tasks that declare a second call, found from shard names alone (a suite
    without two-call tasks, RULER's say, costs one listing here, whatever its size)."""
    names = []
    for name in sorted(root.shard_names("instances")):
        shard = ShardName.parse(name)
        spec = TASKS.get(f"{shard.family}/{shard.task}")
        if spec is not None and spec.followup is not None:
            names.append(name)
    return names


def write_followups(cfg: Config, root: RunRoot, model_path: str) -> int:
    """Write the missing follow-up instances (and the failures of unsent first calls); returns how many."""
    import_plugins(cfg.plugins)  # tasks a plugin registers decide what is two-call too
    names = two_call_shards(root)
    if not names:
        return 0
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=PARENT_COLUMNS, names=names)
    marked = instances.filter(pc.match_substring(instances["meta"], f'"{FOLLOWUP_KEY}": true'))
    if marked.num_rows == 0:
        return 0
    done = set(instances["instance_id"].to_pylist())
    preds = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "model_id", "output", "error"])
    preds = preds.filter(pc.is_in(preds["instance_id"], value_set=marked["instance_id"]))
    final = {p["instance_id"]: p for p in preds.to_pylist() if ErrorKind.of(p["error"]) is not ErrorKind.ENGINE_ERROR}
    ctx = make_context(cfg, model_path)
    shards: dict[ShardName, list[dict]] = defaultdict(list)
    failed: list[dict] = []
    for row in marked.to_pylist():
        parent = FirstCall(**row)
        child_id = followup_id(parent.instance_id)
        pred = final.get(parent.instance_id)
        if child_id in done or pred is None:
            continue
        spec = get_task(f"{parent.family}/{parent.task}", cfg.suite.params)
        second = dataclasses.replace(spec, max_new_tokens=spec.followup_budget)
        meta = json.loads(parent.meta)
        sent = not pred["error"]
        draft = spec.followup(ctx, spec.params, meta, pred["output"] if sent else "",
                              target_length=parent.target_length, max_new_tokens=second.max_new_tokens)
        if draft is None:  # the task needs no second call for this output (TAIL: the parser mapped the answer)
            continue
        draft = dataclasses.replace(draft, meta={**draft.meta, FOLLOWUP_KEY: False, PARENT_KEY: parent.instance_id})
        child = make_instance(second, draft, ctx, target_length=parent.target_length, seed=parent.seed,
                              shard_index=parent.shard_index, index=parent.index)
        child = dataclasses.replace(child, instance_id=child_id, context_id=child_id)
        shard = ShardName(parent.family, parent.task, parent.target_length, parent.seed, parent.shard_index)
        shards[shard].append(child.to_row())
        if not sent:  # the chain broke at its first call: the follow-up fails the same way, unsent
            # (a final prediction never sent: its prompt was too long, the one failure that is not retried)
            kind = ErrorKind.of(pred["error"]) or ErrorKind.PROMPT_TOO_LONG
            failed.append(Prediction(instance_id=child_id, model_id=pred["model_id"], output="", output_tokens=0,
                                     finish_reason="not_sent", cached_prompt_tokens=0, latency_s=0.0,
                                     error=kind.format(f"in the first call of the chain ({pred['error']})")).to_row())
    for shard, rows in shards.items():
        table = pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA)
        tag = content_id(sorted(r["instance_id"] for r in rows))[:8]
        root.write_table("instances", dataclasses.replace(shard, followup=tag).text, table)
    if failed:
        root.write_part("predictions", prediction_table(failed))
    return sum(len(rows) for rows in shards.values())
