"""Reading run roots for reports and comparisons: the I/O edge of `longeval report` and `longeval compare`.

Everything goes through `RunRoot`, so a run root may be a local folder or `s3://`. A run root with scores but
no `summary/` gets one from the `summarise` it is handed (the CLI hands `stages.summarise.summarise_root`, which
uses the config stored in its `config.yaml`), exactly as `longeval report <overrides>` would have written it, so
the HTML report and the terminal agree. The report reads results; it never runs a stage itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longeval.config import Config, validate
from longeval.errors import ConfigError, StaleScoresError, StoreError
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, ErrorKind
from longeval.run.consistency import Consistency, State, check_root, planned_ids, summaries_current
from longeval.run.provenance import COMPARED_SETTINGS, COMPARED_VERSIONS, run_identity, stored_config
from longeval.stats.aggregate import depth_grid
from longeval.store.run_root import RunRoot
from longeval.tasks import FAMILIES, TASKS
from longeval.text.corpus import comparable_with_ruler

__all__ = ["INSTANCE_ROW_COLUMNS", "SUMMARY_NAMES", "RunData", "check_run", "essay_note", "essay_sentence",
           "family_rows", "has_rows", "instance_rows", "load_run", "load_scores", "provenance_pairs", "run_versions",
           "slug", "unique_labels"]

COMMON_SUMMARY_NAMES = ("tasks", "lengths", "headline", "cumulative", "errors", "slices")
SUMMARY_NAMES = COMMON_SUMMARY_NAMES + tuple(t.name for f in FAMILIES.values() for t in f.tables)
"""The summary tables the summarise stage writes, in the order a report reads them: the common ones, then those
the families declare."""
ADAPTIVE_SUMMARY_NAMES = ("adaptive", "adaptive_lengths", "adaptive_groups")
"""Written besides them by an adaptive run (`longeval.run.adaptive_rounds`), read when present."""

_OUTPUT_CHARS = 2000
INSTANCE_ROW_COLUMNS = ["instance_id", "input_tokens", "references"]
"""The instance columns `instance_rows` reads: a report declares them (`RunRoot.will_read`) so each instance shard
is read once per command, with the columns its checks read."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunData:
    """One run root's summaries and the facts about it a report shows."""

    uri: str
    label: str
    """A display name unique within one report (the model name, with the run folder when two share it)."""
    model: str
    suite: str
    claimed_length: int | None
    """`model.max_model_len` from the run's config.yaml: the context the run claimed for the model."""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    computed: bool = False
    """True when the summaries were missing (or older than the scores) and computed (and written) while loading."""
    notes: tuple[str, ...] = ()
    """What a reader must know to compare this run's numbers elsewhere (see `essay_note`)."""
    status: dict[str, Any] | None = None
    """The run's status as checked now (`longeval.run.consistency`, what status.json holds): whether every planned
    instance has its prediction and a score from it."""
    problem: str = ""
    """What is missing or partial about the run, in one line ("" when complete and current): the report's banner."""
    root: RunRoot | None = field(default=None, repr=False, compare=False)
    """The root it was read through: the report's later reads of the run go through it, so what it listed and
    read is not asked of the store again."""
    depth_grid: pa.Table | None = field(default=None, repr=False, compare=False)
    """Mean score per family, length and depth bin of its planned scores (`stats.depth_grid`); None without
    scores: the report's depth x length heatmaps."""
    adaptive_schedule: dict[str, Any] | None = None
    """An adaptive run's round schedule and alpha split (`compute.schedule` of its adaptive.json), None when the
    run is not adaptive or was written before they were recorded."""

    @property
    def incomplete(self) -> bool:
        return self.status is not None and not self.status.get("complete", True)

    @property
    def name(self) -> str:
        """The run folder's name (the last path component of the root)."""
        return PurePosixPath(self.uri.rstrip("/")).name or self.uri


def _root(target: RunRoot | str) -> RunRoot:
    """The run root given, or one opened for this command from its URI (one snapshot: listings remembered)."""
    return target if isinstance(target, RunRoot) else RunRoot(target, remember_listings=True)


def _config(root: RunRoot) -> dict[str, Any]:
    """The run's config.yaml as a dict: what of it parses ({} without one, or for one that does not parse)."""
    stored = stored_config(root)
    if stored is None or stored.tree is None:
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(stored.tree, resolve=False) or {}  # type: ignore[return-value]


def _select(config: dict[str, Any], dotted: str) -> Any:
    """A dotted key of the stored config, None when absent (an older or partial config.yaml)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(OmegaConf.create(config), dotted, default=None)


def _read_parquet(root: RunRoot, name: str) -> pa.Table:
    return pq.read_table(pa.BufferReader(root.read_bytes(name)))


def _summaries(root: RunRoot) -> dict[str, pa.Table]:
    present = root.shard_names("summary")
    return {name: _read_parquet(root, f"summary/{name}.parquet")
            for name in SUMMARY_NAMES + ADAPTIVE_SUMMARY_NAMES if name in present}


def load_run(target: RunRoot | str, *, summarise: Callable[[RunRoot], Any] | None = None) -> RunData:
    """A run root's summaries, config facts and label (not yet made unique: see `unique_labels`).

    A root with instances is checked against its plan whether or not it has scores: one with nothing scored yet (a
    run still inferring, or stopped before `score`) is partial and says so (`problem`), with or without summaries.

    Args:
        target: the run root, or its URI (then opened remembering its listings: one command, one snapshot).

    Raises:
        StoreError: the root has no summaries, no scores and no instances (not a run root, or not generated yet).
    """
    root = _root(target)
    root.adopt_legacy()  # a run root from before commit records: its finished shards count
    config = _config(root)
    scored = root.has("scores", "scores")
    consistency = check_run(root) if scored or root.shard_names("instances") else None
    tables = _summaries(root)
    computed = False
    # summaries older than the scores (`score` rerun after the last `report`) are computed again, when they can be
    outdated = "tasks" in tables and scored and bool(config) and not summaries_current(root)
    if "tasks" not in tables and not scored and consistency is not None:
        pass  # instances, nothing scored yet: no numbers to summarise, and `problem` says what is missing
    elif "tasks" not in tables or outdated:
        if not scored:
            what = ("no config.yaml either: is this a run root?" if not config else
                    "it holds no instances either: run `longeval run` with its overrides first")
            if root.exists("scores/scores.parquet") or root.exists("summary/tasks.parquet"):
                what = ("its Parquet files exist but have no commit records under _manifest/ (cut short): "
                        "rerun `longeval score` and `longeval report` with its overrides")
            raise StoreError(f"run root {root.uri} has no summary/ and no scores/scores.parquet; {what}")
        if summarise is None:
            state = "summaries older than its scores" if outdated else "no summary/"
            raise StoreError(f"run root {root.uri} has scores but {state}; run `longeval report` on it first")
        summarise(root)
        tables, computed = _summaries(root), True
    model = _select(config, "model.name")
    if not model and "headline" in tables and tables["headline"].num_rows:
        model = tables["headline"]["model_id"][0].as_py()
    claimed = _select(config, "model.max_model_len")
    versions = root.json_if_exists("versions.json") or {}
    label = str(model or PurePosixPath(root.uri).name)
    note = essay_note(label, versions, tables.get("tasks"))
    adaptive = root.json_if_exists("adaptive.json") or {}
    return RunData(uri=root.uri, label=label, model=str(model or ""),
                   suite=str(_select(config, "suite.name") or ""),
                   claimed_length=int(claimed) if claimed is not None else None, tables=tables, computed=computed,
                   notes=(note,) if note else (),
                   status=consistency.as_status() if consistency is not None else None,
                   problem=consistency.one_line(root.uri) if consistency is not None else "", root=root,
                   depth_grid=_depth_grid(root) if scored else None,
                   adaptive_schedule=(adaptive.get("compute") or {}).get("schedule"))


def _depth_grid(root: RunRoot) -> pa.Table:
    """`stats.depth_grid` of the run's planned scores (metadata columns only)."""
    columns = ["instance_id", "family", "target_length", "depth", "score"]
    return depth_grid(_in_stored_plan(root, root.read_stage("scores", SCORE_SCHEMA, columns=columns)))


def _stored_config(root: RunRoot) -> Config | None:
    """The run's config.yaml as a Config: its plan. None without one, or for one this version no longer reads (the
    root's instances are then the plan)."""
    stored = stored_config(root)
    if stored is None:
        return None
    if stored.damage is not None or stored.tree is None:
        log.warning("run root %s: config.yaml is damaged: %s; checking against the instances it holds", root.uri,
                    stored.damage)
        return None
    try:
        return validate(stored.tree)
    except ConfigError as exc:
        log.warning("run root %s: config.yaml does not validate (%s); checking against the instances it holds",
                    root.uri, exc)
        return None


def check_run(root: RunRoot) -> Consistency:
    """The run root's scores checked against its predictions and its stored plan (config.yaml), now.

    Raises:
        StaleScoresError: scores that no longer match their predictions: any number from them would be wrong.
    """
    consistency = check_root(root, _stored_config(root))
    if consistency.state is State.STALE:
        raise StaleScoresError(consistency.one_line(root.uri))
    return consistency


def essay_note(label: str, versions: dict[str, Any], tasks: pa.Table | None) -> str:
    """A sentence when the run's essay-haystack tasks ran on a corpus other than RULER's (else ""), after `label`.

    Which tasks read the essay haystack is what their registered parameters say (`haystack == "essay"`).
    """
    sentence = essay_sentence(versions, tasks)
    return f"{label}: {sentence}" if sentence else ""


def essay_sentence(versions: dict[str, Any], tasks: pa.Table | None) -> str:
    """`essay_note` without its label: what the HTML report and the terminal table of `longeval run` both say."""
    name = (versions.get("essay_corpus") or {}).get("name")
    if not name or comparable_with_ruler(str(name)) or tasks is None or not tasks.num_rows:
        return ""
    keys = sorted({f"{f}/{t}" for f, t in zip(tasks["family"].to_pylist(), tasks["task"].to_pylist(), strict=True)})
    essay = [k for k in keys if k in TASKS and getattr(TASKS[k].params, "haystack", None) == "essay"]
    if not essay:
        return ""
    return (f"{', '.join(essay)} ran on the essay haystack {name!r}, not RULER's Paul Graham essays, so "
            "these scores are not comparable with RULER's published table (`longeval data fetch-essays` fetches "
            "them; then suite.data.essay_dir).")


def run_versions(uri: str) -> dict[str, Any]:
    """A run root's versions.json ({} when it has none, as runs from before it was written)."""
    return RunRoot(uri).json_if_exists("versions.json") or {}


def unique_labels(runs: list[RunData]) -> list[RunData]:
    """The runs with labels that tell them apart: the model name, then the run folder, then a number."""
    from dataclasses import replace

    def counts(labels: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for label in labels:
            out[label] = out.get(label, 0) + 1
        return out

    labels = [r.label for r in runs]
    seen = counts(labels)
    labels = [f"{r.label} ({r.name})" if seen[r.label] > 1 else r.label for r in runs]
    seen = counts(labels)
    labels = [f"{label} #{i + 1}" if seen[label] > 1 else label for i, label in enumerate(labels)]
    return [replace(r, label=label) for r, label in zip(runs, labels, strict=True)]


def load_scores(target: RunRoot | str) -> pa.Table:
    """A run root's per-instance scores of its current plan (config.yaml's; the columns a comparison needs).

    Raises:
        StoreError: the run root has no scores.
    """
    root = _root(target)
    if not root.has("scores", "scores"):
        raise StoreError(f"run root {root.uri} has no scores/scores.parquet; run `longeval score` on it first")
    columns = ["instance_id", "model_id", "family", "task", "target_length", "score", "error_type"]
    return _in_stored_plan(root, root.read_stage("scores", SCORE_SCHEMA, columns=columns))


def _in_stored_plan(root: RunRoot, scores: pa.Table) -> pa.Table:
    """The score rows of the run's current plan (config.yaml's): a reused root's other rows count in no number, as
    in its summaries."""
    cfg = _stored_config(root)
    return scores if cfg is None else scores.filter(pc.is_in(scores["instance_id"], value_set=planned_ids(cfg, root)))


def provenance_pairs(a: RunRoot | str, b: RunRoot | str) -> dict[str, tuple[object, object]]:
    """The settings instance ids depend on, for both runs: `{key: (a's, b's)}` (what exists of them)."""
    out: dict[str, tuple[object, object]] = {}
    roots = (_root(a), _root(b))
    configs = [_config(r) for r in roots]
    versions = [r.json_if_exists("versions.json") or {} for r in roots]
    identities = [run_identity(c, COMPARED_SETTINGS) for c in configs]
    for key in COMPARED_SETTINGS:
        out[key] = (identities[0][key], identities[1][key])
    for key in COMPARED_VERSIONS:
        out[key] = (versions[0].get(key), versions[1].get(key))
    lengths = [_select(c, "suite.lengths") or [] for c in configs]
    tasks = [_select(c, "suite.tasks") or [] for c in configs]
    if lengths[0] and lengths[1] and not set(lengths[0]) & set(lengths[1]):
        out["suite.lengths"] = (lengths[0], lengths[1])
    if tasks[0] and tasks[1] and not set(tasks[0]) & set(tasks[1]):
        out["suite.tasks"] = (tasks[0], tasks[1])
    return out


def instance_rows(target: RunRoot | str) -> pa.Table:
    """One row per scored instance with what a person needs to look at it: the references, the model's
    output (first 2000 characters) and its score, for the per-instance CSV beside a report."""
    root = _root(target)
    scores = _in_stored_plan(root, root.read_stage("scores", SCORE_SCHEMA))
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=INSTANCE_ROW_COLUMNS)
    preds = root.read_stage("predictions", PREDICTION_SCHEMA,
                            columns=["instance_id", "output", "finish_reason", "error"])
    refs = {i: (n, r) for i, n, r in zip(instances["instance_id"].to_pylist(), instances["input_tokens"].to_pylist(),
                                          instances["references"].to_pylist(), strict=True)}
    outputs: dict[str, tuple[str, str]] = {}
    columns = [preds[c].to_pylist() for c in ("instance_id", "output", "finish_reason", "error")]
    for iid, output, finish, error in zip(*columns, strict=True):
        # a retried engine error is replaced
        if iid not in outputs or ErrorKind.of(error) is not ErrorKind.ENGINE_ERROR:
            outputs[iid] = (output[:_OUTPUT_CHARS], finish)
    ids = scores["instance_id"].to_pylist()
    return pa.table({
        "instance_id": scores["instance_id"],
        "model_id": scores["model_id"],
        "family": scores["family"],
        "task": scores["task"],
        "target_length": scores["target_length"],
        "depth": scores["depth"],
        "complexity": scores["complexity"],
        "input_tokens": pa.array([refs.get(i, (None, None))[0] for i in ids], pa.int64()),
        "references": pa.array([" | ".join(refs.get(i, (None, []))[1] or []) for i in ids], pa.string()),
        "output": pa.array([outputs.get(i, ("", ""))[0] for i in ids], pa.large_string()),
        "finish_reason": pa.array([outputs.get(i, ("", ""))[1] for i in ids], pa.string()),
        "parsed_answer": scores["parsed_answer"],
        "score": scores["score"],
        "error_type": scores["error_type"],
    }).sort_by([("family", "ascending"), ("task", "ascending"), ("target_length", "ascending")])


def slug(text: str) -> str:
    """A file-name-safe version of a label."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def has_rows(tables: dict[str, pa.Table], name: str) -> bool:
    return name in tables and tables[name].num_rows > 0


def family_rows(table: pa.Table, family: str) -> pa.Table:
    """The rows of one family (tables without a family column are returned as they are)."""
    if "family" not in table.column_names:
        return table
    return table.filter(pc.equal(table["family"], family))
