"""The score stage: instances joined with their latest prediction, scored by each task's judge under a
deadline (`scoring.deadline`), one scores table written; reused while its input is unchanged."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from longeval import __version__
from longeval.cluster import interrupt
from longeval.cluster.ray_runtime import map_pool, run_key
from longeval.config import Config, suite_hash
from longeval.planning.plan import PlanKey, in_plan, make_plan, planned_keys
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, latest_predictions
from longeval.run.consistency import prediction_fingerprints
from longeval.scoring.deadline import DeadlineScorer, import_plugins
from longeval.stages.followup import parents_with_followups
from longeval.store.compact import shard_prefixes
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName, compacted_prefix
from longeval.tasks import judge_for

log = logging.getLogger(__name__)


# -- score ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoringUnit:
    """One generated instance shard's rows to score: its shards (follow-ups included, so a chain is whole) and
    the prediction files that may hold their predictions (its merged file, and any part not merged yet)."""

    instances: tuple[str, ...]
    predictions: tuple[str, ...]
    instance_sizes: tuple[int | None, ...] = ()
    """The instance shards' bytes as the driver listed them (spares the scorer a request per shard on S3)."""


def scoring_units(cfg: Config, root: RunRoot) -> list[ScoringUnit]:
    """The planned instance shards, each with its prediction files, from listings (and, only while parts are
    not merged yet, the parts' ids): what lets each scorer read its own inputs, so the driver holds none."""
    planned = {shard.name for shard in make_plan(cfg, check_data=False).shards}
    instances: dict[str, list[str]] = {}
    sizes = root.shard_sizes("instances")
    for name in sizes:
        prefix = ShardName.parse(name).prefix
        if prefix in planned:
            instances.setdefault(prefix, []).append(name)
    predictions: dict[str, list[str]] = {}
    names = root.shard_names("predictions")
    for name in names:
        if (prefix := compacted_prefix(name)) is not None:
            predictions.setdefault(prefix, []).append(name)
    parts = sorted(n for n in names if compacted_prefix(n) is None)
    if parts:  # a stage stopped before its merge (`longeval score` on a killed infer): route each part
        shard_of = shard_prefixes(root)
        for part in parts:
            ids = root.read_shard("predictions", part, PREDICTION_SCHEMA, columns=["instance_id"])
            for prefix in {shard_of.get(i) for i in ids["instance_id"].to_pylist()} - {None}:
                predictions.setdefault(prefix, []).append(part)
    return [ScoringUnit(tuple(sorted(names)), tuple(sorted(predictions.get(prefix, ()))),
                        tuple(sizes[n] for n in sorted(names)))
            for prefix, names in sorted(instances.items())]


class UnitScorer:
    """Scoring units in, score rows out (scorers never raise on output); `score_units` keeps one per worker process.

    Each unit's instances (metadata columns) and predictions are read here, not on the driver, so the driver's
    memory is set by the score rows alone, whatever the suite's outputs, references and `meta` weigh. Each
    judge call runs in a child process under `cluster.scorer_timeout_s` (`longeval.scoring.deadline`), so one
    pathological output costs a `scorer_timeout` row, not the run.
    """

    def __init__(self, cfg: Config, root: RunRoot, scorer: DeadlineScorer | None = None) -> None:
        self.cfg, self.root = cfg, root
        import_plugins(cfg.plugins)  # the plan names their tasks too
        self.keys = planned_keys(cfg)
        self.scorer = scorer or DeadlineScorer(cfg.cluster.scorer_timeout_s, judge_for, cfg.plugins)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = []
        for instances, predictions, sizes in zip(batch["instances"].to_pylist(), batch["predictions"].to_pylist(),
                                                 batch["instance_sizes"].to_pylist(), strict=True):
            unit = ScoringUnit(tuple(instances), tuple(predictions), tuple(sizes))
            joined = scoring_input(self.cfg, self.root, unit, keys=self.keys)
            scores = pa.Table.from_pylist(self.scorer.score_rows(joined.to_pylist()), schema=SCORE_SCHEMA)
            column = SCORE_SCHEMA.get_field_index("prediction_fingerprint")  # one score row per input row, in order
            rows.append(scores.set_column(column, SCORE_SCHEMA.field(column), joined["prediction_fingerprint"]))
        return pa.concat_tables(rows) if rows else SCORE_SCHEMA.empty_table()


def score_units(batch: pa.Table, *, cfg: Config, root: RunRoot) -> pa.Table:
    """Ray Data task: the batch's units, by this process's `UnitScorer` for the run. A task, so a warm worker
    serves the next run too (`generate.generate_shards` says why), and so does its scoring child where the
    deadline and the plugins are the same."""
    key = run_key(cfg, root.uri)
    if _KEPT.get("key") != key:
        kept: DeadlineScorer | None = _KEPT["scorer"].scorer if _KEPT else None
        if kept and (kept.timeout_s, kept.plugins) != (cfg.cluster.scorer_timeout_s, list(cfg.plugins)):
            kept.close()
            kept = None
        _KEPT.update(key=key, scorer=UnitScorer(cfg, root, kept))
    return _KEPT["scorer"](batch)


_KEPT: dict[str, Any] = {}
"""This process's scorer and the run it serves (`score_units`)."""


def kept_scorer() -> UnitScorer | None:
    """The scorer this process keeps for its run's next units, if any."""
    return _KEPT.get("scorer")


def release_kept() -> None:
    """Stop the kept scorer's child and forget it."""
    if _KEPT:
        _KEPT["scorer"].scorer.close()
    _KEPT.clear()


def score(cfg: Config, root: RunRoot, progress=None) -> pa.Table:
    """Score every prediction (cheap, so always all of them) and write one scores table."""
    import ray

    fingerprint = score_fingerprint(cfg, root)
    if scores_current(root, fingerprint):
        return root.read_stage("scores", SCORE_SCHEMA)
    units = scoring_units(cfg, root)
    if not units:
        scores = SCORE_SCHEMA.empty_table()
    else:
        items = [{"instances": list(u.instances), "predictions": list(u.predictions),
                  "instance_sizes": list(u.instance_sizes)} for u in units]
        ds = map_pool(
            ray.data.from_items(items, override_num_blocks=min(len(items), 200)), score_units,
            fn_kwargs={"cfg": cfg, "root": root}, batch_size=1, batch_format="pyarrow",
            compute=ray.data.TaskPoolStrategy(size=1), num_cpus=0.5,
        )
        total = len(planned_keys(cfg))  # an upper bound: first calls of two-call chains are not scored
        task_id = progress.add_task("score", total=total) if progress else None
        parts = []
        for b in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            interrupt.check()
            part = pa.Table.from_batches(b.to_batches()) if isinstance(b, pa.Table) else b
            parts.append(part)
            if progress:
                progress.advance(task_id, part.num_rows)
        if progress:
            progress.update(task_id, completed=total)
        scores = pa.concat_tables(parts).cast(SCORE_SCHEMA) if parts else SCORE_SCHEMA.empty_table()
        scores = scores.sort_by([("task", "ascending"), ("target_length", "ascending"),
                                 ("instance_id", "ascending")])
        timeouts = pc.sum(pc.equal(scores["error_type"], "scorer_timeout")).as_py() or 0
        if timeouts:
            log.warning("%d outputs took longer than cluster.scorer_timeout_s=%g s to score: recorded as "
                        "scorer_timeout (score 0)", timeouts, cfg.cluster.scorer_timeout_s)
    root.write_table("scores", "scores", scores)
    root.write_json(SCORE_INPUT, {"fingerprint": fingerprint})
    return scores


SCORE_INPUT = "scores_input.json"
"""What the scores were computed from (`score_fingerprint`): a rerun with the same input reuses them."""


SCORE_FORMAT = 2
"""Bumped when score rows gain a column every row needs (2: `prediction_fingerprint`): older scores are redone."""


def score_fingerprint(cfg: Config, root: RunRoot) -> str:
    """A hash of everything the scores depend on: the committed instance and prediction shards (names and
    contents: a retried prediction part can keep its name), the suite, the scorer settings and longeval's version."""
    def digests(stage: str) -> dict[str, str | None]:
        return {name: root.commit_record(stage, name).get("sha256") for name in sorted(root.shard_names(stage))}

    blob = json.dumps({"instances": digests("instances"), "predictions": digests("predictions"),
                       "suite": suite_hash(cfg.suite), "score_format": SCORE_FORMAT,
                       "timeout": cfg.cluster.scorer_timeout_s, "plugins": cfg.plugins, "longeval": __version__},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def scores_current(root: RunRoot, fingerprint: str) -> bool:
    """Whether the committed scores were computed from exactly this input."""
    if not root.has("scores", "scores") or not root.exists(SCORE_INPUT):
        return False
    return root.read_json(SCORE_INPUT).get("fingerprint") == fingerprint


def scoring_input(cfg: Config, root: RunRoot, unit: ScoringUnit | None = None, *,
                  keys: set[PlanKey] | None = None) -> pa.Table:
    """The instances of the current plan (of `unit`, else all) joined with their latest prediction (follow-up
    parents left out), and that prediction's fingerprint (`prediction_fingerprint`), which each score row keeps.
    `keys`: `planned_keys(cfg)`, when the caller keeps it."""
    columns = [n for n in INSTANCE_SCHEMA.names if n not in ("prompt", "prompt_token_ids")]
    names = unit.instances if unit else None
    sizes = dict(zip(unit.instances, unit.instance_sizes, strict=False)) if unit else None
    instances = in_plan(cfg, root.read_stage("instances", INSTANCE_SCHEMA, columns=columns, names=names,
                                             sizes=sizes), keys)
    chained = parents_with_followups(instances)  # first calls of complete chains: only the last call counts
    if chained:
        instances = instances.filter(pc.invert(pc.is_in(instances["instance_id"], value_set=pa.array(list(chained)))))
    preds = latest_predictions(root.read_stage("predictions", PREDICTION_SCHEMA,
                                               names=unit.predictions if unit else None))
    joined = _join(instances, preds)
    return joined.append_column("prediction_fingerprint", prediction_fingerprints(joined))


def _join(instances: pa.Table, preds: pa.Table) -> pa.Table:
    """Instances with their prediction's columns (Arrow's join cannot carry list columns)."""
    where = pc.index_in(instances["instance_id"], value_set=preds["instance_id"])
    found = pc.is_valid(where)
    left, right = instances.filter(found), preds.take(where.filter(found))
    for name in PREDICTION_SCHEMA.names:
        if name != "instance_id":
            left = left.append_column(name, right[name])
    return left
