"""Command line: `longeval run | plan | generate | infer | score | report | compare | models prepare`, builders
(`longeval mrcr build-pool`, `longeval tail build`), data (`longeval data fetch-essays`) and housekeeping
(`longeval cache prune`).

Every command takes Hydra-style overrides (`model=... suite=ruler suite.lengths=[4096,8192]`) and
works on the run root they name, so each stage can run alone on an existing run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from longeval.cluster import interrupt
from longeval.config.redaction import Redactor
from longeval.engines.models import build_tiny_model, prepare_smollm2, resolve_model_path
from longeval.errors import ConfigError, LongevalError, find_error
from longeval.text.essays import default_urls, fetch_essays, read_url_list

# A command imports the modules it runs inside its handler: they load pyarrow, OmegaConf, the task registry and
# matplotlib (and Ray and vLLM when a stage runs), which `longeval --help`, a typo or another command should not
# wait for. Modules that need none of that are imported above. tests/test_imports.py allows this file's local imports.

PIPED_WIDTH = 240
"""Output to a file or a pipe is not cut at rich's default 80 columns: wide tables and long paths stay whole."""
console = Console(stderr=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH)


class RateColumn(ProgressColumn):
    """Rows per second (or per minute, for slow stages such as long-context inference)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text("", style="progress.data.speed")
        return Text(f"{speed:.1f}/s" if speed >= 1 else f"{speed * 60:.1f}/min", style="progress.data.speed")


def _progress() -> Progress:
    """Every long stage's bar: rows done, rate, time elapsed and left."""
    return Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)


def print_results(result) -> None:
    """What `longeval run` prints when it reports: the results table (and what makes it not RULER's), the errors,
    each family's own tables, the adaptive decisions, a partial run's warning, and where the results are."""
    from longeval.report.table import render_declared, render_errors, render_results
    from longeval.tasks import FAMILIES

    status = result.status or {}
    if result.summary is not None and result.summary.num_rows:
        console.print(render_results(result.summary, result.lengths, result.headline,
                                     incomplete=bool(status) and not status["complete"]))
        note = _essay_line(result)
        if note:
            console.print(f"[bold yellow]not RULER's haystack:[/] {escape(note)}")
    if result.errors is not None and result.errors.num_rows:
        console.print(render_errors(result.errors))
    for family in FAMILIES.values():  # each family's own tables (SYNC's ladder, LongBench v2's Table 2, ...)
        for declared in family.tables:
            table = result.tables.get(declared.name)
            if declared.render is not None and table is not None and table.num_rows:
                console.print(render_declared(declared.render, table))
    if getattr(result, "adaptive", None):
        from longeval.report.adaptive import render_adaptive

        console.print(render_adaptive(result.adaptive["adaptive"], result.adaptive["adaptive_lengths"],
                                      result.adaptive["compute"], result.adaptive.get("adaptive_groups")))
    consistency = getattr(result, "consistency", None)
    if consistency is not None and not consistency.complete:
        console.print(f"[bold yellow]warning:[/] {escape(consistency.one_line(result.root))}", soft_wrap=True)
    console.print(f"results: {result.root}  (summary/*.csv and summary.json, scores/, predictions/, instances/)")
    if result.tracking:
        console.print(result.tracking)


def _exit_code(*partial: bool) -> int:
    """0 when every report is complete and current, `consistency.PARTIAL_EXIT` when one is partial."""
    from longeval.run.consistency import PARTIAL_EXIT

    return PARTIAL_EXIT if any(partial) else 0


def _essay_line(result) -> str:
    """Under the results table, as in the HTML report and the README: essay-haystack scores on a corpus other
    than RULER's Paul Graham essays are not comparable with RULER's table. A run root whose versions.json
    cannot be read says nothing (the table stays what matters)."""
    from longeval.errors import StoreError
    from longeval.report.runs import essay_sentence, run_versions

    try:
        versions = run_versions(result.root)
    except (StoreError, OSError, ValueError):
        return ""
    return essay_sentence(versions, result.summary)


def cmd_run(overrides: list[str], stages: tuple[str, ...]) -> int:
    from longeval.config import load_config
    from longeval.run.pipeline import run

    cfg = load_config(overrides)
    suite = cfg.suite.name  # the name alone would misstate a suite whose tasks the command line replaced
    if any(o.lstrip("+~").split("=", 1)[0] == "suite.tasks" for o in overrides):
        suite += f" (tasks overridden: {', '.join(cfg.suite.tasks)})" if len(cfg.suite.tasks) <= 4 else \
            " (tasks overridden)"
    console.print(f"[bold]longeval[/] {' '.join(stages)}: model {cfg.model.name}, suite {suite} "
                  f"({len(cfg.suite.tasks)} tasks x {len(cfg.suite.lengths)} lengths x {cfg.suite.samples} samples)"
                  f" -> {cfg.run_root}")
    with interrupt.watch():
        with _progress() as progress:
            result = run(cfg, stages=stages, progress=progress)
        interrupt.check()  # a Ctrl-C that a library swallowed still ends the run as interrupted
    if "report" in stages:
        print_results(result)
        return _exit_code(result.consistency is not None and not result.consistency.complete)
    console.print(f"done: {result.root}")
    check = result.consistency  # after `score` or `infer` (`pipeline._checked`): what they left partial, if anything
    partial = check is not None and not (check.complete if "score" in stages else check.predictions_complete)
    if partial:
        console.print(f"[bold yellow]warning:[/] {escape(check.one_line(result.root))}", soft_wrap=True)
    return _exit_code(partial)


def cmd_check(overrides: list[str]) -> None:
    """Load the overrides as `run` would and run every check that needs no data file, run root or Ray
    (`plan.check_config`, as `plan` and `run` do): a batch script asks this before it brings up a Ray cluster, so a
    mistyped task or suite, a length the model cannot read or a run name too long fails in seconds instead of after
    the allocation's cluster start."""
    from longeval.config import load_config
    from longeval.planning.plan import check_config

    cfg = load_config(overrides)
    check_config(cfg)
    console.print(f"config ok: model {cfg.model.name}, {len(cfg.suite.tasks)} tasks x {len(cfg.suite.lengths)} "
                  f"lengths x {cfg.suite.samples} samples -> {cfg.run_root}", soft_wrap=True)


def cmd_plan(overrides: list[str]) -> None:
    from longeval.config import load_config
    from longeval.planning.view import print_plan

    print_plan(load_config(overrides), console)


def cmd_models(args: argparse.Namespace) -> None:
    path = prepare_smollm2()
    console.print(f"SmolLM2-135M-Instruct: {path}")
    if args.tiny:
        console.print(f"tiny random model: {build_tiny_model()}")


def cmd_mrcr(args: argparse.Namespace) -> None:
    from longeval.builders.mrcr_pool import build_pool
    from longeval.config import load_config

    cfg = load_config(args.overrides)
    console.print(f"[bold]longeval[/] mrcr build-pool: model {cfg.model.name}, {args.per_key} writings per "
                  f"format and topic, seed {args.seed} -> {args.out}")
    with _progress() as progress:
        n = build_pool(cfg, str(resolve_model_path(cfg.model.path)), args.out, per_key=args.per_key, seed=args.seed,
                       topics=args.topics, max_new_tokens=args.max_new_tokens, progress=progress)
    console.print(f"{n} writings in {args.out}; use it with suite.params.mrcr.pool_path={args.out}")


def cmd_tail(args: argparse.Namespace) -> None:
    from longeval.builders.tail_build import build_tail
    from longeval.config import load_config
    from longeval.tasks.tail import DEFAULT_DEPTHS

    cfg = load_config(args.overrides)
    depths = tuple(args.depths) if args.depths else DEFAULT_DEPTHS
    console.print(f"[bold]longeval[/] tail build: documents {args.docs}, generator {cfg.model.name}, "
                  f"{len(depths)} depths, seed {args.seed} -> {args.out}")
    with _progress() as progress:
        result = build_tail(cfg, str(resolve_model_path(cfg.model.path)), args.docs, args.out, depths=depths,
                            seed=args.seed, max_attempts=args.max_attempts, question_tokens=args.question_tokens,
                            check_tokens=args.check_tokens, progress=progress)
    console.print(f"{result.questions} questions ({result.exhausted} depths without one) in {result.rounds} rounds; "
                  f"attempts by outcome: {', '.join(f'{k} {v}' for k, v in sorted(result.reasons.items()))}")
    console.print(f"dataset: {args.out}; evaluate it: longeval run suite=tail suite.params.tail.dataset={args.out}")


def _is_run_root(arg: str) -> bool:
    """`longeval report` arguments with '=' are Hydra overrides, the others run roots; s3:// and file:// URIs
    are run roots even with '=' in them (Hive-style prefixes)."""
    return "=" not in arg or arg.startswith(("s3://", "file://"))


def cmd_report(args: argparse.Namespace) -> int:
    roots = [a for a in args.overrides if _is_run_root(a)]
    overrides = [a for a in args.overrides if not _is_run_root(a)]
    if roots and overrides:
        raise ConfigError(f"give run roots ({' '.join(roots)}) or Hydra overrides ({' '.join(overrides)}), not both: "
                          "`longeval report RUN_ROOT ... -o report.html` or `longeval report suite=... [-o ...]`")
    code = 0
    said = not roots  # the overrides' root: cmd_run prints its `warning: partial run` line with its tables
    if not roots:
        code = cmd_run(overrides, ("report",))
        if not args.output:
            return code
        from longeval.config import load_config

        roots = [load_config(overrides).run_root]
    from longeval.report.html import write_report
    from longeval.stages.summarise import summarise_root

    _probe(roots)
    warn_if_written(roots)
    result = write_report(roots, args.output or "report.html", resamples=args.resamples, seed=args.seed,
                          compare=not args.no_compare, summarise=summarise_root)
    for run in result.runs:
        if run.computed:
            console.print(f"{run.label}: summaries computed from the scores and written to {run.uri}/summary/")
    for pair in result.pairs:
        if pair.comparison is None:
            console.print(f"[yellow]not compared[/] {pair.b} with {pair.a}: {pair.error}")
        else:
            console.print(f"compared {pair.b} with {pair.a}: {pair.comparison.matched.describe()}")
    for run in result.runs:
        if run.problem and not said:
            console.print(f"[bold yellow]warning:[/] {escape(run.problem)}", soft_wrap=True)
    extra = f", per-instance CSVs in {result.data_files[0].parent}" if result.data_files else ""
    console.print(f"report: {result.path} ({len(result.runs)} run(s){extra})")
    return code or _exit_code(*(bool(run.problem) for run in result.runs))


def _probe(roots: list[str]) -> None:
    """Reach every remote run root once, quickly, as `run` does: an unreachable store fails now, not after
    minutes of retries."""
    from longeval.store.run_root import RunRoot

    for uri in roots:
        root = RunRoot(uri)
        if root.local_path() is None:
            root.probe()


def warn_if_written(roots: list[str]) -> None:
    """One line per run root another live process is writing (holds its lease): its numbers may still change."""
    from longeval.store.lease import writer_warning
    from longeval.store.run_root import RunRoot

    for uri in roots:
        warning = writer_warning(RunRoot(uri))
        if warning:
            console.print(f"[bold yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def cmd_compare(args: argparse.Namespace) -> int:
    from longeval.report.runs import check_run, load_scores, provenance_pairs
    from longeval.report.table import render_comparison
    from longeval.stats.compare import compare_scores
    from longeval.store.run_root import RunRoot

    _probe([args.a, args.b])
    warn_if_written([args.a, args.b])
    roots = [RunRoot(uri, remember_listings=True) for uri in (args.a, args.b)]
    a, b = (root.uri for root in roots)
    # stale scores are refused here; a root without scores gets load_scores' message
    checks = [check_run(root) if root.has("scores", "scores") else None for root in roots]
    comparison = compare_scores(load_scores(a), load_scores(b), resamples=args.resamples, seed=args.seed,
                                provenance=provenance_pairs(a, b), names=(a, b))
    console.print(f"A = {a}\nB = {b}\n{comparison.matched.describe()}")
    console.print(render_comparison(comparison.table))
    console.print(f"95 % interval: paired bootstrap, {args.resamples} resamples, seed {args.seed}; p: exact McNemar "
                  "for 0/1 scores, paired permutation for continuous ones (two-sided, per row, unadjusted)")
    if args.csv:
        import pyarrow.csv as pacsv

        pacsv.write_csv(comparison.table, args.csv)
        console.print(f"table: {args.csv}")
    for uri, check in zip((a, b), checks, strict=True):
        if check is not None and not check.complete:
            console.print(f"[bold yellow]warning:[/] {escape(check.one_line(uri))}", soft_wrap=True)
    return _exit_code(*(check is not None and not check.complete for check in checks))


def cmd_data(args: argparse.Namespace) -> None:
    urls = read_url_list(args.url_list) if args.url_list else default_urls()
    console.print(f"[bold]longeval[/] data fetch-essays: {len(urls)} essays -> {args.out}")
    result = fetch_essays(args.out, urls=urls, timeout=args.timeout)
    for url, reason in result.failed:
        console.print(f"[yellow]failed[/] {url}: {reason}")
    console.print(f"{result.essays} essays, {result.words} words; corpus {result.name!r}")
    if result.failed:
        console.print("[bold yellow]incomplete:[/] essay-haystack scores on this folder are not comparable with "
                      "RULER's published table; run the command again to retry")
    console.print(f"use it: longeval run suite=ruler suite.data.essay_dir={result.folder}")


def cmd_cache(args: argparse.Namespace) -> None:
    """`longeval cache prune`: the cache the overrides name (`store.root`, `store.instance_cache`), as a run's."""
    from longeval.config import load_config
    from longeval.planning.capacity import format_bytes
    from longeval.stages.instance_cache import cache_uri, check_cache_location, parse_age, parse_size, prune

    older_than = parse_age(args.older_than) if args.older_than is not None else None
    max_bytes = parse_size(args.max_size) if args.max_size is not None else None
    if older_than is None and max_bytes is None:
        raise ConfigError("longeval cache prune needs --older-than AGE (e.g. 30d), --max-size SIZE (e.g. 50GB), "
                          "or both")
    cfg = load_config(args.overrides)
    check_cache_location(cfg.store.root, cfg.store.instance_cache)
    uri = cache_uri(cfg.store.root, cfg.store.instance_cache)
    _probe([uri])
    result = prune(uri, older_than_s=older_than, max_bytes=max_bytes, dry_run=args.dry_run)
    if args.dry_run:
        now = time.time()
        for entry in result.removed:
            age = (now - entry.shard.mtime_ns / 1e9) / 86400
            state = "" if entry.useful else (" (damaged)" if entry.stage != "instances" else " (uncommitted)")
            console.print(f"would remove {entry.name}{state}: {format_bytes(entry.size)}, unused for {age:.1f} days")
    verb = "would remove" if args.dry_run else "removed"
    freed = result.freed_bytes
    linked = (f"; {format_bytes(result.removed_bytes - freed)} of it stays on disk, linked from run roots"
              if freed < result.removed_bytes else "")
    console.print(f"cache {uri}: {verb} {len(result.removed)} entries ({format_bytes(result.removed_bytes)}{linked}), "
                  f"kept {len(result.kept)} ({format_bytes(result.kept_bytes)})", soft_wrap=True)


def cmd_dashboards(args: argparse.Namespace) -> None:
    from longeval.tracking.dashboards import create

    console.print(f"[bold]longeval[/] dashboards create: W&B {args.entity}/{args.project}"
                  f"{' with a report' if args.report else ''}")
    for url in create(args.entity, args.project, suites=args.suite, with_report=args.report):
        console.print(f"saved: {url}")


EXIT_CODES_HELP = ("exit codes: 0 done, results complete and current; 3 results partial (work left: one 'warning: "
                   "partial run' line says what); 2 error, stale scores included (one 'error:' line); 130 interrupted")
"""`longeval --help`'s epilog (README.md, Outputs; `consistency.EXIT_CODES`)."""
STAGE_EXIT_CODES_HELP = {
    "generate": "exit codes: 0 done, every planned instance shard written (whether the run's results are complete: "
                "`longeval report`); 2 error (one 'error:' line); 130 interrupted",
    "infer": "exit codes: 0 done, every planned instance has a final prediction (scoring them: `longeval score`); "
             "3 some are left without one, e.g. engine errors (one 'warning: partial run' line says what; a rerun "
             "retries them); 2 error (one 'error:' line); 130 interrupted",
    "check": "exit codes: 0 the config passes every check that needs no data and no Ray; 2 error (one 'error:' "
             "line); 130 interrupted",
    "cache": "exit codes: 0 entries removed (or listed with --dry-run); 2 error, e.g. a cache that does not exist "
             "(one 'error:' line); 130 interrupted",
}
"""The epilogs of the commands that make no results: what their exit codes say about their own work
(`cmd_run`, `pipeline._checked`, `cmd_check`, `cmd_cache`); docs/operations.md ("Exit codes") has them all."""

WRITES_A_RUN = frozenset({"run", "generate", "infer", "score"})
"""The commands that write shards and predictions to a run root, which a rerun of the same command resumes."""


SIGNED_VALUE_OPTIONS = ("--older-than", "--max-size")
"""Options whose value a user may mistype as negative (`cache prune --older-than -5d`)."""


def attach_signed_values(argv: list[str]) -> list[str]:
    """`--older-than -5d` as `--older-than=-5d`: argparse takes a value that starts with '-' and is not a plain
    number for another option and answers only "expected one argument"; attached, it reaches the option's own
    check, which says why a negative value makes no sense."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in SIGNED_VALUE_OPTIONS and arg[:2] in {f"-{d}" for d in "0123456789."}:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def longeval_error(exc: BaseException) -> LongevalError | None:
    """The one place that finds the error to print: `exc` itself, or the LongevalError a Ray worker raised in it."""
    return find_error(exc, LongevalError)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="longeval", description=__doc__.splitlines()[0], epilog=EXIT_CODES_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "generate, infer, score and report"),
        ("plan", "print the shards and pools a run would use, without running"),
        ("check", "load and check the overrides as run would (a mistyped task or suite, a length above "
                  "max_model_len, a run name too long are errors) and run nothing"),
        ("generate", "write the instances only"),
        ("infer", "run the engine on instances without predictions"),
        ("score", "score the predictions"),
        ("report", "summarise the scores and print the results table; with run roots, write an HTML report"),
    ):
        p = sub.add_parser(name, help=help_text, epilog=STAGE_EXIT_CODES_HELP.get(name, EXIT_CODES_HELP))
        p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. suite=ruler suite.lengths=[4096]")
        stages = ("generate", "infer", "score", "report") if name == "run" else (name,)
        p.set_defaults(func=lambda a, stages=stages: cmd_run(a.overrides, stages))
    sub.choices["plan"].set_defaults(func=lambda a: cmd_plan(a.overrides))
    sub.choices["check"].set_defaults(func=lambda a: cmd_check(a.overrides))
    report = sub.choices["report"]
    report.description = ("`longeval report [overrides]` summarises the run root the overrides name and prints its "
                          "tables; `longeval report RUN_ROOT [RUN_ROOT ...] -o report.html` writes a self-contained "
                          "HTML report of those run roots (arguments without '=' are run roots) and compares each "
                          "run with the first.")
    report.add_argument("-o", "--output", help="the HTML report to write (default report.html with run roots)")
    report.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples of the comparisons")
    report.add_argument("--seed", type=int, default=0, help="seed of the comparisons' bootstrap")
    report.add_argument("--no-compare", action="store_true", help="leave out the paired comparisons")
    report.set_defaults(func=cmd_report)
    compare = sub.add_parser("compare", help="paired comparison of two run roots on their shared instances",
                             epilog=EXIT_CODES_HELP)
    compare.add_argument("a", help="run root A, the baseline (local or s3://)")
    compare.add_argument("b", help="run root B; differences are B - A")
    compare.add_argument("--resamples", type=int, default=10_000, help="bootstrap (and permutation) resamples")
    compare.add_argument("--seed", type=int, default=0, help="seed of the bootstrap; the same seed, the same table")
    compare.add_argument("--csv", help="also write the table as CSV to this local path")
    compare.set_defaults(func=cmd_compare)
    models = sub.add_parser("models", help="prepare the packaged models")
    models.add_argument("action", choices=["prepare"])
    models.add_argument("--tiny", action="store_true", help="also build the tiny random-weight test model")
    models.set_defaults(func=cmd_models)
    mrcr = sub.add_parser("mrcr", help="MRCR tools: build-pool writes a writings pool with the model")
    mrcr.add_argument("action", choices=["build-pool"])
    mrcr.add_argument("out", help="the pool's .parquet path, local or s3://")
    mrcr.add_argument("--per-key", type=int, default=8, help="writings per (format, topic); 8 needles need 8")
    mrcr.add_argument("--seed", type=int, default=0)
    mrcr.add_argument("--topics", type=int, default=None, help="only the first N topics (a small pool)")
    mrcr.add_argument("--max-new-tokens", type=int, default=256)
    mrcr.add_argument("overrides", nargs="*", help="Hydra overrides for the model, e.g. model=llama31_8b")
    mrcr.set_defaults(func=cmd_mrcr)
    tail = sub.add_parser("tail", help="TAIL tools: build writes a QA benchmark from your documents")
    tail.add_argument("action", choices=["build"])
    tail.add_argument("docs", help="a folder (local or s3://) with one subfolder of .txt/.md/.pdf per domain")
    tail.add_argument("out", help="the benchmark's folder (local or s3://); rerun with it to resume")
    tail.add_argument("--depths", type=float, nargs="+", help="gold depths as fractions (default 0.05 ... 0.95)")
    tail.add_argument("--seed", type=int, default=0)
    tail.add_argument("--max-attempts", type=int, default=5, help="per gold paragraph, then the preceding one")
    tail.add_argument("--question-tokens", type=int, default=512, help="output budget of a question request")
    tail.add_argument("--check-tokens", type=int, default=64, help="output budget of a quality or RAG check")
    tail.add_argument("overrides", nargs="*", help="Hydra overrides for the generator model, e.g. model=llama31_8b")
    tail.set_defaults(func=cmd_tail)
    data = sub.add_parser("data", help="data tools: fetch-essays downloads RULER's essay haystack (Paul Graham's)")
    data.add_argument("action", choices=["fetch-essays"])
    data.add_argument("out", help="the folder to write (then suite.data.essay_dir=OUT)")
    data.add_argument("--url-list", help="essay URLs, one a line (default: RULER's PaulGrahamEssays_URLs.txt)")
    data.add_argument("--timeout", type=float, default=30.0, help="seconds per download")
    data.set_defaults(func=cmd_data)
    cache = sub.add_parser("cache", help="instance cache: prune removes entries by age or total size",
                           epilog=STAGE_EXIT_CODES_HELP["cache"])
    cache.add_argument("action", choices=["prune"])
    cache.add_argument("--older-than", metavar="AGE", help="remove entries not written or used for AGE, e.g. 30d, 12h")
    cache.add_argument("--max-size", metavar="SIZE", help="then remove the least recently used entries until the "
                       "cache holds at most SIZE, e.g. 50GB, 500MB, 2GiB")
    cache.add_argument("--dry-run", action="store_true", help="print what would be removed and remove nothing")
    cache.add_argument("overrides", nargs="*", help="Hydra overrides naming the cache as a run would: "
                       "store.root=... (its _cache) or store.instance_cache=...")
    cache.set_defaults(func=cmd_cache)
    dashboards = sub.add_parser("dashboards", help="W&B dashboards: create saves the standard workspace (and report)")
    dashboards.add_argument("action", choices=["create"])
    dashboards.add_argument("--entity", required=True, help="W&B user or team that owns the project")
    dashboards.add_argument("--project", required=True, help="the W&B project the runs log to (tracking.project)")
    dashboards.add_argument("--suite", action="append", help="only this suite's families and lengths (repeatable; "
                            "default: every suite in conf/suite)")
    dashboards.add_argument("--report", action="store_true", help="also save a W&B report with the same views")
    dashboards.set_defaults(func=cmd_dashboards)
    args, extra = parser.parse_known_args(attach_signed_values(sys.argv[1:] if argv is None else argv))
    if extra and args.command in ("mrcr", "tail", "report", "cache") and not any(e.startswith("-") for e in extra):
        args.overrides += extra  # overrides may follow the options: `build-pool out --per-key 2 model=...`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=os.environ.get("LONGEVAL_LOG", "WARNING"))
    try:
        code = args.func(args)  # each subcommand's handler (set_defaults above); None: 0
    except Exception as exc:
        error = longeval_error(exc)
        if error is None:
            raise
        text = Redactor.of().text(str(error))  # a URL's user info, a secret-named variable's value
        console.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True)  # one line, however long
        return 2
    except KeyboardInterrupt as exc:
        what, code = ("terminated (SIGTERM)", 143) if isinstance(exc, interrupt.Terminated) else ("interrupted", 130)
        if args.command not in WRITES_A_RUN:  # plan, report, compare...: nothing kept, nothing to resume
            console.print(f"[bold yellow]{what}[/]")
            return code
        again = shlex.join(["longeval", *(sys.argv[1:] if argv is None else argv)])
        console.print(f"[bold yellow]{what}:[/] finished shards and predictions are kept; resume with the same "
                      f"command: {escape(again)}", soft_wrap=True)
        return code
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
