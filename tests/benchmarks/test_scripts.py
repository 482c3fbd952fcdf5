"""Every script in benchmarks/ still runs: what it imports from longeval is public and exists, its `--help` works,
and the scripts with a tiny mode run it in seconds with no figure that came back as an error. A refactor that
breaks a benchmark fails here, not weeks later in a figure that reads `{"error": ...}`."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))


def _script(name: str, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/NAME ARGV` from the repository root, as its docstring says to run it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / name), *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def longeval_imports(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """Every `from longeval... import NAME` and `import longeval...` in a script, at any depth (the scripts import
    longeval inside their functions, after setting threads and environment): (line, module, name or None)."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "longeval":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names if alias.name.split(".")[0] == "longeval"]
    return found


def private_uses(tree: ast.AST) -> list[str]:
    """`x._name` where `x` is longeval or something imported from it (a module, a class)."""
    bound = {"longeval"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "longeval":
            bound |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            bound |= {alias.asname for alias in node.names if alias.asname and alias.name.startswith("longeval")}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                problems.append(f"line {node.lineno}: {ast.unparse(node)}")
    return problems


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_imports_only_public_names_that_exist(name: str) -> None:
    tree = ast.parse((REPO / "benchmarks" / name).read_text(), filename=name)
    problems = []
    for line, module, imported in longeval_imports(tree):
        what = f"line {line}: {module}" + (f".{imported}" if imported else "")
        if any(_private(part) for part in module.split(".")) or (imported and _private(imported)):
            problems.append(f"{what} is private (benchmarks use public names; make a helper public instead)")
            continue
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            problems.append(f"{what}: {exc}")
            continue
        if imported and imported != "*" and not hasattr(loaded, imported):
            try:
                importlib.import_module(f"{module}.{imported}")  # a submodule: `from longeval import cli`
            except ImportError:
                problems.append(f"{what}: no such name (renamed or removed?)")
    problems += [f"{use} is private" for use in private_uses(tree)]
    assert not problems, f"benchmarks/{name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_prints_its_help(name: str) -> None:
    proc = _script(name, "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage:") and "Traceback" not in proc.stderr, proc.stdout[:500] + proc.stderr[-2000:]


def errors_in(figures: Any, where: str = "") -> list[str]:
    """Every figure that came back as an error: a non-empty `error` or `errors` anywhere in the figures."""
    found = []
    if isinstance(figures, dict):
        for key, value in figures.items():
            if key in ("error", "errors") and value:
                found.append(f"{where}.{key}: {value}")
            else:
                found += errors_in(value, f"{where}.{key}")
    elif isinstance(figures, list):
        for i, value in enumerate(figures):
            found += errors_in(value, f"{where}[{i}]")
    return found


def test_errors_in_finds_a_figure_that_came_back_as_an_error() -> None:
    """The smoke tests below rely on it: generation.py's start-up figure read `{"error": ...}` for weeks."""
    assert errors_in({"startup": {"error": "ImportError: cannot import name '_haystack_stream'"}}) == [
        ".startup.error: ImportError: cannot import name '_haystack_stream'"]
    assert errors_in({"cells": [{"errors": ["LengthError: too short"]}]}) == [
        ".cells[0].errors: ['LengthError: too short']"]
    assert errors_in({"startup": {"runs": [{"error": None}]}, "cells": [{"errors": []}]}) == []


def test_generation_runs_a_tiny_sweep_and_every_figure_is_a_number(tiny_model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "generation.json"
    proc = _script("generation.py", "--lengths", "1024", "--tasks", "niah_single_1", "--n", "1", "--startup-runs", "1",
                   "--startup-task", "niah_single_1", "--startup-length", "1024", "--model", str(tiny_model_path),
                   "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert not errors_in(figures), errors_in(figures)
    assert figures["startup"]["median"]["total"] > 0 and figures["cells"][0]["mean_s"] > 0
    assert "ERROR" not in proc.stdout, proc.stdout[-2000:]


def test_instance_cache_runs_a_tiny_plan_cold_then_warm() -> None:
    proc = _script("instance_cache.py", "--lengths", "1024", "--tasks", "vt", "--samples", "1", "--model",
                   "tiny_random")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "cold: " in proc.stdout and "for 1 shards (0 from the cache)" in proc.stdout, proc.stdout
    assert "for 1 shards (1 from the cache)" in proc.stdout, proc.stdout  # the warm run read it back


def test_adaptive_replays_the_synthetic_profiles() -> None:
    proc = _script("adaptive.py", "--replays", "2", "--samples", "20")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if " synthetic " in line]
    assert len(rows) >= 4 and all("nan" not in row for row in rows), proc.stdout


def test_test_time_charges_each_test_to_what_it_starts(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text("""<testsuites><testsuite name="pytest">
<testcase classname="tests.run.test_pipeline" name="test_a" time="40.0">
  <properties><property name="started" value="ray,engine"/></properties></testcase>
<testcase classname="tests.stages.infer.test_infer" name="test_b" time="90.0">
  <properties><property name="started" value="ray,cluster,engine"/></properties></testcase>
<testcase classname="tests.test_heap" name="test_c" time="0.5">
  <properties><property name="started" value=""/></properties></testcase>
<testcase classname="tests.store.test_s3" name="test_d" time="3.0">
  <properties><property name="started" value="s3"/></properties><failure message="x"/></testcase>
</testsuite></testsuites>""")
    proc = _script("test_time.py", str(report), "--before", str(report), "--top", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "worker-seconds" in out and "134" in out  # 40 + 90 + 0.5 + 3
    kinds = out.split("## by kind")[1].split("##")[0]
    assert "cluster" in kinds and "90 s" in kinds and "engine" in kinds and "40 s" in kinds, kinds
    real = out.split("## real parts")[1].split("##")[0]
    assert [line.split()[-1] for line in real.splitlines() if line.startswith("engine")] == ["2"], real
    assert [line.split()[-1] for line in real.splitlines() if line.startswith("s3")] == ["0"], real  # it failed
    assert "tests.stages.infer.test_infer::test_b" in out.split("## tests")[1]


WORK = "n = 0\nfor i in range(6_000_000):\n    n += i\n"  # a fixed amount of CPU, whatever the load


def _cgroups_writable() -> bool:
    return os.geteuid() == 0 and Path("/sys/fs/cgroup").is_dir()


@pytest.mark.skipif(not _cgroups_writable(), reason="cpu_seconds.py makes a cgroup: needs root")
def test_cpu_seconds_counts_what_the_command_starts_and_leaves_behind(tmp_path: Path) -> None:
    """The work of a detached grandchild that outlives the command counts too (as Ray's agents do)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", WORK], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    once = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    detached = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {WORK!r}], start_new_session=True)"
    both = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {detached!r}]); exec({WORK!r})"
    proc = _script("cpu_seconds.py", "--", sys.executable, "-c", both)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("cpu_seconds")]
    seconds = float(line.split()[1])
    assert 1.6 * once <= seconds <= 3 * once + 2, (once, line)  # two WORKs and three interpreters' start-up
    groups = [p for top in ("/sys/fs/cgroup", "/sys/fs/cgroup/cpuacct") for p in Path(top).glob("longeval-cpu-*")]
    assert not groups  # the group is removed


def test_process_cpu_sums_accounting_records_by_process_name(tmp_path: Path) -> None:
    """Read from a file of `acct_v3` records (the live mode turns the machine's accounting on and off, which a
    test must not do beside another measurement): times are `comp_t`, a base-8 exponent over a 13-bit mantissa."""
    from benchmarks.process_cpu import RECORD, comp_t

    def record(name: bytes, user: int, system: int, version: int = 3) -> bytes:
        return RECORD.pack(0, version, 0, 0, 0, 0, 1, 1, 0, 0.0, user, system, 0, 0, 0, 0, 0, 0, name)

    big = (1 << 13) | 0x1000  # 4096 x 8 ticks
    assert comp_t(big) == 32768 and comp_t(250) == 250
    path = tmp_path / "pacct"
    path.write_bytes(record(b"ray::Replica", 250, 50) + record(b"ray::Replica", 100, 0) + record(b"raylet", big, 0)
                     + record(b"old", 999, 0, version=2))
    proc = _script("process_cpu.py", "--read", str(path))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[3:]]
    assert rows == [["327.7", "1", "raylet"], ["4.0", "2", "ray::Replica"]]
    assert proc.stdout.startswith("332 CPU-s in 3 processes that ended")


def test_the_sampler_names_the_real_parts_by_their_processes() -> None:
    from tests.watch_processes import kind_of

    assert kind_of("weed", ["weed", "server", "-s3"]) == "s3"
    assert kind_of("raylet", ["/x/raylet", "--raylet_socket_name=/tmp/r"]) == "ray"
    assert kind_of("gcs_server", ["/x/gcs_server"]) == "ray"
    assert kind_of("ray::Replica", ["ray::Replica"]) == "engine"
    assert kind_of("python", ["python", "-m", "vllm.entrypoints.openai.api_server"]) == "engine"
    assert kind_of("slurmstepd", ["slurmstepd: [1.batch]"]) == "slurm"
    assert kind_of("chromium", ["/usr/lib/chromium/chromium", "--headless"]) == "browser"
    assert kind_of("ray::MapWorker(", ["ray::MapWorker(MapBatches(ShardGenerator))"]) == "ray"
    assert kind_of("ray::IDLE", ["ray::IDLE"]) is None  # a worker waiting: no one uses Ray through it yet
    assert kind_of("python", ["python", "-m", "pytest"]) is None and kind_of("sleep", ["sleep", "1"]) is None


def test_two_rays_of_one_test_are_not_a_cluster_and_two_nodes_of_one_are() -> None:
    from tests.watch_processes import multi_node

    one, other = "raylet /x/raylet --gcs-address=127.0.0.1:41675 --x", "raylet /x/raylet --gcs-address=127.0.0.1:5"
    assert not multi_node([one, other]) and multi_node([one, other, one]) and not multi_node([one])
    assert multi_node([one, "raylet /x/raylet --gcs-address=10.0.0.2:41675"])  # the head by another address
