"""The Ray Data graph: generate -> infer -> score -> report, each stage resumable on a run root.

Every stage reads what the previous one wrote under the run root and writes Parquet shards atomically,
so a crash loses at most the shards in flight and a rerun on the same root skips what is done:
finished instance shards, instances that already have a prediction, and so on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longeval import __version__, interrupt
from longeval.aggregate import cumulative, error_table, headline, length_table, summarise
from longeval.config import Config, to_yaml
from longeval.infer import infer, pending_predictions
from longeval.plan import Plan, ShardSpec, in_plan, make_plan
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.store import RunRoot
from longeval.tasks import FAMILIES, sampling

log = logging.getLogger(__name__)

STAGES = ("generate", "infer", "score", "report")
SLICE_BY = ("model_id", "family", "task", "complexity", "target_length")
"""Scores per instance configuration: SYNC's node and language counts, Michelangelo's complexity and IDK's
known/unknown answers."""


@dataclass
class RunResult:
    root: str
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """The summary tables by name (`summary/<name>`): the common ones and those the suite's families declare."""
    status: dict | None = None
    """`run_status`: whether every planned shard and every instance's prediction is there."""
    tracking: str | None = None
    """Where the W&B run went (`tracking=wandb`), for the end of the output."""
    adaptive: dict | None = None
    """`suite.adaptive`: the per-cell and effective-length tables and the compute spent (longeval.adaptive_run)."""

    @property
    def summary(self) -> pa.Table | None:
        return self.tables.get("tasks")

    @property
    def lengths(self) -> pa.Table | None:
        return self.tables.get("lengths")

    @property
    def headline(self) -> pa.Table | None:
        return self.tables.get("headline")

    @property
    def errors(self) -> pa.Table | None:
        return self.tables.get("errors")


# -- generate ---------------------------------------------------------------------------------------


class ShardGenerator:
    """Ray Data callable: shard specs in, one written instance shard each out.

    An actor keeps the tokenizer and encoded corpora across shards, so start-up is paid once.
    """

    def __init__(self, cfg: Config, model_path: str, root_uri: str) -> None:
        from longeval.instance_cache import InstanceCache, cache_uri

        self.root = RunRoot(root_uri)
        self.ctx = make_context(cfg, model_path)
        self.cache = (InstanceCache(cache_uri(cfg.store.root, cfg.store.instance_cache))
                      if cfg.store.cache_instances else None)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        from longeval.instance_cache import shard_key

        names, counts, cached = [], [], []
        for i in range(len(batch["task"])):
            spec = ShardSpec(**{k: _py(batch[k][i]) for k in ShardSpec.__dataclass_fields__})
            key = shard_key(self.ctx, spec) if self.cache else None
            table = self.cache.load(key) if self.cache else None
            hit = table is not None
            if table is None:
                table = generate_shard(self.ctx, spec)
                if self.cache:
                    self.cache.save(key, table)
            self.root.write_table("instances", spec.name, table)
            names.append(spec.name)
            counts.append(table.num_rows)
            cached.append(hit)
        return {"shard": names, "instances": counts, "cached": cached}


def make_context(cfg: Config, model_path: str):
    """The generation context for a run: the model's tokenizer, the prompt format, the data paths (and the
    `plugins`, imported here too, so tasks they register exist in every generation actor)."""
    from longeval.scoring.deadline import import_plugins
    from longeval.tasks.base import DataPaths, GenContext
    from longeval.text.render import prompt_format
    from longeval.text.tokenizer import load_encoder

    import_plugins(cfg.plugins)
    return GenContext(encoder=load_encoder(model_path), fmt=prompt_format(cfg.model),
                      data=DataPaths(**asdict(cfg.suite.data)), task_overrides=dict(cfg.suite.params))


def _py(value):
    return value.item() if hasattr(value, "item") else value


def generate_shard(ctx, spec: ShardSpec) -> pa.Table:
    """Instances [start, stop) of one task and length: pure, and the same with any sharding."""
    from longeval.tasks import get_task
    from longeval.tasks.base import context_rng, instance_rng, make_instance, output_budget

    task = get_task(spec.task, ctx.task_overrides)
    rows = []
    for index in range(spec.start, spec.stop):
        rng = instance_rng(spec.seed, task.key, spec.target_length, index)
        shared = {"context_rng": context_rng(spec.seed, task.context_group, spec.target_length, index)} \
            if task.context_group else {}
        draft = task.generate(
            ctx, task.params, target_length=spec.target_length,
            max_new_tokens=output_budget(task, ctx.fmt, spec.target_length), rng=rng, index=index, **shared,
        )
        rows.append(make_instance(task, draft, ctx, target_length=spec.target_length, seed=spec.seed,
                                  shard_index=spec.shard_index, index=index).to_row())
    return pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA)


NO_ACTOR_RESTARTS = {"max_restarts": 0}
"""Ray Data restarts its pool actors by default, and since it hands them their constructor arguments through the
object store, every run printed an error-level line (ray #53727) that such restarts might fail. Our stages need no
restarts: a dead actor fails the stage, and the rerun resumes from the committed shards. (map_batches takes it
through its `ray_remote_args`, which Ray 2.5x marks deprecated for 2.64 and offers no named parameter for yet.)"""


def generate(cfg: Config, plan: Plan, root: RunRoot, model_path: str, progress=None) -> int:
    """Write every missing instance shard; returns how many were written."""
    import ray

    done = root.shard_names("instances")
    todo = [s for s in plan.shards if s.name not in done]
    if not todo:
        return 0
    if len(todo) < len(plan.shards):
        log.warning("resuming: %d of %d instance shards already written, %d to generate",
                    len(plan.shards) - len(todo), len(plan.shards), len(todo))
    size = max(1, min(cfg.cluster.generate_parallelism, len(todo)))
    ds = ray.data.from_items([s.to_row() for s in todo]).map_batches(
        ShardGenerator,
        fn_constructor_kwargs={"cfg": cfg, "model_path": model_path, "root_uri": root.uri},
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=size),
        num_cpus=1,
        **NO_ACTOR_RESTARTS,
    )
    task_id = progress.add_task("generate shards", total=len(todo)) if progress else None
    written = hits = 0
    for batch in ds.iter_batches(batch_size=1, batch_format="numpy"):
        interrupt.check()
        written += len(batch["shard"])
        hits += int(np.sum(batch["cached"]))
        if progress:
            progress.advance(task_id, len(batch["shard"]))
            if hits:
                progress.update(task_id, description=f"generate shards ({hits} from cache)")
    if hits:
        log.info("%d of %d instance shards came from the instance cache", hits, written)
    return written


# -- infer: longeval.infer -------------------------------------------------------------------------


# -- score ------------------------------------------------------------------------------------------


class Scorer:
    """Ray Data callable: instance + prediction rows in, score rows out (scorers never raise on output).

    Each call runs in a child process under `cluster.scorer_timeout_s` (`longeval.scoring.deadline`), so one
    pathological output costs a `scorer_timeout` row, not the run.
    """

    def __init__(self, timeout_s: float, plugins: list[str]) -> None:
        from longeval.scoring.deadline import DeadlineScorer
        from longeval.tasks import judge_for

        self.scorer = DeadlineScorer(timeout_s, judge_for, plugins)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist(self.scorer.score_rows(batch.to_pylist()), schema=SCORE_SCHEMA)


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


def score_fingerprint(cfg: Config, root: RunRoot) -> str:
    """A hash of everything the scores depend on: the committed instance and prediction shards (names and
    contents: a retried prediction part can keep its name), the suite, the scorer settings and longeval's version."""
    from longeval.config import suite_hash

    def digests(stage: str) -> dict[str, str | None]:
        return {name: root.commit_record(stage, name).get("sha256") for name in sorted(root.shard_names(stage))}

    blob = json.dumps({"instances": digests("instances"), "predictions": digests("predictions"),
                       "suite": suite_hash(cfg.suite),
                       "timeout": cfg.cluster.scorer_timeout_s, "plugins": cfg.plugins, "longeval": __version__},
                      sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def scores_current(root: RunRoot, fingerprint: str) -> bool:
    """Whether the committed scores were computed from exactly this input."""
    if not root.has("scores", "scores") or not root.exists(SCORE_INPUT):
        return False
    return root.read_json(SCORE_INPUT).get("fingerprint") == fingerprint


def scoring_input(cfg: Config, root: RunRoot) -> pa.Table:
    """The instances of the current plan joined with their latest prediction (follow-up parents left out)."""
    from longeval.followup import parents_with_followups

    columns = [n for n in INSTANCE_SCHEMA.names if n not in ("prompt", "prompt_token_ids")]
    instances = in_plan(cfg, root.read_stage("instances", INSTANCE_SCHEMA, columns=columns))
    chained = parents_with_followups(instances)  # first calls of complete chains: only the last call counts
    if chained:
        instances = instances.filter(pc.invert(pc.is_in(instances["instance_id"], value_set=pa.array(list(chained)))))
    preds = _latest(root.read_stage("predictions", PREDICTION_SCHEMA))
    return _join(instances, preds)


def planned_ids(cfg: Config, root: RunRoot) -> pa.Array:
    """The instance ids of the current plan that the run root holds."""
    cols = ["instance_id", "family", "task", "target_length", "seed", "index"]
    return in_plan(cfg, root.read_stage("instances", INSTANCE_SCHEMA, columns=cols))["instance_id"]


def _join(instances: pa.Table, preds: pa.Table) -> pa.Table:
    """Instances with their prediction's columns (Arrow's join cannot carry list columns)."""
    where = pc.index_in(instances["instance_id"], value_set=preds["instance_id"])
    found = pc.is_valid(where)
    left, right = instances.filter(found), preds.take(where.filter(found))
    for name in PREDICTION_SCHEMA.names:
        if name != "instance_id":
            left = left.append_column(name, right[name])
    return left


def _latest(preds: pa.Table) -> pa.Table:
    """One prediction per instance: a final one if any (an engine error is replaced by its retry)."""
    seen: dict[str, int] = {}
    for i, (iid, err) in enumerate(zip(preds["instance_id"].to_pylist(), preds["error"].to_pylist(), strict=True)):
        if iid not in seen or not err.startswith("engine_error"):
            seen[iid] = i
    return preds.take(pa.array(sorted(seen.values()), pa.int64()))


# -- report -----------------------------------------------------------------------------------------


def report(cfg: Config, root: RunRoot, scores: pa.Table | None = None) -> RunResult:
    """Summaries per task x length, per length, and the headline numbers; written as Parquet, CSV, JSON."""
    import pyarrow.csv as pacsv

    if scores is None:
        scores = root.read_stage("scores", SCORE_SCHEMA)
    dropped = scores.num_rows
    scores = scores.filter(pc.is_in(scores["instance_id"], value_set=planned_ids(cfg, root)))
    if dropped > scores.num_rows:
        log.warning("run root %s holds %d scored instances outside the current suite: left out of the summaries",
                    root.uri, dropped - scores.num_rows)
    summary = summarise(scores)
    lengths = length_table(summary, scores=scores)
    head = headline(lengths, threshold=cfg.suite.effective_threshold, scores=scores)
    scheme = sampling()
    weights = scheme.weights(cfg.suite.lengths, cfg.suite.subsets) if cfg.suite.subsets and scheme else None
    curve = cumulative(scores, weights)
    errors = error_table(scores)
    tables = {"tasks": summary, "lengths": lengths, "headline": head, "cumulative": curve, "errors": errors}
    if "complexity" in scores.column_names:
        labelled = scores.filter(pc.not_equal(pc.fill_null(scores["complexity"], ""), ""))
        if labelled.num_rows:
            tables["slices"] = summarise(labelled, by=SLICE_BY)
    present = set(summary["family"].to_pylist())
    for family in FAMILIES.values():
        if family.name in present and family.tables:
            rows = rows_with_meta(root, scores, family.name)
            tables.update({table.name: table.build(summary, rows) for table in family.tables})
    for name, table in tables.items():
        root.write_table("summary", name, table)
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        root.write_text(f"summary/{name}.csv", sink.getvalue().to_pybytes().decode("utf-8"))
    root.write_json("summary.json", {name: table.to_pylist() for name, table in tables.items()})
    status = run_status(cfg, root)
    root.write_json("status.json", status)
    return RunResult(root=root.uri, tables=tables, status=status)


def run_status(cfg: Config, root: RunRoot) -> dict:
    """Whether the run is complete: every planned instance shard committed and every instance (follow-up calls
    included) with a final prediction. Summaries of an incomplete run are partial, and say so."""
    planned = {spec.name for spec in make_plan(cfg, check_data=False).shards}
    if cfg.suite.adaptive:  # an adaptive run plans its shards round by round: those written are the plan
        planned &= root.shard_names("instances")
    written = root.shard_names("instances") & planned
    meta, done = pending_predictions(root)
    ids = set(meta["instance_id"].to_pylist())
    preds = root.read_stage("predictions", PREDICTION_SCHEMA, columns=["instance_id", "error"])
    failed = {i for i, e in zip(preds["instance_id"].to_pylist(), preds["error"].to_pylist(), strict=True)
              if e.startswith("engine_error")} - done
    missing = ids - done
    return {"complete": written == planned and not missing, "shards_planned": len(planned),
            "shards_written": len(written), "instances": len(ids), "predicted": len(ids & done),
            "engine_errors": len(failed & ids), "not_predicted": len(missing - failed)}


def rows_with_meta(root: RunRoot, scores: pa.Table, family: str) -> dict[str, list[dict]]:
    """One family's score rows with their instance's `meta` JSON, per model (for family-specific tables)."""
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "family", "meta"])
    mine = instances.filter(pc.equal(instances["family"], family))
    meta = dict(zip(mine["instance_id"].to_pylist(), mine["meta"].to_pylist(), strict=True))
    rows: dict[str, list[dict]] = {}
    for row in scores.filter(pc.equal(scores["family"], family)).to_pylist():
        rows.setdefault(row["model_id"], []).append({**row, "meta": meta.get(row["instance_id"], "{}")})
    return dict(sorted(rows.items()))


# -- provenance -------------------------------------------------------------------------------------


def write_provenance(cfg: Config, root: RunRoot, model_path: str) -> None:
    """The resolved config and every version and fingerprint needed to reproduce a number."""
    from longeval.tasks.base import DataPaths, data_fingerprint
    from longeval.tasks.ruler.templates import TEMPLATES_FINGERPRINT
    from longeval.text.corpus import load_essays
    from longeval.text.ruler_format import RULER_MODEL_TEMPLATES_FINGERPRINT
    from longeval.text.tokenizer import chat_template_fingerprint, load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(model_path)
    corpus = load_essays(cfg.suite.data.essay_dir)
    versions = {
        "longeval": __version__,
        "python": platform.python_version(),
        **{name: _version(name) for name in ("vllm", "ray", "transformers", "tokenizers", "torch", "pyarrow")},
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "ruler_templates_fingerprint": TEMPLATES_FINGERPRINT,
        "ruler_model_templates_fingerprint": RULER_MODEL_TEMPLATES_FINGERPRINT,
        "essay_corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "words": corpus.words},
        "data_fingerprint": data_fingerprint(DataPaths(**asdict(cfg.suite.data))),
        "model_path": model_path,
    }
    root.write_text("config.yaml", to_yaml(cfg))
    root.write_json("versions.json", versions)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in (dist, f"{dist}-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


# -- the whole run ----------------------------------------------------------------------------------


# Ray puts Unix sockets at <temp_dir>/session_<date>_<time>_<pid>/sockets/plasma_store, 62 to 66 bytes
# below its temp dir, and AF_UNIX paths stop at 107 bytes.
_RAY_SOCKET_SUFFIX = 66  # 62 with a 5-digit pid; room for 7 digits and a longer date
_AF_UNIX_MAX = 107


def ray_temp_dir(tmp: str | None = None) -> str:
    """Ray's temp dir under TMPDIR when its socket paths fit there, else a short one under /tmp.

    A long TMPDIR (a deep CI checkout, a per-test scratch folder) would otherwise make `ray.init`
    fail with "AF_UNIX path length cannot exceed 107 bytes".
    """
    tmp = tmp or tempfile.gettempdir()
    under_tmp = os.path.join(tmp, "ray")
    if len(under_tmp.encode()) + _RAY_SOCKET_SUFFIX <= _AF_UNIX_MAX:
        return under_tmp
    digest = hashlib.sha256(tmp.encode()).hexdigest()[:8]
    return f"/tmp/ray-{digest}"  # one per TMPDIR, so concurrent sessions with their own TMPDIR stay apart


def init_ray(cfg: Config) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if cfg.cluster.address:
        kwargs["address"] = cfg.cluster.address
    elif os.environ.get("RAY_ADDRESS"):  # inside `ray job submit`: join the job's cluster as it is
        pass
    else:
        kwargs["num_cpus"] = cfg.cluster.num_cpus or max(2, os.cpu_count() or 2)
        kwargs["_temp_dir"] = ray_temp_dir()
    ray.init(**kwargs)
    # Our own progress bars stand in for Ray Data's; its INFO lines go to Ray's log files, not the terminal
    # (LONGEVAL_LOG=INFO brings them back).
    ctx = ray.data.DataContext.get_current()  # importing ray.data sets up its loggers: adjust them after
    logging.getLogger("ray.data").setLevel(os.environ.get("LONGEVAL_LOG", "ERROR"))
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # Rows reach the engine in the same order and the same batches on every run: vLLM on CPU is not
    # batch-invariant, so identical greedy outputs need identical batch composition.
    ctx.execution_options.preserve_order = True


def preflight(cfg: Config, plan: Plan, model_path: str) -> None:
    """Generate the first instance of every task at its shortest length on the driver, before any Ray work.

    Bad data files, lengths too short for a template and similar mistakes then fail in a second with
    their own message, instead of inside a Ray actor after the cluster has spun up.
    """
    ctx = make_context(cfg, model_path)
    firsts: dict[str, ShardSpec] = {}
    for shard in sorted(plan.shards, key=lambda s: s.target_length):
        firsts.setdefault(shard.task, shard)
    for shard in firsts.values():
        one = ShardSpec(shard.task, shard.target_length, shard.seed, shard.shard_index, shard.start, shard.start + 1)
        generate_shard(ctx, one)


def _unwrap_ray_errors(fn, *args, **kwargs):
    """Re-raise a LongevalError that happened inside a Ray worker as itself, so the CLI prints it plainly."""
    from longeval.errors import LongevalError

    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        cause = exc
        while cause is not None and not isinstance(cause, LongevalError):
            cause = getattr(cause, "cause", None) or cause.__cause__
        if isinstance(cause, LongevalError):
            raise cause from exc
        raise


def run(cfg: Config, *, stages: Iterable[str] = STAGES, progress=None) -> RunResult:
    from longeval.models import resolve_model_path

    stages = list(stages)
    if cfg.suite.adaptive and len({"generate", "infer"} & set(stages)) == 1:
        from longeval.errors import ConfigError

        raise ConfigError("an adaptive run (suite.adaptive=true) decides each round's shards from the last round's "
                          "scores: run generate and infer together (`longeval run`)")
    model_path = str(resolve_model_path(cfg.model.path))
    plan = make_plan(cfg)
    root = RunRoot(cfg.run_root)
    root.probe()  # a wrong endpoint, bucket or key fails now; later S3 errors are waited out (store.py)
    adopted = root.adopt_legacy()  # a run root from before commit records: keep its finished work
    if adopted:
        log.warning("run root %s predates commit records: adopted its %d finished shards", root.uri, adopted)
    _check_same_config(cfg, root)
    if "generate" in stages:
        preflight(cfg, plan, model_path)
    write_provenance(cfg, root, model_path)
    from longeval import tracking

    tracker = tracking.start_tracking(cfg, root)  # W&B errors are warnings: tracking never fails the run
    try:
        if _retry_damaged(work_left, cfg, plan, root, model_path, stages):
            init_ray(cfg)
            check_shared_storage(cfg, root)
        elif {"generate", "infer", "score"} & set(stages):
            log.warning("nothing left to do in %s: every shard, prediction and score is there (Ray not started)",
                        root.uri)
        if cfg.suite.adaptive and {"generate", "infer"} <= set(stages):
            from longeval.adaptive_run import run_rounds  # adaptive rounds drive this module's stages

            _unwrap_ray_errors(run_rounds, cfg, root, model_path, progress)
            scores = _unwrap_ray_errors(score, cfg, root, progress) if "score" in stages else None
        else:
            scores = _run_stages(cfg, plan, root, model_path, stages, progress)
        if "report" in stages:
            result = report(cfg, root, scores)
            if cfg.suite.adaptive:
                from longeval.adaptive_run import write_adaptive

                result.adaptive = write_adaptive(cfg, root, scores)
            tracker.log_results()
        else:
            result = RunResult(root=root.uri)
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
    result.tracking = tracker.describe()
    return result


def work_left(cfg: Config, plan: Plan, root: RunRoot, model_path: str, stages: list[str]) -> bool:
    """Whether any stage has work for Ray: a missing instance shard, an instance without a final prediction
    (follow-up calls written first, on the driver) or scores out of date. A finished run's rerun then goes
    straight to the report, without starting Ray."""
    from longeval.followup import write_followups

    if "generate" in stages and {s.name for s in plan.shards} - root.shard_names("instances"):
        return True
    if "infer" in stages:
        write_followups(cfg, root, model_path)
        meta, done = pending_predictions(root)
        if set(meta["instance_id"].to_pylist()) - done:
            return True
    return "score" in stages and not scores_current(root, score_fingerprint(cfg, root))


DAMAGE_RETRIES = 3
"""How often a run redoes its stages after setting damaged shards aside (each pass sets aside those it meets)."""


def _retry_damaged(fn, *args):
    """`fn(*args)`, again after a damaged shard was set aside (its message is the warning)."""
    from longeval.errors import DamagedShardError

    for attempt in range(DAMAGE_RETRIES + 1):
        try:
            return fn(*args)
        except DamagedShardError as exc:
            if attempt == DAMAGE_RETRIES:
                raise
            log.warning("%s", exc)
    return None


def _run_stages(cfg: Config, plan: Plan, root: RunRoot, model_path: str, stages: list[str], progress):
    """generate, infer and score; a damaged shard met on the way is set aside (store.py) and the stages run again,
    so it is redone."""
    from longeval.errors import DamagedShardError

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
            log.warning("%s", exc)
            init_ray(cfg)  # redoing the shard needs Ray even when the run looked finished
    return None


def check_shared_storage(cfg: Config, root: RunRoot) -> None:
    """Refuse a local run root on a cluster of several nodes unless it is marked shared: every node's actors
    write shards, and on local disks they would scatter over the nodes."""
    import ray

    from longeval.errors import ConfigError

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and root.local_path() is not None and not cfg.store.shared_filesystem:
        raise ConfigError(
            f"this Ray cluster has {len(nodes)} nodes and the run root {root.uri} is a local path: each node would "
            "write its shards to its own disk. Use store.root=s3://bucket/prefix, or, if that path is on a "
            "filesystem every node mounts (NFS, Lustre), say so with store.shared_filesystem=true")


def _check_same_config(cfg: Config, root: RunRoot) -> None:
    """Refuse to mix instances from a different suite or model into an existing run root."""
    from longeval.errors import ConfigError

    if not root.exists("config.yaml"):
        return
    from omegaconf import OmegaConf

    old = OmegaConf.create(root.read_text("config.yaml"))
    for key in ("model.path", "model.chat_template", "model.answer_prefix", "model.reasoning", "model.system_prompt",
                "model.prompt_format", "model.ruler_template",
                "suite.seed", "suite.params", "suite.data.essay_dir", "suite.data.squad_path",
                "suite.data.hotpotqa_path", "suite.data.longbench_v2_path"):
        was, now = OmegaConf.select(old, key), OmegaConf.select(OmegaConf.structured(cfg), key)
        if was != now:
            raise ConfigError(
                f"run root {root.uri} was made with {key}={was!r}, not {now!r}; use another run_name=... "
                "or store.root=..., or delete that run root to start over"
            )
    _check_same_ranges(cfg, old, root)
    if root.exists("versions.json"):
        from longeval.tasks.base import DataPaths, data_fingerprint

        was = root.read_json("versions.json").get("data_fingerprint")
        if was and was != data_fingerprint(DataPaths(**asdict(cfg.suite.data))):
            raise ConfigError(
                f"the data files behind run root {root.uri} changed since it was made (essay corpus or QA files); "
                "use another run_name=... to evaluate the new data, or delete that run root"
            )


def _check_same_ranges(cfg: Config, old, root: RunRoot) -> None:
    """Refuse a samples or shard_size change that gives a finished shard name instances it does not hold: the
    rerun would take the old shard for done and miss them. Fewer samples are fine: the summaries keep only the
    current plan's instances (`in_plan`)."""
    import dataclasses

    from omegaconf import OmegaConf

    from longeval.errors import ConfigError

    was = {k: OmegaConf.select(old, f"suite.{k}") for k in ("samples", "shard_size", "subsets")}
    if None in (was["samples"], was["shard_size"]):
        return
    before = dataclasses.replace(cfg, suite=dataclasses.replace(
        cfg.suite, samples=int(was["samples"]), shard_size=int(was["shard_size"]),
        subsets=list(was["subsets"] or [])))
    old_ranges = {s.name: (s.start, s.stop) for s in make_plan(before, check_data=False).shards}
    changed = sorted(s.name for s in make_plan(cfg, check_data=False).shards
                     if s.name in old_ranges and not old_ranges[s.name][0] == s.start < s.stop <= old_ranges[s.name][1])
    if changed:
        raise ConfigError(
            f"run root {root.uri} was made with suite.samples={was['samples']} and suite.shard_size="
            f"{was['shard_size']}; with suite.samples={cfg.suite.samples} and suite.shard_size={cfg.suite.shard_size}"
            f" shard {changed[0]} would need instances it does not hold. Use another run_name=..., "
            "or the default run name (it differs per suite)")


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
