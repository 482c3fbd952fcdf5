"""Whether a run root's scores can be reported: every score row against the prediction it scored (by that
prediction's fingerprint) and against the current plan. One check serves `status.json`, `report`, `compare` and
tracking, so they all say the same thing about the same root, in the same words.

A prediction's fingerprint hashes its metadata columns (`PREDICTION_KEY`): a new engine call for the same instance
differs in latency, replica or engine step, so a score row whose `prediction_fingerprint` differs from its
instance's latest prediction scored an earlier call. The output text is never read for it: metadata paths stay
cheap (`tests/store/test_metadata_reads.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

import pyarrow as pa

from longeval.config import Config
from longeval.planning.plan import in_plan, make_plan
from longeval.records import (
    INSTANCE_SCHEMA,
    PREDICTION_SCHEMA,
    SCORE_SCHEMA,
    ErrorKind,
    content_id,
    latest_predictions,
)
from longeval.run.asked import only_asked
from longeval.stages.followup import parents_with_followups
from longeval.store.run_root import RunRoot

PREDICTION_KEY = ("instance_id", "attempt", "model_id", "output_tokens", "finish_reason", "cached_prompt_tokens",
                  "latency_s", "error", "replica", "node", "engine_step")
"""The prediction columns its fingerprint hashes: one engine call's identity (`attempt`, a fresh id per row; in
older roots, null, the metadata alone), without its output text."""


def prediction_fingerprints(preds: pa.Table) -> pa.Array:
    """One fingerprint per prediction row (`PREDICTION_KEY`; a column an older root lacks counts as null).
    Rows become Python values a batch at a time, so a suite's predictions never all are at once."""
    out: list[str] = []
    for batch in preds.to_batches(max_chunksize=4096):
        columns = [batch[c].to_pylist() if c in batch.schema.names else [None] * batch.num_rows
                   for c in PREDICTION_KEY]
        out += [content_id(*values) for values in zip(*columns, strict=True)]
    return pa.array(out, pa.string())


class State(StrEnum):
    """What a report on the root may say: the exit code of `report` and `compare` follows it (`EXIT_CODES`)."""

    CURRENT = "current"
    """Every planned instance predicted and scored, every score from its instance's latest prediction."""
    PARTIAL = "partial"
    """Some planned instances are not predicted or not scored yet (or their scores cannot be checked): the
    numbers are right for what is there, and cover less than the plan."""
    STALE = "stale"
    """Some scores come from a prediction that changed or is gone: a number would be wrong, so reports refuse."""


@dataclass(frozen=True)
class Consistency:
    """Counts of a run root's instances, predictions and scores against its plan (`check_consistency`)."""

    shards_planned: int
    shards_written: int
    instances: int
    """Planned instances the root holds (follow-up calls included)."""
    predicted: int
    """... with a final prediction."""
    engine_errors: int
    """... whose latest prediction is an engine error (retried by the next `infer`)."""
    not_predicted: int
    """... with no prediction at all."""
    scored: int
    """Planned instances with a score row."""
    not_scored: int
    """Planned instances with a prediction but no score row."""
    stale_scores: int
    """Score rows whose prediction changed since they were scored."""
    scores_without_prediction: int
    """Score rows whose instance has no prediction any more (a predictions shard deleted or set aside)."""
    unverified_scores: int
    """Score rows written before scores recorded their prediction's fingerprint: cannot be checked."""
    outside_plan: int
    """Score rows of instances the current plan does not hold (a reused root): left out of every number."""

    @property
    def state(self) -> State:
        if self.stale_scores or self.scores_without_prediction:
            return State.STALE
        missing = (self.shards_written < self.shards_planned or self.predicted < self.instances or self.not_scored
                   or self.unverified_scores)
        return State.PARTIAL if missing else State.CURRENT

    @property
    def complete(self) -> bool:
        return self.state is State.CURRENT

    @property
    def predictions_complete(self) -> bool:
        """Every planned instance shard written and every planned instance with a final prediction: what `infer`
        alone must leave (scoring them is `score`'s work)."""
        return self.shards_written >= self.shards_planned and self.predicted == self.instances

    def one_line(self, where: str) -> str:
        """What is stale, missing or partial about the run root `where` and what to run, in one line ("" when
        current)."""
        problems = []
        if self.stale_scores:
            problems.append(f"{self.stale_scores} scores are stale (their prediction changed after scoring)")
        if self.scores_without_prediction:
            problems.append(f"{self.scores_without_prediction} scores have no prediction (its shard is gone)")
        if self.shards_written < self.shards_planned:
            problems.append(f"{self.shards_planned - self.shards_written} of {self.shards_planned} planned instance "
                            "shards are missing")
        if self.not_predicted or self.engine_errors:
            problems.append(f"{self.instances - self.predicted} of {self.instances} instances are not predicted "
                            f"({self.engine_errors} engine errors, {self.not_predicted} not run yet)")
        if self.not_scored:
            problems.append(f"{self.not_scored} predictions are not scored")
        if self.unverified_scores:
            problems.append(f"{self.unverified_scores} scores predate prediction fingerprints and cannot be checked")
        if not problems:
            return ""
        if self.state is State.STALE:
            return (f"stale scores in {where}: {'; '.join(problems)}; no numbers reported. Run `longeval run` with "
                    "the run's overrides to predict and rescore what changed (finished work is kept)")
        failed = f" ({self.engine_errors} engine errors count as 0)" if self.engine_errors else ""
        return (f"partial run {where}: {'; '.join(problems)}; the numbers cover {self.scored} of "
                f"{self.instances} instances{failed}. Rerun the same command to finish (`longeval run` with the run's "
                "overrides; finished work is kept)")

    def as_status(self) -> dict:
        """status.json: the counts, `state`, and `complete` (true only when current)."""
        return {**asdict(self), "state": self.state.value, "complete": self.complete}


SUMMARY_INPUT = "summary_input.json"
"""Which scores the summaries were computed from (the scores shard's sha256): a report recomputes older ones."""


def scores_digest(root: RunRoot) -> str | None:
    """The committed scores shard's sha256 (from its commit record), None when there are no scores."""
    return root.commit_record("scores", "scores").get("sha256") if root.has("scores", "scores") else None


def summaries_current(root: RunRoot) -> bool:
    """Whether `summary/` was computed from the scores now committed (False for summaries written before
    `SUMMARY_INPUT` was)."""
    written = root.json_if_exists(SUMMARY_INPUT)
    return written is not None and written.get("scores") == scores_digest(root)


EXIT_CODES = {State.CURRENT: 0, State.PARTIAL: 3}
"""`report` and `compare` exit codes: 0 complete and current, 3 partial; stale scores are refused (exit 2, an
error line) and an interrupt is 130."""
PARTIAL_EXIT = EXIT_CODES[State.PARTIAL]


def check_consistency(planned: set[str], chained: set[str], predictions: pa.Table, scores: pa.Table, *,
                      shards_planned: int, shards_written: int) -> Consistency:
    """Scores against predictions against the plan (pure).

    Args:
        planned: the ids of the planned instances the root holds (follow-up calls included).
        chained: first calls whose follow-up exists: they are never scored (only the last call counts).
        predictions: prediction rows, every attempt (at least `PREDICTION_KEY`'s columns that exist).
        scores: score rows (`instance_id`, `prediction_fingerprint`; null where an older longeval scored).
        shards_planned, shards_written: the plan's instance shards and those written.
    """
    latest = latest_predictions(predictions)
    fingerprints = dict(zip(latest["instance_id"].to_pylist(), prediction_fingerprints(latest).to_pylist(),
                            strict=True))
    failed = {i for i, e in zip(latest["instance_id"].to_pylist(), latest["error"].to_pylist(), strict=True)
              if ErrorKind.of(e) is ErrorKind.ENGINE_ERROR} & planned
    has_prediction = set(fingerprints) & planned
    stale = orphaned = unverified = outside = 0
    scored: set[str] = set()
    for iid, fingerprint in zip(scores["instance_id"].to_pylist(), scores["prediction_fingerprint"].to_pylist(),
                                strict=True):
        if iid not in planned:
            outside += 1
            continue
        scored.add(iid)
        if iid not in fingerprints:
            orphaned += 1
        elif fingerprint is None:
            unverified += 1
        elif fingerprint != fingerprints[iid]:
            stale += 1
    return Consistency(
        shards_planned=shards_planned, shards_written=shards_written, instances=len(planned),
        predicted=len(has_prediction - failed), engine_errors=len(failed), not_predicted=len(planned - has_prediction),
        scored=len(scored), not_scored=len((has_prediction - chained) - scored), stale_scores=stale,
        scores_without_prediction=orphaned, unverified_scores=unverified, outside_plan=outside)


INSTANCE_KEY = ["instance_id", "family", "task", "target_length", "seed", "index", "meta"]
"""The instance columns `check_root` reads: the plan's keys and `meta` (which first calls have a follow-up)."""


def planned_ids(cfg: Config, root: RunRoot) -> pa.Array:
    """The instance ids of the current plan that the run root holds."""
    cols = ["instance_id", "family", "task", "target_length", "seed", "index"]
    return in_plan(cfg, root.read_stage("instances", INSTANCE_SCHEMA, columns=cols))["instance_id"]


def check_root(root: RunRoot, cfg: Config | None) -> Consistency:
    """`check_consistency` on a run root's metadata columns (never prompts or outputs), against `cfg`'s plan;
    with no config (a root without config.yaml) every instance the root holds is the plan."""
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=INSTANCE_KEY)
    written = root.shard_names("instances")
    if cfg is None:
        planned_shards = written
    else:
        instances = only_asked(cfg, root, in_plan(cfg, instances))  # adaptive: positions not asked are not planned
        planned_shards = {spec.name for spec in make_plan(cfg, check_data=False).shards}
        if cfg.suite.adaptive:  # an adaptive run plans its shards round by round: those written are the plan
            planned_shards &= written
    return check_consistency(
        set(instances["instance_id"].to_pylist()), parents_with_followups(instances),
        root.read_stage("predictions", PREDICTION_SCHEMA, columns=list(PREDICTION_KEY)),
        root.read_stage("scores", SCORE_SCHEMA, columns=["instance_id", "prediction_fingerprint"]),
        shards_planned=len(planned_shards), shards_written=len(written & planned_shards))
