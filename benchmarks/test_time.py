"""Where `make test`'s time goes: the suite's cost grouped by what each test starts.

Reads pytest junit reports written with `tests/started.py` active (every test's `started` property: ray,
cluster, engine, s3, slurm, browser) and prints the worker-seconds per kind of test, the costliest files and
tests, and how many tests run each real part. With `--run` it runs the suite first, as `make test` does.
With two reports it prints them side by side (before, after).

    python benchmarks/test_time.py --run [--junit /tmp/suite.xml] [-- PYTEST_ARGS...]
    python benchmarks/test_time.py AFTER.xml [--before BEFORE.xml] [--top 15]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ("ray", "cluster", "engine", "s3", "slurm", "browser")


@dataclass(frozen=True)
class TestTime:
    file: str
    name: str
    seconds: float
    started: frozenset[str] | None
    """None: the report was written without tests/started.py (an older suite): kinds unknown."""
    outcome: str


def read_report(path: Path) -> list[TestTime]:
    """Every test case of a junit report (setup and teardown are inside pytest's per-test time)."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        started = None
        for prop in case.iter("property"):
            if prop.get("name") == "started":
                started = frozenset(filter(None, (prop.get("value") or "").split(",")))
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        classname = case.get("classname") or ""
        parts = classname.split(".")
        module = ".".join(p for p in parts if not p[:1].isupper())  # drop a test class name
        out.append(TestTime(file=module.replace(".", "/") + ".py", name=f"{classname}::{case.get('name')}",
                            seconds=float(case.get("time") or 0.0), started=started, outcome=outcome))
    return out


def kind_label(test: TestTime) -> str:
    """The costliest thing a test starts: the group its time is charged to."""
    if test.started is None:
        return "unknown (no started property)"
    for kind in ("slurm", "cluster", "browser", "engine", "s3", "ray"):
        if kind in test.started:
            return kind
    return "pure (starts nothing)"


def counts(tests: list[TestTime]) -> dict[str, int]:
    """How many tests run each real part (a test with an engine on a two-node cluster counts under both)."""
    ran = [t for t in tests if t.outcome == "passed" and t.started is not None]
    return {kind: sum(kind in t.started for t in ran) for kind in KINDS} | {
        "any real part": sum(bool(t.started) for t in ran), "pure": sum(not t.started for t in ran)}


def summary(tests: list[TestTime], top: int) -> dict[str, list[tuple[str, str]]]:
    """The report's tables as (label, figure) rows."""
    total = sum(t.seconds for t in tests)
    by_kind: dict[str, list[TestTime]] = defaultdict(list)
    for t in tests:
        by_kind[kind_label(t)].append(t)
    files: Counter[str] = Counter()
    for t in tests:
        files[t.file] += t.seconds
    return {
        "total": [("tests", str(len(tests))), ("worker-seconds", f"{total:.0f}"),
                  ("failed or errors", str(sum(t.outcome in ("failure", "error") for t in tests)))],
        "by kind": [(kind, f"{sum(t.seconds for t in ts):7.0f} s  {len(ts):5d} tests  "
                           f"{sum(t.seconds for t in ts) / max(total, 1e-9):5.1%}")
                    for kind, ts in sorted(by_kind.items(), key=lambda kv: -sum(t.seconds for t in kv[1]))],
        "real parts (tests that pass and run each)": [(k, str(v)) for k, v in counts(tests).items()],
        "files": [(f, f"{s:7.1f} s") for f, s in files.most_common(top)],
        "tests": [(t.name, f"{t.seconds:7.1f} s  [{','.join(sorted(t.started or ())) or '-'}]")
                  for t in sorted(tests, key=lambda t: -t.seconds)[:top]],
    }


def print_report(after: list[TestTime], before: list[TestTime] | None, top: int) -> None:
    now = summary(after, top)
    then = summary(before, top) if before is not None else None
    for section, rows in now.items():
        print(f"\n## {section}")
        if then is not None and section in ("total", "by kind", "real parts (tests that pass and run each)"):
            old = dict(then[section])
            width = max(len(label) for label, _ in [*rows, *then[section]])
            print(f"{'':{width}}  {'before':>34}  {'after':>34}")
            for label in dict.fromkeys([*(lbl for lbl, _ in then[section]), *(lbl for lbl, _ in rows)]):
                print(f"{label:{width}}  {old.get(label, '-'):>34}  {dict(rows).get(label, '-'):>34}")
            continue
        width = max((len(label) for label, _ in rows), default=0)
        for label, figure in rows:
            print(f"{label:{width}}  {figure}")


def run_suite(junit: Path, pytest_args: list[str]) -> int:
    """The suite as `make test` runs it, with a junit report (setup first, as `make test` does)."""
    subprocess.run(["make", "setup", "system"], cwd=REPO, check=True)
    command = [str(REPO / ".venv/bin/python"), "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile",
               f"--junitxml={junit}", *pytest_args]
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", nargs="?", type=Path, help="a junit report (with --run: where to write it)")
    parser.add_argument("--before", type=Path, help="an earlier report, printed beside it")
    parser.add_argument("--run", action="store_true", help="run the suite first (two workers, as make test)")
    parser.add_argument("--top", type=int, default=15)
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    report = args.report or Path("/tmp/longeval-suite.xml")
    if args.run:
        code = run_suite(report, pytest_args)
        print(f"pytest exit code {code}")
    elif args.report is None:
        parser.error("give a junit report, or --run")
    if not report.is_file():
        print(f"error: no junit report at {report}: run with --run, or pytest --junitxml={report}", file=sys.stderr)
        return 2
    print_report(read_report(report), read_report(args.before) if args.before else None, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
