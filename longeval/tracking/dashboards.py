"""W&B dashboards as code: the standard workspace and report of a longeval project (`wandb-workspaces`).

Views: a leaderboard across models (the runs table pinned to RULER's headline columns, and bar charts of
Avg, wAvg and the effective length), length curves (every run's score against context length, overlaid),
one section per registered family (`longeval.tasks.FAMILIES`: task curves, headline bars and the views the
family declares, `Family.panels`), and the depth x length heatmaps. Every metric key comes from
`longeval.tracking.keys`, the key functions the logged payloads are built with, so a panel never asks for a key that
no run logs.

Building the objects needs neither network nor credentials (tests build them); `create` saves them to W&B
and needs both, failing with a `TrackingError` that says what is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from longeval.config import conf_dir, group_choices
from longeval.errors import ConfigError
from longeval.tasks import FAMILIES, get_task
from longeval.tasks.family import Panel
from longeval.tracking.credentials import TrackingError, has_credentials
from longeval.tracking.keys import (
    COUNT_METRICS,
    HEADLINE_METRICS,
    STEP_METRIC,
    avg_key,
    count_key,
    cumulative_key,
    curve_key,
    family_metric_key,
    headline_key,
    heatmap_key,
    result_table_key,
)

__all__ = ["View", "create", "default_view", "leaderboard_columns", "report", "workspace"]

WORKSPACE_NAME = "longeval"
REPORT_TITLE = "longeval: long-context evaluation"


@dataclass(frozen=True)
class View:
    """What the dashboards show: each family's tasks, and the lengths of the leaderboard's columns."""

    families: dict[str, tuple[str, ...]]
    lengths: tuple[int, ...]


def default_view(suites: Sequence[str] | None = None) -> View:
    """The families, tasks and lengths of the given suite configs (conf/suite/*.yaml; default: all of them)."""
    from omegaconf import OmegaConf

    names = list(suites or group_choices("suite"))
    families: dict[str, list[str]] = {}
    lengths: set[int] = set()
    for name in names:
        path = conf_dir() / "suite" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown suite {name!r}; choices: {', '.join(group_choices('suite'))}")
        suite = OmegaConf.load(path)
        lengths.update(int(n) for n in suite.lengths)
        for task in suite.tasks:
            spec = get_task(str(task))
            if spec.name not in families.setdefault(spec.family, []):
                families[spec.family].append(spec.name)
    ordered = [f for f in FAMILIES if f in families] + sorted(set(families) - set(FAMILIES))
    return View(families={f: tuple(families[f]) for f in ordered}, lengths=tuple(sorted(lengths)))


def _title(family: str) -> str:
    declared = FAMILIES.get(family)
    return declared.title if declared else family


def leaderboard_columns(view: View) -> list[str]:
    """The runs table's pinned columns: model, suite, claimed context, RULER's headline, per-length scores."""
    return ["run:displayName", "config:model.name.value", "config:suite.name.value", "config:model.max_model_len.value",
            *[f"summary:{headline_key(m)}" for m in ("effective_length", "avg", "wavg_inc", "wavg_dec")],
            *[f"summary:{avg_key(n)}" for n in view.lengths],
            *[f"summary:{count_key(m)}" for m in COUNT_METRICS]]


def _length_plot(title: str, keys: list[str]) -> Any:
    import wandb_workspaces.reports.v2 as wr

    return wr.LinePlot(title=title, x=STEP_METRIC, y=keys, log_x=True, title_x="context length (tokens)",
                       title_y="score (%)", range_y=(0, 100), max_runs_to_show=50, legend_template="${run:displayName}")


def _bars(title: str, keys: list[str]) -> Any:
    import wandb_workspaces.reports.v2 as wr

    return wr.BarPlot(title=title, metrics=keys, orientation="h", max_runs_to_show=50)


def leaderboard_panels(view: View) -> list[Any]:
    """Bar charts of the headline numbers, one bar per run (model), and the suite's length curve."""
    return [
        _bars("Avg over lengths (%)", [headline_key("avg")]),
        _bars("wAvg: long lengths weigh more (inc) / less (dec) (%)",
              [headline_key("wavg_inc"), headline_key("wavg_dec")]),
        _bars("Effective length (tokens; 0: none above the threshold)", [headline_key("effective_length")]),
        _length_plot("Suite average against length", [curve_key()]),
    ]


def length_curve_panels(view: View) -> list[Any]:
    """Every family's average against length, every run overlaid."""
    return [_length_plot(f"{_title(f)}: average against length", [curve_key(f)]) for f in view.families]


def family_panels(family: str, tasks: Sequence[str]) -> list[Any]:
    """One family's section: headline bars, its average and every task against length, and its own views."""
    title = _title(family)
    panels: list[Any] = [
        _bars(f"{title}: Avg / wAvg(inc) / wAvg(dec) (%)", [headline_key(m, family) for m in HEADLINE_METRICS[:3]]),
        _length_plot(f"{title}: average against length", [curve_key(family)]),
        *[_length_plot(f"{title}/{task}", [curve_key(family, task)]) for task in tasks],
    ]
    declared = FAMILIES.get(family)
    if declared and declared.cumulative_curves:  # the paper's "up to length L" curves (Michelangelo's Figures 1-8)
        panels += [_length_plot(f"{title}/{task}: cumulative score up to each length",
                                [cumulative_key(family, task)]) for task in tasks]
    panels += [_declared_panel(family, title, panel) for panel in (declared.panels if declared else ())]
    return panels


def _declared_panel(family: str, title: str, panel: Panel) -> Any:
    """A family's own view: a logged result table, or bars of its tables' summary metrics."""
    import wandb_workspaces.reports.v2 as wr

    if panel.table is not None:
        return wr.WeavePanelSummaryTable(table_name=result_table_key(panel.table))
    return _bars(f"{title}: {panel.title}", [family_metric_key(family, m) for m in panel.metrics])


def heatmap_panels(view: View) -> list[Any]:
    """The depth x length heatmap images, one panel per family (TAIL's Figure 5; RULER's needle depths)."""
    import wandb_workspaces.reports.v2 as wr

    return [wr.MediaBrowser(title=f"{_title(f)}: score by depth and length", media_keys=[heatmap_key(f)],
                            num_columns=2) for f in view.families if _has_depth(f)]


def _has_depth(family: str) -> bool:
    declared = FAMILIES.get(family)
    return declared.has_depth if declared else True


def workspace(entity: str, project: str, view: View, *, name: str = WORKSPACE_NAME) -> Any:
    """The project workspace: leaderboard, length curves, a section per family, heatmaps."""
    import wandb_workspaces.workspaces as ws

    sections = [
        ws.Section(name="Leaderboard", panels=leaderboard_panels(view), is_open=True, pinned=True),
        ws.Section(name="Length curves", panels=length_curve_panels(view), is_open=True),
        *[ws.Section(name=_title(f), panels=family_panels(f, tasks)) for f, tasks in view.families.items()],
        ws.Section(name="Depth x length heatmaps", panels=heatmap_panels(view)),
    ]
    return ws.Workspace(
        entity=entity, project=project, name=name, sections=sections,
        settings=ws.WorkspaceSettings(x_axis=STEP_METRIC, max_runs=50, group_by_prefix="first"),
        runset_settings=ws.RunsetSettings(pinned_columns=leaderboard_columns(view),
                                          order=[ws.Ordering(ws.Summary(headline_key("avg")), ascending=False)]),
    )


def report(entity: str, project: str, view: View, *, title: str = REPORT_TITLE) -> Any:
    """A report with the same views, readable top to bottom: what each block shows and how to read it."""
    import wandb_workspaces.reports.v2 as wr

    def grid(panels: list[Any]) -> Any:
        runset = wr.Runset(entity=entity, project=project, name="longeval runs",
                           order=[wr.OrderBy(wr.SummaryMetric(headline_key("avg")), ascending=False)],
                           pinned_columns=leaderboard_columns(view))
        return wr.PanelGrid(runsets=[runset], panels=panels)

    blocks: list[Any] = [
        wr.H1("Leaderboard"),
        wr.P("One run per (model, suite) job. Scores are percentages. Avg is the mean over lengths; wAvg(inc) "
             "weighs long lengths more, wAvg(dec) short ones (RULER's Table 3); the effective length is the "
             "longest length scoring above the family's threshold (`headline/threshold`: RULER's 85.6, "
             "Llama-2-7B at 4K, unless the suite sets `effective_threshold`)."),
        grid(leaderboard_panels(view)),
        wr.H1("Length curves"),
        wr.P("Every run's score against context length, on a log axis."),
        grid(length_curve_panels(view)),
    ]
    for family, tasks in view.families.items():
        blocks += [wr.H2(_title(family)), grid(family_panels(family, tasks))]
    blocks += [wr.H1("Depth x length heatmaps"),
               wr.P("Score by the depth of the relevant information (rows) and context length (columns)."),
               grid(heatmap_panels(view))]
    return wr.Report(entity=entity, project=project, title=title, blocks=blocks,
                     description="Leaderboard, length curves, per-family views and heatmaps of a longeval project.",
                     width="fluid")


def create(entity: str, project: str, *, suites: Sequence[str] | None = None, with_report: bool = False) -> list[str]:
    """Save the workspace (and the report) to W&B; returns their URLs. Needs network and credentials."""
    if not has_credentials():
        raise TrackingError("no W&B credentials: set WANDB_API_KEY or run `wandb login` (dashboards are saved "
                            "on the W&B server; runs themselves can be logged offline without credentials)")
    view = default_view(suites)
    urls = []
    try:
        urls.append(workspace(entity, project, view).save().url)
        if with_report:
            urls.append(report(entity, project, view).save().url)
    except Exception as exc:  # wandb raises its own types for auth, network and missing projects
        raise TrackingError(f"cannot save the dashboards to W&B entity {entity!r}, project {project!r}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} — check the "
                            "network (WANDB_BASE_URL), the API key and that the project exists") from exc
    return urls
