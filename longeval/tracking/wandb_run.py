"""Experiment tracking's side-effect layer: one Weights & Biases run per (model, suite) job, next to the run root.

`WandbTracker` starts (or resumes) the run, hands it the payloads `longeval.tracking.payloads` builds from what the
summarise stage wrote, under the key names of `longeval.tracking.keys`, and finishes it; `start_tracking` is what the
pipeline calls. Each hand-over is recorded in `tracker.logged`, which is what tests check (wandb's offline files have
no Python reader).

Tracking never fails or blocks an evaluation: every W&B call is guarded, and an error becomes a warning (on
the `longeval.tracking.wandb_run` logger and as a `TrackingWarning`) while the run goes on. Nothing here imports wandb
unless `tracking.backend=wandb`. No credential reaches W&B: the config, the run's name, group and tags, and every
warning pass through the run's `Redactor` (`config.redactor`, the one config.yaml and the engine records are written
through), and wandb's own capture of the command line, git remote and console is off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
import textwrap
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longeval.config import Config, redactor
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, latest_predictions
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName
from longeval.tracking.credentials import has_credentials
from longeval.tracking.keys import RESULT_TABLES, STEP_METRIC, result_table_key
from longeval.tracking.payloads import (
    HeatmapSpec,
    InstanceTable,
    LineSpec,
    config_payload,
    instance_tables,
    length_history,
    load_tables,
    plot_specs,
    results_files,
    sample_instances,
    status_metrics,
    summary_metrics,
    text_tail,
)

__all__ = [
    "STATE_FILE",
    "Logged",
    "NullTracker",
    "Tracker",
    "TrackingWarning",
    "WandbTracker",
    "start_tracking",
]

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
"""In the run root: the W&B run id (so a resumed job resumes its W&B run) and what was last logged."""


class TrackingWarning(UserWarning):
    """A W&B call failed; the evaluation went on without it."""


@dataclass(frozen=True)
class Logged:
    """One hand-over to wandb: `kind` (init, config, history, summary, table, plot, image, artifact, finish,
    skip, warning), the W&B `key`, and what was handed (a dict of numbers, a table's shape, a message)."""

    kind: str
    key: str
    value: Any = None


class Tracker(Protocol):
    """What `pipeline.run` calls: `start` after provenance, `log_results` after report, `finish` at the end."""

    logged: list[Logged]
    warnings: list[str]

    def start(self) -> None: ...
    def log_results(self) -> None: ...
    def finish(self, *, failed: bool = False) -> None: ...
    def describe(self) -> str | None: ...


@dataclass
class NullTracker:
    """`tracking.backend=none`: does nothing, imports nothing."""

    logged: list[Logged] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def start(self) -> None:
        return None

    def log_results(self) -> None:
        return None

    def finish(self, *, failed: bool = False) -> None:
        return None

    def describe(self) -> str | None:
        return None


def start_tracking(cfg: Config, root: RunRoot) -> Tracker:
    """The job's tracker, started (`tracking.backend=none`: a no-op that never imports wandb)."""
    tracker: Tracker = WandbTracker(cfg, root) if cfg.tracking.backend == "wandb" else NullTracker()
    tracker.start()
    return tracker


class WandbTracker:
    """One W&B run for one job: started (or resumed) with the run root, fed from what report wrote.

    Every wandb call goes through `_guard`, so an error is a warning and never reaches the evaluation.
    """

    def __init__(self, cfg: Config, root: RunRoot) -> None:
        self.cfg = cfg
        self.root = root
        self.logged: list[Logged] = []
        self.warnings: list[str] = []
        self.run: Any = None
        self.run_id: str | None = None
        self.mode: str | None = None
        self.run_dir: Path | None = None
        self._redactor = redactor(cfg)
        self._finished = False

    @property
    def name(self) -> str:
        """The W&B run name: the run root's name (`<model>-<suite>-seed<seed>` by default)."""
        return self.cfg.run_root.rstrip("/").rsplit("/", 1)[-1]

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        state = _or(self._guard("read the tracking state", self._read_state), {})
        self.run_id = state.get("run_id") or _new_run_id()
        resumed = "run_id" in state
        self._guard("write the tracking state", self._write_state, {**state, "run_id": self.run_id})
        mode = self._mode()
        versions = _or(self._guard("read versions.json", self._versions), {})
        payload = _or(self._guard("build the config", config_payload, self.cfg, versions, run_root=self.root.uri),
                      None)
        run = self._guard(f"init ({mode})", self._init, mode, payload)
        if run is _FAILED and mode == "online" and _or(self._guard("look for other runs", _no_other_run), False):
            # Keep the results: the same run offline now, `wandb sync` later. A failed online init leaves its
            # run id registered in wandb's service process, so that service is restarted first.
            mode = "offline"
            run = self._guard("init (offline fallback)", self._offline_fallback, payload)
        if run is _FAILED:
            return
        self.run, self.mode = run, mode
        self.run_dir = _or(self._guard("find the run folder", lambda: Path(run.dir).parent), None)
        self._record("init", self.run_id, {"mode": mode, "resumed": resumed, "dir": str(self.run_dir),
                                           "project": self.cfg.tracking.project, "name": self.name})
        if payload is not None:
            self._record("config", "config", payload)

    def log_results(self) -> None:
        """Hand everything report wrote to the run; a part that fails is skipped with a warning."""
        if self.run is None:
            return
        tables = _or(self._guard("read the summaries", load_tables, self.root), {})
        if not tables:
            return
        metrics = _or(self._guard("build the summary", summary_metrics, tables), {})
        metrics |= status_metrics(_or(self._guard("read status.json", self._status), {}))
        state = _or(self._guard("read the tracking state", self._read_state), {})
        digest = _digest([metrics, self.run_id, self.cfg.tracking.project, self.cfg.tracking.entity])
        if state.get("logged") == digest:  # a rerun with the same results: curves and media are there already
            self._record("skip", "history", {"logged": digest})
        else:
            self._log_history(tables)
            self._log_media(tables)
            self._log_artifact()
        if metrics and self._guard("update the summary", self.run.summary.update, metrics) is not _FAILED:
            self._record("summary", "summary", metrics)
        self._guard("write the tracking state", self._write_state, {**state, "run_id": self.run_id, "logged": digest})

    def finish(self, *, failed: bool = False) -> None:
        """Close the run: finished, or failed (exit code 1) when a stage raised. Idempotent."""
        if self.run is None or self._finished:
            return
        self._finished = True
        exit_code = 1 if failed else 0
        if self._guard("finish", self.run.finish, exit_code=exit_code) is not _FAILED:
            self._record("finish", self.run_id or "", {"exit_code": exit_code})

    def describe(self) -> str | None:
        """Where the run went, for the end of the job's output (None when W&B could not be started)."""
        if self.run is None:
            return None
        if self.mode == "offline":
            return f"W&B run {self.run_id} (offline) in {self.run_dir}; upload it with: wandb sync {self.run_dir}"
        url = _or(self._guard("read the run URL", lambda: self.run.url), None)
        return f"W&B run {self.run_id}: {url or self.cfg.tracking.project}"

    # -- hand-overs ----------------------------------------------------------------------------------

    def _init(self, mode: str, payload: dict | None) -> Any:
        import wandb

        t = self.cfg.tracking
        settings = wandb.Settings(
            console="off",  # the evaluation's own output is not W&B's to keep
            x_disable_meta=True,  # no command line (overrides may carry credentials), no git remote
            disable_git=True,
            save_code=False,
            init_timeout=t.init_timeout,
            finish_timeout=t.finish_timeout,
        )
        hide = self._redactor.text
        tags = [hide(str(x)) for x in t.tags] or None
        run = wandb.init(
            project=t.project, entity=t.entity, group=hide(t.group) if t.group else None, tags=tags,
            name=hide(self.name), id=self.run_id, resume="allow", job_type="eval", dir=self._dir(),
            mode=mode, reinit="create_new", settings=settings,
        )
        try:
            if payload is not None:
                run.config.update(payload, allow_val_change=True)
            run.define_metric(STEP_METRIC, hidden=True)
            for prefix in ("curve", "cumulative"):
                run.define_metric(f"{prefix}/*", step_metric=STEP_METRIC, summary="none")
        except Exception:
            run.finish(exit_code=1)
            raise
        return run

    def _offline_fallback(self, payload: dict | None) -> Any:
        import wandb

        wandb.teardown()
        return self._init("offline", payload)

    def _log_history(self, tables: Mapping[str, pa.Table]) -> None:
        for row in _or(self._guard("build the length curves", length_history, tables), []):
            if self._guard("log a length curve row", self.run.log, row) is not _FAILED:
                self._record("history", f"{STEP_METRIC}={row[STEP_METRIC]}", row)

    def _log_media(self, tables: Mapping[str, pa.Table]) -> None:
        import wandb

        media: dict[str, Any] = {}
        scores = _or(self._guard("read the scores", self._scores), None)
        for table in _or(self._guard("build the instance tables", self._instance_tables, scores), []):
            obj = self._guard(f"build {table.key}", wandb.Table, columns=list(table.columns), data=table.rows)
            if obj is not _FAILED:
                media[table.key] = obj
                self._record("table", table.key, {"rows": len(table.rows), "columns": list(table.columns)})
        for spec in _or(self._guard("build the plots", plot_specs, tables, scores), []):
            if isinstance(spec, LineSpec):
                chart = self._guard(f"build {spec.key}", _line_chart, spec)
                if chart is not _FAILED:
                    media[spec.key] = chart
                    self._record("plot", spec.key, {"kind": "line_series", "series": sorted(spec.series)})
            else:
                image = self._guard(f"build {spec.key}", _heatmap_image, spec)
                grid = self._guard(f"build {spec.table_key}", _heatmap_table, spec)
                if image is not _FAILED:
                    media[spec.key] = image
                    self._record("image", spec.key, {"kind": "heatmap", "depths": spec.depths,
                                                     "lengths": spec.lengths})
                if grid is not _FAILED:
                    media[spec.table_key] = grid
                    self._record("table", spec.table_key, {"rows": len(spec.depths) * len(spec.lengths),
                                                           "columns": list(_GRID_COLUMNS)})
        for name in RESULT_TABLES:
            if name in tables and tables[name].num_rows:
                table = tables[name]
                obj = self._guard(f"build {name}", wandb.Table, columns=table.column_names,
                                  data=[list(r.values()) for r in table.to_pylist()])
                if obj is not _FAILED:
                    media[result_table_key(name)] = obj
                    self._record("table", result_table_key(name),
                                 {"rows": table.num_rows, "columns": table.column_names})
        if media and self._guard("log tables and plots", self.run.log, media) is _FAILED:
            self.logged[:] = [e for e in self.logged if e.key not in media or e.kind == "warning"]

    def _log_artifact(self) -> None:
        import wandb

        names = _or(self._guard("list the results", results_files, self.root), [])
        if not names:
            return
        artifact_name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"results-{self.name}")
        metadata = {"run_root": self._redactor.text(self.root.uri), "model": self.cfg.model.name,
                    "suite": self.cfg.suite.name, "files": names}

        def log_artifact() -> None:
            artifact = wandb.Artifact(artifact_name, type="results", metadata=metadata,
                                      description="longeval results: Parquet summaries and scores of one job")
            local = self.root.local_path()
            with tempfile.TemporaryDirectory(prefix="longeval-artifact-") as staging:
                for name in names:
                    if local is not None:
                        path = local / name
                    else:  # s3:// run roots: staged through the run root's own filesystem layer
                        path = Path(staging, name)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(self.root.read_bytes(name))
                    artifact.add_file(str(path), name=name)  # copied into wandb's staging area now
                self.run.log_artifact(artifact)

        if self._guard("log the results artifact", log_artifact) is not _FAILED:
            self._record("artifact", artifact_name, {"type": "results", "files": names})

    # -- helpers -------------------------------------------------------------------------------------

    def _instance_tables(self, scores: pa.Table | None) -> list[InstanceTable]:
        t = self.cfg.tracking
        if scores is None or scores.num_rows == 0 or t.table_rows <= 0:
            return []
        columns = ["instance_id", "family", "task", "target_length", "input_tokens", "references", "complexity",
                   "seed", "shard_index"]
        instances = self.root.read_stage("instances", INSTANCE_SCHEMA, columns=columns)
        predictions = latest_predictions(self.root.read_stage("predictions", PREDICTION_SCHEMA))
        sample = sample_instances(scores, rows=t.table_rows, seed=self.cfg.suite.seed)
        wanted = {i for ids in sample.values() for i in ids}
        prompts = self._prompt_tails(instances, wanted) if t.text_chars > 0 else {}
        return instance_tables(scores, instances, predictions, rows=t.table_rows, seed=self.cfg.suite.seed,
                               prompts=prompts, text_chars=t.text_chars)

    def _prompt_tails(self, instances: pa.Table, wanted: set[str]) -> dict[str, str]:
        """Tails of the sampled prompts, reading only the prompt column of the shards that hold them."""
        import pyarrow.parquet as pq

        if not wanted:
            return {}
        fs, paths = self.root.stage_files("instances")
        picked = instances.filter(pc.is_in(instances["instance_id"], pa.array(sorted(wanted), pa.string())))
        bases = {ShardName.of(r).prefix for r in picked.to_pylist()}
        out: dict[str, str] = {}
        chars = self.cfg.tracking.text_chars
        for path in paths:
            name = path.rsplit("/", 1)[-1].removesuffix(".parquet")
            if ShardName.parse(name).prefix not in bases:  # a shard, or its follow-ups
                continue
            table = pq.read_table(path, filesystem=fs, columns=["instance_id", "prompt"])
            for iid, prompt in zip(table["instance_id"].to_pylist(), table["prompt"].to_pylist(), strict=True):
                if iid in wanted:
                    out[iid] = text_tail(prompt or "", chars)
        return out

    def _scores(self) -> pa.Table:
        return self.root.read_stage("scores", SCORE_SCHEMA)

    def _status(self) -> dict:
        return self.root.read_json("status.json") if self.root.exists("status.json") else {}

    def _versions(self) -> dict:
        return self.root.read_json("versions.json") if self.root.exists("versions.json") else {}

    def _read_state(self) -> dict:
        return self.root.read_json(STATE_FILE) if self.root.exists(STATE_FILE) else {}

    def _write_state(self, state: dict) -> None:
        self.root.write_json(STATE_FILE, {**state, "backend": "wandb", "project": self.cfg.tracking.project,
                                          "entity": self.cfg.tracking.entity})

    def _mode(self) -> str:
        mode = self.cfg.tracking.mode
        if mode == "online" and not has_credentials():
            self._warn("tracking.mode=online but no W&B credentials (set WANDB_API_KEY or run `wandb login`); "
                       "logging offline instead: `wandb sync` the run folder later")
            return "offline"
        return mode

    def _dir(self) -> str | None:
        """W&B's local folder: tracking.dir, $WANDB_DIR, a local run root, else wandb's default (cwd)."""
        if self.cfg.tracking.dir:
            return self.cfg.tracking.dir
        if os.environ.get("WANDB_DIR"):
            return os.environ["WANDB_DIR"]
        local = self.root.local_path()
        return str(local) if local is not None else None

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, or `_FAILED` after a warning: W&B must never fail the evaluation."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._warn(f"W&B {what} failed ({type(exc).__name__}: {_first_line(exc)}); the evaluation goes on "
                       "without it")
            return _FAILED

    def _warn(self, message: str) -> None:
        message = self._redactor.text(message)
        log.warning("%s", message)
        warnings.warn(message, TrackingWarning, stacklevel=3)
        self.warnings.append(message)
        self.logged.append(Logged("warning", "", message))

    def _record(self, kind: str, key: str, value: Any = None) -> None:
        self.logged.append(Logged(kind, key, value))


_FAILED: Any = object()
"""What `_guard` returns when the call raised (None is a legitimate result)."""


def _or(value: Any, default: Any) -> Any:
    return default if value is _FAILED else value

_GRID_COLUMNS = ("depth", "target_length", "n", "score")


def _no_other_run() -> bool:
    """Whether this process has no other live W&B run (restarting wandb's service would end it)."""
    import wandb

    return wandb.run is None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _new_run_id() -> str:
    """A W&B-style run id: 8 characters of [a-z0-9]."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def _line_chart(spec: LineSpec) -> Any:
    import wandb

    names = list(spec.series)
    return wandb.plot.line_series(xs=[spec.series[n][0] for n in names], ys=[spec.series[n][1] for n in names],
                                  keys=names, title=spec.title, xname=spec.x_name)


def _heatmap_table(spec: HeatmapSpec) -> Any:
    import wandb

    data = [[d, n, spec.counts[i][j], spec.values[i][j]] for i, d in enumerate(spec.depths)
            for j, n in enumerate(spec.lengths)]
    return wandb.Table(columns=list(_GRID_COLUMNS), data=data)


def _heatmap_image(spec: HeatmapSpec) -> Any:
    """The heatmap drawn with matplotlib's object API (no pyplot, no global backend state)."""
    import wandb
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = np.array([[np.nan if v is None else v for v in row] for row in spec.values], dtype=float)
    fig = Figure(figsize=(max(5.0, 1.6 + 0.8 * len(spec.lengths)), max(3.0, 1.2 + 0.3 * len(spec.depths))), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(values, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(spec.lengths)), [str(n) for n in spec.lengths], fontsize=8)
    ax.set_yticks(range(len(spec.depths)), [f"{d:g}" for d in spec.depths], fontsize=8)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("depth (%)")
    ax.set_title("\n".join(textwrap.wrap(spec.title, 60)), fontsize=9)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if not np.isnan(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.0f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    canvas.draw()
    return wandb.Image(np.asarray(canvas.buffer_rgba())[..., :3].copy(), caption=spec.title)
