"""W&B tracking with the real wandb in offline mode: what the project hands to wandb, resume, failures, secrets.

wandb's offline `.wandb` file has no Python reader, so the tests check the project's own record of each
hand-over (`tracker.logged`) and that the offline run folder exists. The run root is written here with the
record schemas and summarised by `pipeline.report`: no engine.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from longeval.config import load_config
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA
from longeval.run import pipeline
from longeval.store.run_root import RunRoot
from longeval.tasks import FAMILIES
from longeval.tasks.family import Family, SummaryTable
from longeval.tracking import wandb_run as tracking
from longeval.tracking.keys import HEADLINE_METRICS
from longeval.tracking.payloads import (
    INSTANCE_COLUMNS,
    HeatmapSpec,
    config_payload,
    instance_tables,
    length_history,
    load_tables,
    plot_specs,
    sample_instances,
    status_metrics,
    summary_metrics,
)
from longeval.tracking.wandb_run import Logged, TrackingWarning, start_tracking
from tests import tracking_fixtures

SECRET = "hf_FAKE0123456789abcdefSECRET"
LENGTHS = (1024, 2048)
SAMPLES = 6
TASKS = {"niah_single_1": "ruler", "vt": "ruler", "tail": "tail"}
ROWS = 4


@pytest.fixture(autouse=True)
def wandb_env(tmp_path_factory, monkeypatch):
    """Offline, silent, and every W&B file under a temp folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path_factory.mktemp("wandb")))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _cfg(root: Path, *extra: str):
    return load_config([
        "suite.tasks=[niah_single_1,vt,tail/tail]", f"suite.lengths=[{','.join(map(str, LENGTHS))}]",
        f"suite.samples={SAMPLES}", "suite.shard_size=3", f"store.root={root}", "run_name=wb",
        "tracking=wandb", f"tracking.table_rows={ROWS}", "tracking.text_chars=200", f"+model.env.HF_TOKEN={SECRET}",
        *extra,
    ])


def build_root(cfg) -> RunRoot:
    return tracking_fixtures.build_root(cfg, TASKS, LENGTHS, SAMPLES)


def _of(tracker, kind: str) -> dict[str, Logged]:
    return {e.key: e for e in tracker.logged if e.kind == kind}


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One offline W&B run of a finished root, with the secret on the command line as well as in model.env."""
    wandb_dir = tmp_path_factory.mktemp("wandb-main")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("HF_TOKEN", SECRET)
        mp.setattr(sys, "argv", ["longeval", "run", f"+model.env.HF_TOKEN={SECRET}"])
        cfg = _cfg(tmp_path_factory.mktemp("runs"), f"tracking.dir={wandb_dir}")
        root = build_root(cfg)
        tracker = start_tracking(cfg, root)
        tracker.log_results()
        tracker.finish()
    return cfg, root, tracker, wandb_dir


# -- pure payloads ----------------------------------------------------------------------------------


def test_summary_metrics_have_stable_keys_and_the_tables_values(tmp_path):
    cfg = _cfg(tmp_path)
    tables = load_tables(build_root(cfg))
    metrics = summary_metrics(tables)
    tasks = tables["tasks"].to_pylist()
    for row in tasks:
        assert metrics[f"{row['family']}/{row['task']}/{row['target_length']}"] == row["score"]
    for row in tables["lengths"].to_pylist():
        assert metrics[f"{row['family']}/avg/{row['target_length']}"] == row["score"]
    for length in LENGTHS:  # the suite's average: all task scores at that length, across families
        at = [r["score"] for r in tasks if r["target_length"] == length]
        assert metrics[f"avg/{length}"] == pytest.approx(sum(at) / len(at), abs=0.01)
    suite = [metrics[f"avg/{n}"] for n in LENGTHS]
    assert metrics["headline/avg"] == pytest.approx(sum(suite) / 2, abs=0.01)
    assert metrics["headline/wavg_inc"] == pytest.approx((suite[0] + 2 * suite[1]) / 3, abs=0.01)
    assert metrics["headline/wavg_dec"] == pytest.approx((2 * suite[0] + suite[1]) / 3, abs=0.01)
    assert metrics["headline/effective_length"] == 0  # nothing above 85.6: RULER's "<4K" cell
    assert metrics["headline/threshold"] == 85.6
    for family in ("ruler", "tail"):
        assert {f"{family}/headline/{m}" for m in HEADLINE_METRICS} <= set(metrics)
    assert metrics["count/instances"] == len(TASKS) * len(LENGTHS) * SAMPLES
    assert metrics["count/nulls"] == sum(r["nulls"] for r in tasks) > 0
    assert {f"tail/tail_headline/{m}" for m in ("avg", "wavg_inc", "wavg_dec", "ratio")} <= set(metrics)
    assert all(isinstance(v, int | float) for v in metrics.values())


def test_a_familys_own_metrics_and_heatmap_come_from_its_table_hooks(tmp_path, monkeypatch):
    # a family tracking never names (as a plugin's would be): its keys come only from its SummaryTable hooks
    toy = Family(name="toy", title="Toy", tasks=(), tables=(SummaryTable(
        "toy_table", "Toy", build=lambda tasks, rows: pa.table({}),
        metrics=lambda table: {"by group/Hard Cases": float(table.num_rows)},
        heatmap=lambda table: [{"target_length": 1024, "depth": 50.0, "n": 2, "score": 75.0}]),))
    monkeypatch.setitem(FAMILIES, "toy", toy)
    tables = load_tables(build_root(_cfg(tmp_path)))
    tables["toy_table"] = pa.table({"x": [1, 2]})
    metrics = summary_metrics(tables)
    assert metrics["toy/by_group/hard_cases"] == 2.0  # `family_metric_key`: the family, then W&B-safe parts
    heatmaps = {s.key: s for s in plot_specs(tables) if isinstance(s, HeatmapSpec)}
    assert (heatmaps["heatmaps/toy"].depths, heatmaps["heatmaps/toy"].values) == ([50.0], [[75.0]])
    assert "heatmaps/tail" in heatmaps  # TAIL's Figure 5, through the same hook


def test_length_history_puts_every_curve_on_the_length_axis(tmp_path):
    tables = load_tables(build_root(_cfg(tmp_path)))
    rows = length_history(tables)
    metrics = summary_metrics(tables)
    assert [r["target_length"] for r in rows] == list(LENGTHS)
    for row in rows:
        n = row["target_length"]
        assert row["curve/avg"] == metrics[f"avg/{n}"]
        assert row["curve/ruler/niah_single_1"] == metrics[f"ruler/niah_single_1/{n}"]
        assert row["curve/ruler/avg"] == metrics[f"ruler/avg/{n}"]
        assert "cumulative/tail/tail" in row and "cumulative/ruler/vt" in row


def test_sample_is_deterministic_spread_over_lengths_and_seeded(tmp_path):
    root = build_root(_cfg(tmp_path))
    scores = root.read_stage("scores", SCORE_SCHEMA)
    first = sample_instances(scores, rows=ROWS, seed=42)
    assert first == sample_instances(scores.take(list(reversed(range(scores.num_rows)))), rows=ROWS, seed=42)
    assert set(first) == {(f, t) for t, f in TASKS.items()} and all(len(v) == ROWS for v in first.values())
    length_of = dict(zip(scores["instance_id"].to_pylist(), scores["target_length"].to_pylist(), strict=True))
    for ids in first.values():
        assert sorted(length_of[i] for i in ids) == [1024, 1024, 2048, 2048]
    assert sample_instances(scores, rows=ROWS, seed=7) != first
    assert all(len(v) == 2 * SAMPLES for v in sample_instances(scores, rows=100, seed=42).values())


def test_instance_tables_join_instances_predictions_and_scores(tmp_path):
    root = build_root(_cfg(tmp_path))
    scores = root.read_stage("scores", SCORE_SCHEMA)
    instances = root.read_stage("instances", INSTANCE_SCHEMA)
    prompts = dict(zip(instances["instance_id"].to_pylist(), instances["prompt"].to_pylist(), strict=True))
    tables = {t.key: t for t in instance_tables(scores, instances.drop_columns(["prompt"]),
                                                root.read_stage("predictions", PREDICTION_SCHEMA), rows=ROWS,
                                                seed=42, prompts=prompts, text_chars=50)}
    assert set(tables) == {"instances/ruler/niah_single_1", "instances/ruler/vt", "instances/tail/tail"}
    table = tables["instances/ruler/niah_single_1"]
    assert table.columns == INSTANCE_COLUMNS and len(table.rows) == ROWS
    for row in table.rows:
        cell = dict(zip(table.columns, row, strict=True))
        assert cell["prompt_tail"].endswith("?") and cell["instance_id"] in cell["prompt_tail"]
        assert len(cell["prompt_tail"]) <= 51  # the tail, where the question is
        assert json.loads(cell["references"])[0].startswith("ans")
        assert (cell["score"] == 1.0) == (cell["output"] != "") and cell["finish_reason"] == "stop"


def test_plot_specs_cover_lengths_cumulative_tasks_and_heatmaps(tmp_path):
    root = build_root(_cfg(tmp_path))
    specs = {s.key: s for s in plot_specs(load_tables(root), root.read_stage("scores", SCORE_SCHEMA))}
    assert {"plots/ruler/lengths", "plots/ruler/cumulative", "plots/ruler/niah_single_1", "plots/ruler/vt",
            "plots/tail/lengths", "plots/tail/cumulative", "plots/tail/tail",
            "heatmaps/tail", "heatmaps/ruler"} == set(specs)
    lengths = specs["plots/ruler/lengths"]
    assert set(lengths.series) == {"niah_single_1", "vt", "avg"} and lengths.series["vt"][0] == list(LENGTHS)
    assert set(specs["plots/ruler/vt"].series) == {"score", "ci_low", "ci_high"}
    tail = specs["heatmaps/tail"]  # TAIL's own grid: its depths as they are
    assert tail.depths == [10.0, 50.0, 90.0] and tail.lengths == list(LENGTHS)
    ruler = specs["heatmaps/ruler"]  # from the NIAH depths (vt has none), binned by 10 %
    assert ruler.depths == [0.0, 10.0, 30.0, 50.0, 60.0, 80.0] and ruler.table_key == "grids/ruler"


def test_config_payload_is_redacted_and_carries_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-" + SECRET)
    cfg = _cfg(tmp_path, "+model.engine_kwargs.hf_overrides={hf_token: nested-secret-value}",
               f"tracking.tags=[x{SECRET}]")
    payload = config_payload(cfg, {"longeval": "1", "tokenizer_fingerprint": "f"})
    text = json.dumps(payload)
    assert SECRET not in text and "nested-secret-value" not in text
    assert payload["model"]["env"]["HF_TOKEN"] == "***"
    assert payload["model"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the rest stays
    assert payload["model"]["engine_kwargs"]["hf_overrides"]["hf_token"] == "***"
    assert payload["versions"]["tokenizer_fingerprint"] == "f" and payload["suite"]["seed"] == 42
    assert payload["run_root"] == cfg.run_root


# -- the offline W&B run ----------------------------------------------------------------------------


def test_offline_run_folder_is_written(logged_run):
    cfg, root, tracker, wandb_dir = logged_run
    init = _of(tracker, "init")[tracker.run_id]
    assert init.value["mode"] == "offline" and not init.value["resumed"]
    run_dir = Path(init.value["dir"])
    assert run_dir.parent == wandb_dir / "wandb" and run_dir.name.startswith("offline-run-")
    assert list(run_dir.glob(f"run-{tracker.run_id}.wandb"))
    assert json.loads(Path(root.local_path(), "tracking.json").read_text())["run_id"] == tracker.run_id
    assert _of(tracker, "finish")[tracker.run_id].value == {"exit_code": 0}
    assert not tracker.warnings


def test_summary_history_tables_plots_and_artifact_were_handed_over(logged_run):
    cfg, root, tracker, _ = logged_run
    tables = load_tables(root)
    status = root.read_json("status.json")
    assert _of(tracker, "summary")["summary"].value == summary_metrics(tables) | status_metrics(status)
    assert _of(tracker, "summary")["summary"].value["status/instances"] == status["instances"] > 0
    history = [e.value for e in tracker.logged if e.kind == "history"]
    assert history == length_history(tables)
    handed = _of(tracker, "table")
    for task, family in TASKS.items():
        table = handed[f"instances/{family}/{task}"].value
        assert table == {"rows": ROWS, "columns": list(INSTANCE_COLUMNS)}
    assert {"grids/tail", "grids/ruler", "results/headline", "results/lengths", "results/tail_headline"} <= set(handed)
    plots = _of(tracker, "plot")
    assert {"plots/ruler/lengths", "plots/ruler/cumulative", "plots/ruler/niah_single_1", "plots/tail/tail"} <= set(
        plots)
    assert plots["plots/ruler/lengths"].value["series"] == ["avg", "niah_single_1", "vt"]
    assert set(_of(tracker, "image")) == {"heatmaps/tail", "heatmaps/ruler"}
    artifact = _of(tracker, "artifact")["results-wb"].value
    assert {"summary/tasks.parquet", "summary/cumulative.parquet", "summary/tail_grid.parquet",
            "scores/scores.parquet", "config.yaml", "versions.json"} <= set(artifact["files"])
    assert _of(tracker, "config")["config"].value["versions"]["tokenizer_fingerprint"] == "abc123"


def test_instance_tables_on_disk_carry_prompt_tails_outputs_and_scores(logged_run):
    cfg, root, tracker, _ = logged_run
    [path] = tracker.run_dir.glob("files/media/table/instances/ruler/niah_single_1_*.table.json")
    table = json.loads(path.read_text())  # wandb's own JSON of the table handed over
    assert table["columns"] == list(INSTANCE_COLUMNS) and len(table["data"]) == ROWS
    for row in table["data"]:
        cell = dict(zip(table["columns"], row, strict=True))
        assert cell["prompt_tail"].endswith("?") and len(cell["prompt_tail"]) <= 201
        assert cell["instance_id"] in cell["prompt_tail"] and cell["score"] in (0.0, 1.0)


def test_no_credential_reaches_wandb(logged_run):
    cfg, root, tracker, wandb_dir = logged_run
    config = _of(tracker, "config")["config"].value
    assert SECRET not in json.dumps(config) and config["model"]["env"]["HF_TOKEN"] == "***"
    files = [p for p in wandb_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    assert [p for p in Path(root.local_path()).rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()] == []


def test_a_resumed_job_resumes_its_wandb_run(logged_run):
    cfg, root, first, _ = logged_run
    again = start_tracking(cfg, root)
    try:
        assert again.run_id == first.run_id
        assert _of(again, "init")[first.run_id].value["resumed"]
        again.log_results()
        assert "history" in _of(again, "skip")  # same results: no second set of curve points
        assert _of(again, "summary")["summary"].value == _of(first, "summary")["summary"].value
    finally:
        again.finish()
    assert not again.warnings


# -- failures never fail the evaluation -------------------------------------------------------------


def test_invalid_project_only_warns(tmp_path):
    cfg = _cfg(tmp_path, "tracking.project=bad/project")
    root = build_root(cfg)
    with pytest.warns(TrackingWarning, match="Invalid project name"):
        tracker = start_tracking(cfg, root)
    tracker.log_results()
    tracker.finish()
    assert tracker.run is None and [e.kind for e in tracker.logged] == ["warning"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_online_without_a_reachable_server_warns_and_logs_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "f" * 40)  # credentials, but the server is down
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    cfg = _cfg(tmp_path, "tracking.mode=online", "tracking.init_timeout=2")
    root = build_root(cfg)
    with pytest.warns(TrackingWarning, match="init \\(online\\) failed"):
        tracker = start_tracking(cfg, root)
    try:
        assert tracker.mode == "offline" and tracker.run is not None
        tracker.log_results()
        assert "summary" in _of(tracker, "summary")
    finally:
        tracker.finish()
    assert "f" * 40 not in " ".join(tracker.warnings)


def test_online_without_credentials_logs_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    cfg = _cfg(tmp_path, "tracking.mode=online")
    with pytest.warns(TrackingWarning, match="no W&B credentials"):
        tracker = start_tracking(cfg, RunRoot(cfg.run_root))
    tracker.finish()
    assert tracker.mode == "offline"


def test_a_failing_wandb_leaves_the_pipeline_result_unchanged(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "tracking.project=bad/other")
    root = build_root(cfg)
    expected = pipeline.report(cfg, root)
    with pytest.warns(TrackingWarning):
        result = pipeline.run(cfg, stages=["report"])
    assert result.summary.equals(expected.summary) and result.headline.equals(expected.headline)


def _capture_trackers(monkeypatch) -> list:
    made = []
    real = tracking.start_tracking

    def capture(cfg, root):
        made.append(real(cfg, root))
        return made[-1]

    monkeypatch.setattr(tracking, "start_tracking", capture)
    return made


def test_pipeline_logs_after_report_and_marks_a_failed_stage(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    build_root(cfg)
    made = _capture_trackers(monkeypatch)
    result = pipeline.run(cfg, stages=["report"])
    assert [e.kind for e in made[0].logged if e.kind in ("init", "summary", "finish")] == ["init", "summary", "finish"]
    assert result.tracking == (f"W&B run {made[0].run_id} (offline) in {made[0].run_dir}; "
                               f"upload it with: wandb sync {made[0].run_dir}")
    assert _of(made[0], "finish")[made[0].run_id].value == {"exit_code": 0}

    def broken(*args, **kwargs):
        raise RuntimeError("report broke")

    monkeypatch.setattr(pipeline, "report", broken)
    with pytest.raises(RuntimeError, match="report broke"):
        pipeline.run(cfg, stages=["report"])
    assert made[1].run_id == made[0].run_id  # the same job resumes the same W&B run
    assert _of(made[1], "finish")[made[1].run_id].value == {"exit_code": 1}
    assert "summary" not in _of(made[1], "summary")


def test_backend_none_never_imports_wandb(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # any `import wandb` would now raise ImportError
    cfg = load_config([f"store.root={tmp_path}", "run_name=none"])
    assert cfg.tracking.backend == "none"
    tracker = start_tracking(cfg, RunRoot(cfg.run_root))
    tracker.log_results()
    tracker.finish()
    assert tracker.logged == [] and not Path(tmp_path, "none", "tracking.json").exists()
