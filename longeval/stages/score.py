"""The score stage: instances joined with their latest prediction, scored by each task's judge under a
deadline (`scoring.deadline`), one scores table written; reused while its input is unchanged."""

from __future__ import annotations

import hashlib
import json
import logging

import pyarrow as pa
import pyarrow.compute as pc

from longeval import __version__, interrupt
from longeval.config import Config, suite_hash
from longeval.consistency import prediction_fingerprints
from longeval.followup import parents_with_followups
from longeval.plan import in_plan
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, latest_predictions
from longeval.runtime import NO_ACTOR_RESTARTS
from longeval.scoring.deadline import DeadlineScorer
from longeval.store import RunRoot
from longeval.tasks import judge_for

log = logging.getLogger(__name__)


# -- score ------------------------------------------------------------------------------------------


class Scorer:
    """Ray Data callable: instance + prediction rows in, score rows out (scorers never raise on output).

    Each call runs in a child process under `cluster.scorer_timeout_s` (`longeval.scoring.deadline`), so one
    pathological output costs a `scorer_timeout` row, not the run.
    """

    def __init__(self, timeout_s: float, plugins: list[str]) -> None:
        self.scorer = DeadlineScorer(timeout_s, judge_for, plugins)

    def __call__(self, batch: pa.Table) -> pa.Table:
        scores = pa.Table.from_pylist(self.scorer.score_rows(batch.to_pylist()), schema=SCORE_SCHEMA)
        column = SCORE_SCHEMA.get_field_index("prediction_fingerprint")  # one score row per input row, in order
        return scores.set_column(column, SCORE_SCHEMA.field(column), batch["prediction_fingerprint"])


SCORE_BATCH = 64
"""Rows per scoring batch: small enough for the progress bar to move, large enough to amortise Ray's overhead."""


def score(cfg: Config, root: RunRoot, progress=None) -> pa.Table:
    """Score every prediction (cheap, so always all of them) and write one scores table."""
    import ray

    fingerprint = score_fingerprint(cfg, root)
    if scores_current(root, fingerprint):
        return root.read_stage("scores", SCORE_SCHEMA)
    joined = scoring_input(cfg, root)
    if joined.num_rows == 0:
        scores = SCORE_SCHEMA.empty_table()
    else:
        ds = ray.data.from_arrow(joined).map_batches(
            Scorer, fn_constructor_kwargs={"timeout_s": cfg.cluster.scorer_timeout_s, "plugins": cfg.plugins},
            batch_size=SCORE_BATCH, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=0.5, **NO_ACTOR_RESTARTS,
        )
        task_id = progress.add_task("score", total=joined.num_rows) if progress else None
        parts = []
        for b in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            interrupt.check()
            part = pa.Table.from_batches(b.to_batches()) if isinstance(b, pa.Table) else b
            parts.append(part)
            if progress:
                progress.advance(task_id, part.num_rows)
        scores = pa.concat_tables(parts).cast(SCORE_SCHEMA)
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


def scoring_input(cfg: Config, root: RunRoot) -> pa.Table:
    """The instances of the current plan joined with their latest prediction (follow-up parents left out), and
    that prediction's fingerprint (`prediction_fingerprint`), which each score row keeps."""
    columns = [n for n in INSTANCE_SCHEMA.names if n not in ("prompt", "prompt_token_ids")]
    instances = in_plan(cfg, root.read_stage("instances", INSTANCE_SCHEMA, columns=columns))
    chained = parents_with_followups(instances)  # first calls of complete chains: only the last call counts
    if chained:
        instances = instances.filter(pc.invert(pc.is_in(instances["instance_id"], value_set=pa.array(list(chained)))))
    preds = latest_predictions(root.read_stage("predictions", PREDICTION_SCHEMA))
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
