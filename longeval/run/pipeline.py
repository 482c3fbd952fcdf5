"""A run: generate -> infer -> score -> summarise (`longeval/stages/`), each resumable on a run root.

Every stage reads what the previous one wrote under the run root and writes Parquet shards atomically,
so a crash loses at most the shards in flight and a rerun on the same root skips what is done:
finished instance shards, instances that already have a prediction, and so on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from longeval.cluster.ray_runtime import check_shared_storage, init_ray
from longeval.cluster.ray_runtime import unwrap_ray_errors as _unwrap_ray_errors
from longeval.config import Config, redactor
from longeval.config.redaction import redacted_logs
from longeval.engines.models import resolve_model_path
from longeval.errors import ConfigError, DamagedShardError, StaleScoresError, StoreError
from longeval.planning.plan import Plan, make_plan
from longeval.run.adaptive_rounds import run_rounds, write_adaptive
from longeval.run.asked import only_asked
from longeval.run.consistency import Consistency, State, check_root
from longeval.run.provenance import check_same_config, older_default_root, write_provenance
from longeval.stages.followup import write_followups
from longeval.stages.generate import generate, preflight
from longeval.stages.infer import infer, pending_predictions
from longeval.stages.score import score, score_fingerprint, scores_current
from longeval.stages.summarise import RunResult, report
from longeval.store import lease
from longeval.store.commits import LEGACY_STAGES
from longeval.store.run_root import RunRoot
from longeval.tracking import wandb_run as tracking

log = logging.getLogger(__name__)


STAGES = ("generate", "infer", "score", "report")


def run(cfg: Config, *, stages: Iterable[str] = STAGES, progress=None) -> RunResult:
    """Run `stages` on the config's run root, holding the root's lease (`longeval.store.lease`): a second run that would
    generate or infer on the same root refuses, one that only scores or reports warns.

    What needs no Ray is checked before anything is written (the config, the data files, the root's own config),
    and a run refused before it committed any shard removes what it wrote (`_undone_if_refused`): the next command
    on the root is not judged against a run that never happened."""
    stages = list(stages)
    with redacted_logs(redactor(cfg)):
        if cfg.suite.adaptive and len({"generate", "infer"} & set(stages)) == 1:
            raise ConfigError("an adaptive run (suite.adaptive=true) decides each round's shards from the last "
                              "round's scores: run generate and infer together (`longeval run`)")
        plan = make_plan(cfg)  # `plan.check_config` and the data files: refused here, nothing is written yet
        model_path = str(resolve_model_path(cfg.model.path))
        root = RunRoot(cfg.run_root, remember_listings=True)  # stages others write say so (`written_elsewhere`)
        root.probe()  # a wrong endpoint, bucket or key fails now; later S3 errors are waited out (store.py)
        check_same_config(cfg, RunRoot(cfg.run_root))  # refused before the lease; `_run` checks again under it
        created = _created_folders(root)
        own = (*OWN_FILES, tracking.STATE_FILE) if cfg.tracking.backend == "wandb" else OWN_FILES
        with (lease.hold(root, cfg.store, command=f"longeval {' '.join(stages)}",
                         writer=bool({"generate", "infer"} & set(stages))) as held,
              _undone_if_refused(root, held, own, created)):
            return _run(cfg, stages, root, progress, plan, model_path)


OWN_FILES = ("config.yaml", "versions.json")
"""The files a run writes at its root before its first shard (and `tracking.STATE_FILE` with W&B): a run refused
before any commit removes those it created (never one that was there before)."""


def _created_folders(root: RunRoot) -> list[Path]:
    """The local folders a run on `root` would create, deepest first: the run folder and its missing parents (none
    on S3, which has no folders)."""
    path = root.local_path()
    if path is None:
        return []
    return [folder for folder in (path, *path.parents) if not folder.exists()]


@contextmanager
def _undone_if_refused(root: RunRoot, held: lease.Lease | None, own: tuple[str, ...],
                       created: list[Path]) -> Iterator[None]:
    """Remove what the block wrote when it fails before any shard was committed: the files of `own` it created,
    its claim on a lease no run held before (`Lease.withdraw`), and the folders in `created` left empty. Files and
    claims that were there before stay; so does everything once a shard was committed. Only under the lease
    (`held`): a reader going on beside another run's writer cannot tell its files from the writer's."""
    if held is None:
        yield
        return
    absent = [name for name in own if not root.exists(name)]  # under the lease: no other writer
    before = _commits(root) if absent or created or held.first else None  # a resumed root: nothing to list
    try:
        yield
    except Exception:
        if before is not None and _commits(root) == before:
            for name in absent:
                if root.exists(name):
                    root.delete(name)
            held.withdraw()
            for folder in created:  # deepest first; one left non-empty (another run's files) stops it
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise


def _commits(root: RunRoot) -> frozenset[tuple[str, str]]:
    """Every commit record of the root (stage, name), listed afresh: whether a command committed a shard."""
    return frozenset((stage, name) for stage in LEGACY_STAGES for name in root.files(f"_manifest/{stage}"))


def _run(cfg: Config, stages: list[str], root: RunRoot, progress, plan: Plan, model_path: str) -> RunResult:
    adopted = root.adopt_legacy()  # a run root from before commit records: keep its finished work
    if adopted:
        log.warning("run root %s predates commit records: adopted its %d finished shards", root.uri, adopted)
    older = older_default_root(cfg)
    if older:
        log.warning("run root %s holds this adaptive run sampled under the earlier defaults (shards of 10, constant "
                    "rounds, equal alpha split); this run starts %s with suite.adaptive_target=%s's defaults. To "
                    "resume the older root instead: run_name=%s suite.shard_size=10 suite.adaptive_growth=1.0 "
                    "suite.adaptive_round_max=0 suite.adaptive_alpha_split=equal suite.adaptive_column_power=1 "
                    "suite.adaptive_step=10 (docs/adaptive.md)", older,
                    root.uri, cfg.suite.adaptive_target, older.rstrip("/").rsplit("/", 1)[-1])
    check_same_config(cfg, root)
    if "generate" not in stages and not root.shard_names("instances"):  # (a mistyped run_name or store.root)
        raise StoreError(f"run root {root.uri} holds no instances: nothing to {' or '.join(stages)}; check that the "
                         "overrides name the run you meant (store.root, run_name, model, suite), or generate it first: "
                         "`longeval run` with these overrides")
    if "generate" in stages and missing_shards(plan, root):  # nothing to generate: no instance to try first
        preflight(cfg, plan, model_path)
    write_provenance(cfg, root, model_path)
    tracker = tracking.start_tracking(cfg, root)  # W&B errors are warnings: tracking never fails the run
    try:
        if _retry_damaged(work_left, cfg, plan, root, model_path, stages):
            init_ray(cfg)
            check_shared_storage(cfg, root)
        elif {"generate", "infer", "score"} & set(stages):
            log.warning("nothing left to do in %s: every shard, prediction and score is there (Ray not started)",
                        root.uri)
        if cfg.suite.adaptive and {"generate", "infer"} <= set(stages):
            _unwrap_ray_errors(run_rounds, cfg, root, model_path, progress)
            scores = _unwrap_ray_errors(score, cfg, root, progress) if "score" in stages else None
        else:
            scores = _run_stages(cfg, plan, root, model_path, stages, progress)
        if "report" in stages:
            result = report(cfg, root, scores)
            if cfg.suite.adaptive:
                result.adaptive = write_adaptive(cfg, root, scores)
            tracker.log_results()
        else:
            result = RunResult(root=root.uri, consistency=_checked(cfg, root, stages))
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
    result.tracking = tracker.describe()
    return result


def _checked(cfg: Config, root: RunRoot, stages: list[str]) -> Consistency | None:
    """The root checked after `score` or `infer` without `report`, so the command says what it left partial (exit 3,
    `cli.cmd_run`) as `report` would: `score` whether its scores cover the plan, refused when stale as `report`
    refuses; `infer` whether every planned instance has a final prediction (its scores are `score`'s)."""
    if not {"infer", "score"} & set(stages):
        return None
    consistency = check_root(root, cfg)
    if "score" in stages and consistency.state is State.STALE:  # predictions redone while it scored
        raise StaleScoresError(consistency.one_line(root.uri))
    return consistency


def work_left(cfg: Config, plan: Plan, root: RunRoot, model_path: str, stages: list[str]) -> bool:
    """Whether any stage has work for Ray: a missing instance shard, an instance without a final prediction
    (follow-up calls written first, on the driver) or scores out of date. A finished run's rerun then goes
    straight to the report, without starting Ray."""
    if "generate" in stages and missing_shards(plan, root):
        return True
    if "infer" in stages:
        write_followups(cfg, root, model_path)
        meta, done = pending_predictions(root)
        if set(only_asked(cfg, root, meta)["instance_id"].to_pylist()) - done:
            return True
    return "score" in stages and not scores_current(root, score_fingerprint(cfg, root))


def missing_shards(plan: Plan, root: RunRoot) -> set[str]:
    """The planned instance shards the root does not hold yet."""
    return {s.name for s in plan.shards} - root.shard_names("instances")


DAMAGE_RETRIES = 3
"""How often a run redoes its stages after setting damaged shards aside (each pass sets aside those it meets)."""


def _retry_damaged(fn, *args):
    """`fn(*args)`, again after a damaged shard was set aside (its message is the warning)."""
    for attempt in range(DAMAGE_RETRIES + 1):
        try:
            return fn(*args)
        except DamagedShardError as exc:
            if attempt == DAMAGE_RETRIES:
                raise
            log.warning("%s; this command writes it again now", exc.found)
    return None


def _run_stages(cfg: Config, plan: Plan, root: RunRoot, model_path: str, stages: list[str], progress):
    """generate, infer and score; a damaged shard met on the way is set aside (store.py) and the stages run again,
    so it is redone."""
    for attempt in range(DAMAGE_RETRIES + 1):
        try:
            if "generate" in stages:
                _unwrap_ray_errors(generate, cfg, plan, root, model_path, progress)
            if "infer" in stages:
                _unwrap_ray_errors(infer, cfg, plan, root, model_path, progress)
            return _unwrap_ray_errors(score, cfg, root, progress) if "score" in stages else None
        except DamagedShardError as exc:
            if attempt == DAMAGE_RETRIES:
                raise
            log.warning("%s; this command writes it again now", exc.found)
            root.forget_listings()  # set aside by a replica or a generation actor: list the stages again
            init_ray(cfg)  # redoing the shard needs Ray even when the run looked finished
    return None
