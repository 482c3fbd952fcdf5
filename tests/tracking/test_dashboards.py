"""The W&B dashboards as objects: they build offline, have the expected sections and panels, and every key
they ask for is one the logger produces (checked against a run root with every registered task).

The families, their section titles and heatmaps come from the registry (`longeval.tasks.FAMILIES`): a new family
is checked here by registering, with no edit to this file.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws

from longeval.cli import main
from longeval.config import conf_dir, load_config
from longeval.errors import ConfigError
from longeval.records import SCORE_SCHEMA
from longeval.tasks import FAMILIES as FAMILIES_REGISTERED
from longeval.tasks import TASKS
from longeval.tasks.family import Family, Panel
from longeval.tracking import dashboards
from longeval.tracking.credentials import TrackingError
from longeval.tracking.keys import RESULT_TABLES, STEP_METRIC, family_metric_key
from longeval.tracking.payloads import length_history, load_tables, plot_specs, summary_metrics
from tests import tracking_fixtures

LENGTHS = (1024, 2048)


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """The keys a tracked run of every registered task logs: summary, history (curves), media, tables."""
    all_tasks = {spec.name: spec.family for spec in TASKS.values()}
    cfg = load_config([f"suite.tasks=[{','.join(TASKS)}]", f"suite.lengths=[{','.join(map(str, LENGTHS))}]",
                       "suite.samples=6", f"store.root={tmp_path_factory.mktemp('runs')}", "run_name=all"])
    root = tracking_fixtures.build_root(cfg, all_tasks, LENGTHS, 6)
    tables = load_tables(root)
    history = set().union(*length_history(tables)) - {STEP_METRIC}
    media = {s.key for s in plot_specs(tables, root.read_stage("scores", SCORE_SCHEMA))}
    logged_tables = {f"results/{n}" for n in RESULT_TABLES if n in tables and tables[n].num_rows}
    return {"summary": set(summary_metrics(tables)), "history": history, "media": media, "tables": logged_tables}


@pytest.fixture(scope="module")
def view():
    families: dict[str, list[str]] = defaultdict(list)
    for spec in TASKS.values():
        families[spec.family].append(spec.name)
    return dashboards.View(families={f: tuple(families[f]) for f in FAMILIES_REGISTERED}, lengths=LENGTHS)


def sections(view: dashboards.View) -> list[str]:
    """The section titles, in order: the common ones around one per family, titled as the family declares."""
    titles = [FAMILIES_REGISTERED[f].title for f in view.families]
    return ["Leaderboard", "Length curves", *titles, "Depth x length heatmaps"]


def family_curves(family: str, tasks: tuple[str, ...]) -> set[str]:
    """The length curves of a family's section: its average, each task, and each task's cumulative curve if the
    family reads them (Michelangelo)."""
    cumulative = FAMILIES_REGISTERED[family].cumulative_curves
    return ({f"curve/{family}/avg"} | {f"curve/{family}/{t}" for t in tasks}
            | ({f"cumulative/{family}/{t}" for t in tasks} if cumulative else set()))


def referenced(panels) -> dict[str, set[str]]:
    """The keys panels ask for, by where they must come from."""
    out: dict[str, set[str]] = defaultdict(set)
    for panel in panels:
        if isinstance(panel, wr.LinePlot):
            assert panel.x == STEP_METRIC  # length curves: history with target_length as the x axis
            out["history"].update(panel.y)
        elif isinstance(panel, wr.BarPlot):
            out["summary"].update(panel.metrics)
        elif isinstance(panel, wr.MediaBrowser):
            out["media"].update(panel.media_keys)
        elif isinstance(panel, wr.WeavePanelSummaryTable):
            out["tables"].add(panel.table_name)
        else:
            raise AssertionError(f"unexpected panel {type(panel).__name__}")
    return out


def _columns(columns: list[str]) -> set[str]:
    return {c.split(":", 1)[1] for c in columns if c.startswith("summary:")}


def test_workspace_has_the_standard_sections_and_serialises_offline(view):
    workspace = dashboards.workspace("ent", "proj", view)
    assert isinstance(workspace, ws.Workspace)
    assert [s.name for s in workspace.sections] == sections(view)
    by_name = {s.name: s for s in workspace.sections}
    assert by_name["Leaderboard"].pinned and by_name["Leaderboard"].is_open
    for family, tasks in view.families.items():
        assert referenced(by_name[FAMILIES_REGISTERED[family].title].panels)["history"] == family_curves(family, tasks)
    assert referenced(by_name["Depth x length heatmaps"].panels)["media"] == {
        f"heatmaps/{f}" for f in view.families if FAMILIES_REGISTERED[f].has_depth}
    model = workspace._to_model()  # the spec W&B would receive: builds without network or credentials
    assert model.spec.section.panel_bank_config.sections[0].name == "Leaderboard"


def test_every_workspace_key_is_one_the_logger_produces(view, produced):
    workspace = dashboards.workspace("ent", "proj", view)
    keys: dict[str, set[str]] = defaultdict(set)
    for section in workspace.sections:
        for kind, found in referenced(section.panels).items():
            keys[kind] |= found
    keys["summary"] |= _columns(workspace.runset_settings.pinned_columns)
    for kind in ("summary", "history", "media", "tables"):
        assert keys[kind] - produced[kind] == set(), kind
    # and the headline numbers, per-length averages and every family's curves are all on show
    headline = {k for k in produced["summary"] if k.startswith(("headline/", "avg/", "count/"))} - {
        "headline/threshold"}
    assert headline <= keys["summary"]
    assert {k for k in produced["history"] if k.startswith("curve/")} <= keys["history"]
    # and a group of a family's metrics that its panels show several of (LongBench v2's breakdown, TAIL's
    # headline) is shown whole
    shown = Counter(family_metric_key(name, metric).rsplit("/", 1)[0] + "/" for name, family in
                    FAMILIES_REGISTERED.items() for panel in family.panels for metric in panel.metrics)
    groups = tuple(group for group, count in shown.items() if count > 1)
    assert {k for k in produced["summary"] if k.startswith(groups)} <= keys["summary"]


def test_report_has_the_same_views_with_the_same_keys(view, produced):
    report = dashboards.report("ent", "proj", view)
    assert isinstance(report, wr.Report) and report.entity == "ent" and report.project == "proj"
    headings = [b.text for b in report.blocks if isinstance(b, wr.H1 | wr.H2)]
    assert headings == sections(view)
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    keys: dict[str, set[str]] = defaultdict(set)
    for grid in grids:
        assert grid.runsets[0].project == "proj" and grid.runsets[0].entity == "ent"
        keys["summary"] |= _columns(grid.runsets[0].pinned_columns)
        for kind, found in referenced(grid.panels).items():
            keys[kind] |= found
    for kind in ("summary", "history", "media", "tables"):
        assert keys[kind] and keys[kind] - produced[kind] == set(), kind


def test_leaderboard_columns_follow_the_suites():
    ruler = dashboards.default_view(["ruler"])
    assert list(ruler.families) == ["ruler"] and ruler.lengths == (4096, 8192, 16384, 32768, 65536, 131072)
    columns = dashboards.leaderboard_columns(ruler)
    assert columns[0] == "run:displayName" and "summary:headline/effective_length" in columns
    assert [c for c in columns if c.startswith("summary:avg/")] == [f"summary:avg/{n}" for n in ruler.lengths]
    everything = dashboards.default_view()  # every suite in conf/suite: the families in the registry's order
    assert list(everything.families) == [f for f in FAMILIES_REGISTERED if f in everything.families]
    suites = conf_dir() / "suite"
    assert set(everything.families) >= {f for f in FAMILIES_REGISTERED if (suites / f"{f}.yaml").is_file()}
    with pytest.raises(ConfigError, match="unknown suite 'nope'"):
        dashboards.default_view(["nope"])


def test_a_familys_section_shows_the_panels_it_declares(monkeypatch):
    toy = Family(name="toy", title="Toy", tasks=(), intro="A toy family.", has_depth=False, cumulative_curves=True,
                 panels=(Panel("by group (%)", ("by group/Hard Cases", "by group/easy")), Panel(table="toy_table")))
    monkeypatch.setitem(FAMILIES_REGISTERED, "toy", toy)
    panels = dashboards.family_panels("toy", ("t1",))
    bars = [p for p in panels if isinstance(p, wr.BarPlot)]
    assert bars[-1].title == "Toy: by group (%)"
    assert bars[-1].metrics == ["toy/by_group/hard_cases", "toy/by_group/easy"]  # the keys tracking logs
    assert referenced(panels)["tables"] == {"results/toy_table"}
    assert "cumulative/toy/t1" in referenced(panels)["history"]
    view = dashboards.View(families={"ruler": ("vt",), "toy": ("t1",)}, lengths=LENGTHS)
    assert referenced(dashboards.heatmap_panels(view))["media"] == {"heatmaps/ruler"}  # no depth: no heatmap


def test_create_without_credentials_fails_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with pytest.raises(TrackingError, match="WANDB_API_KEY"):
        dashboards.create("ent", "proj")
    assert main(["dashboards", "create", "--entity", "ent", "--project", "proj", "--report"]) == 2
    assert "no W&B credentials" in capsys.readouterr().out
