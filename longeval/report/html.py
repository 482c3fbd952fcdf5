"""The static HTML report of one or more run roots: `longeval report RUN_ROOT [RUN_ROOT ...] -o report.html`.

The page is self-contained: styles inline, figures inline as base64 SVG images, no script, no font or CDN
download, so it opens offline and can be mailed or archived as one file. Every text (labels, task names,
anything a model wrote) goes through Jinja's autoescaping.

`build_page` is pure (summary tables in, HTML out; its sections come from `longeval.report.sections`);
`write_report` is the edge that reads run roots, computes comparisons, writes per-instance CSVs beside the page
and writes the page. See docs/results.md for what each table and figure shows and how it maps to the papers.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from longeval import __version__
from longeval.errors import ConfigError, LongevalError, OutputError
from longeval.report import plots
from longeval.report.runs import (
    INSTANCE_ROW_COLUMNS,
    RunData,
    instance_rows,
    load_run,
    load_scores,
    provenance_pairs,
    slug,
    unique_labels,
)
from longeval.report.sections import (
    adaptive_section,
    comparison_sections,
    families,
    family_sections,
    leaderboard_section,
    runs_section,
)
from longeval.report.view import PairView
from longeval.stats.compare import compare_scores
from longeval.store.run_root import RunRoot

__all__ = ["ReportResult", "build_page", "write_report"]


def build_page(runs: Sequence[RunData], *, pairs: Sequence[PairView] = (),
               links: Mapping[str, Mapping[str, tuple[str, str]]] | None = None, generated: str = "",
               title: str = "longeval report") -> str:
    """The whole report as one HTML string (pure: the same inputs give the same page)."""
    import jinja2

    colors = plots.run_colors([r.label for r in runs])
    fams = families(runs)
    sections = [runs_section(runs, links or {})]
    board = leaderboard_section(runs, fams)
    if board is not None:
        sections.append(board)
    sections += comparison_sections(pairs)
    for family in fams:
        sections += family_sections(runs, family, colors)
    adaptive = adaptive_section(runs)
    if adaptive is not None:
        sections.append(adaptive)
    source = resources.files("longeval.report").joinpath("templates/report.html.j2").read_text("utf-8")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    subtitle = f"{len(runs)} run(s): " + ", ".join(r.label for r in runs)
    if generated:
        subtitle += f" · generated {generated}"
    return env.from_string(source).render(
        title=title, subtitle=subtitle, sections=sections, version=__version__,
        banners=[f"{r.label}: {r.problem}" for r in runs if r.problem],
        footer=f"longeval {__version__} · self-contained page: figures are inline SVG, no network needed · "
               "docs/results.md explains every table and figure")


# -- the edge: read run roots, write the page and its data files ----------------------------------------


@dataclass(frozen=True)
class ReportResult:
    path: Path
    runs: list[RunData]
    pairs: list[PairView]
    data_files: list[Path]


def _href(target: Path, base: Path) -> str:
    return quote(os.path.relpath(target, base).replace(os.sep, "/"))


def write_report(uris: Sequence[str], out: str | os.PathLike, *, resamples: int = 10_000, seed: int = 0,
                 compare: bool = True, instances: bool = True,
                 summarise: Callable[[RunRoot], Any] | None = None) -> ReportResult:
    """Read the run roots, compare each with the first, and write the page (and per-instance CSVs) to `out`.

    Args:
        uris: run roots, local or s3://; the first is the baseline of the comparisons.
        out: the HTML file to write (local); per-instance CSVs go to `<out stem>_files/` beside it.
        resamples, seed: for the paired bootstrap and permutation tests.
        compare: compare each run with the first (needs scores; runs without shared instances get a note).
        instances: write the per-instance CSVs.
        summarise: writes the summaries of a run root that was scored but not summarised (the CLI hands
            `longeval.stages.summarise.summarise_root`); None: such a root is an error.
    """
    if not uris:
        raise ConfigError("give at least one run root to report on")
    path = Path(out).expanduser().resolve()
    if path.is_dir():  # before reading any run: the answer does not depend on them
        raise OutputError(f"-o {out}: {path} is a directory; give the report's file name, e.g. "
                          f"-o {path / 'report.html'}")
    roots = [RunRoot(u, remember_listings=True) for u in uris]  # one command, one snapshot of each root
    for root in roots if instances else ():
        root.will_read("instances", INSTANCE_ROW_COLUMNS)  # with the checks' columns: one read of each shard
    runs = unique_labels([load_run(root, summarise=summarise) for root in roots])
    written = _Written()
    try:
        return _write(runs, path, written, resamples=resamples, seed=seed, compare=compare, instances=instances)
    except BaseException as exc:  # an OSError, or Ctrl-C half-way: leave nothing behind either way
        written.remove()
        if not isinstance(exc, OSError):
            raise
        raise OutputError(f"cannot write the report {path}: {exc.strerror or exc} ({exc.filename or path}); nothing "
                          "was left behind; give -o a file in a folder you can write, e.g. -o ./report.html") from exc


@dataclass
class _Written:
    """What a report write created, so a failed one removes it all: no `.NAME.tmp`, no `NAME_files/`."""

    files: list[Path] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)

    def mkdir(self, folder: Path) -> None:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        self.dirs += reversed(missing)  # outermost first, so removal goes innermost first

    def remove(self) -> None:
        for path in reversed(self.files):
            path.unlink(missing_ok=True)
        for folder in reversed(self.dirs):
            try:
                folder.rmdir()
            except OSError:  # not empty (someone else's files) or already gone: leave it
                continue


def _write(runs: list[RunData], path: Path, written: _Written, *, resamples: int, seed: int, compare: bool,
           instances: bool) -> ReportResult:
    import pyarrow.csv as pacsv

    written.mkdir(path.parent)
    data_dir = path.with_name(f"{path.stem}_files")
    links: dict[str, dict[str, tuple[str, str]]] = {}
    data_files: list[Path] = []
    for i, run in enumerate(runs):
        mine: dict[str, tuple[str, str]] = {}
        local = Path(run.uri.removeprefix("file://")) if not run.uri.startswith("s3://") else None
        for name in ("config.yaml", "scores/", "predictions/", "instances/", "summary/"):
            if local is not None:
                target = local / name.rstrip("/")
                mine[name] = (name, _href(target, path.parent) + ("/" if name.endswith("/") else "")) \
                    if target.exists() else ("missing", "")
            else:
                mine[name] = (f"{run.uri}/{name}", "")
        if instances:
            try:
                rows = instance_rows(run.root or run.uri)
            except (LongevalError, pa.ArrowException) as exc:  # a convenience: the page is written without it
                mine["per-instance CSV"] = (f"not written: {exc}", "")
            else:
                written.mkdir(data_dir)
                target = data_dir / f"{i + 1:02d}-{slug(run.label)}.instances.csv"
                written.files.append(target)
                pacsv.write_csv(rows, str(target))
                data_files.append(target)
                mine["per-instance CSV"] = (target.name, _href(target, path.parent))
        links[run.label] = mine
    pairs: list[PairView] = []
    if compare and len(runs) > 1:
        base = runs[0]
        for run in runs[1:]:
            try:
                a, b = base.root or base.uri, run.root or run.uri
                comparison = compare_scores(load_scores(a), load_scores(b), resamples=resamples,
                                            seed=seed, provenance=provenance_pairs(a, b),
                                            names=(base.label, run.label))
            except LongevalError as exc:  # no shared instances, or no scores: say so on the page
                pairs.append(PairView(base.label, run.label, error=str(exc)))
            else:
                pairs.append(PairView(base.label, run.label, comparison))
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    page = build_page(runs, pairs=pairs, links=links, generated=generated)
    tmp = path.with_name(f".{path.name}.tmp")
    written.files.append(tmp)
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return ReportResult(path=path, runs=runs, pairs=pairs, data_files=data_files)
