"""The layering of the packages (issue #47): which subsystem may import which, module-level and function-local alike.

Read bottom-up: the pure parts (text, scoring, stats) import no other subsystem; tasks read files only through
`store.location`; engines return rows and never write them; store knows no stage, task or engine; stages run on
all of those; `run` drives the stages; what reads results (report, tracking) never runs a stage. A new import that
breaks a rule fails here with the line to fix. Imports of longeval modules sit at the top of the module (style
rule 15): a function-local one that would hide a cycle means code belongs elsewhere, so only the few modules in
LOCAL_IMPORTS, each for its stated reason, have any.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "longeval"

SUBSYSTEMS = ("builders", "cli", "cluster", "config", "engines", "planning", "report", "run", "scoring", "stages",
              "stats", "store", "tasks", "text", "tracking")
"""Every package of longeval, and the command line; `errors`, `records` and `heap` at the top are for everyone."""

RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("longeval.text", tuple(s for s in SUBSYSTEMS if s != "text"), "text is the bottom: tokens, pieces and corpora"),
    ("longeval.scoring", tuple(s for s in SUBSYSTEMS if s != "scoring"),
     "scorers are pure functions of an answer and its references; a judge is bound to its task by the task"),
    ("longeval.stats", tuple(s for s in SUBSYSTEMS if s != "stats"), "statistics are pure functions of score tables"),
    ("longeval.tasks", ("builders", "cli", "cluster", "config", "engines", "planning", "report", "run", "stages",
                        "tracking", "store.run_root", "store.commits", "store.listings", "store.stage_reads",
                        "store.row_group_reads", "store.shard_format", "store.lease", "store.compact", "store.shards",
                        "store.local", "store.s3"),
     "tasks are pure: data comes through longeval.store.location; a family's table declares a layout that report "
     "renders"),
    ("longeval.engines", ("builders", "cli", "planning", "report", "run", "stages", "store", "tasks", "tracking"),
     "engines return rows; the infer stage writes them"),
    ("longeval.store", ("builders", "cli", "engines", "planning", "report", "run", "stages", "tasks", "tracking"),
     "a run root holds shards of any stage and knows none"),
    ("longeval.config", ("builders", "cli", "cluster", "engines", "planning", "report", "run", "stages", "store",
                         "tracking"), "config is the schema and its checks: it runs nothing"),
    ("longeval.cluster", ("builders", "cli", "engines", "planning", "report", "run", "stages", "tasks", "tracking"),
     "Ray's processes know no stage"),
    ("longeval.planning", ("builders", "cli", "cluster", "report", "run", "tracking"), "a plan runs nothing"),
    ("longeval.stages", ("builders", "cli", "report", "run.pipeline", "run.adaptive_rounds", "tracking"),
     "a stage is run by the pipeline, never the other way round"),
    ("longeval.report", ("builders", "cli", "cluster", "engines", "run.pipeline", "run.adaptive_rounds", "stages",
                         "tracking"), "the report reads results, never runs a stage"),
    ("longeval.tracking", ("builders", "cli", "cluster", "engines", "report", "run.pipeline", "run.adaptive_rounds",
                           "stages"), "tracking reads results, never runs a stage"),
    ("longeval.builders", ("cli", "report", "run", "tracking"), "builders call engines; runs do not call builders"),
    ("longeval.run", ("builders", "cli", "report"), "a run writes results; reading them is report's"),
]
"""(package, what it must not import (subsystems, or modules under them), why)."""

LOCAL_IMPORTS: dict[str, str] = {
    "longeval.cli": "each command imports what it runs in its handler, so `longeval --help` loads no pyarrow, "
                    "OmegaConf or task registry",
    "longeval.cluster.launch": "ray_cluster.sh runs it on login nodes before anything is set up: the standard "
                               "library and yaml only at module level",
}
"""The modules allowed function-local longeval imports, and why; never to break an import cycle."""


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """Every longeval module `path` imports, with its line: `from longeval import x` counts as longeval.x."""
    here = module_name(path, package)
    parent = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parent.split(".")[: len(parent.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if (package.parent / f"{base}.{alias.name}".replace(".", "/")).exists()
                      or (package.parent / (f"{base}.{alias.name}".replace(".", "/") + ".py")).exists()]
    return [(line, name) for line, name in found if name == "longeval" or name.startswith("longeval.")]


def function_local_lines(tree: ast.AST) -> set[int]:
    """The lines of the import statements inside a function (or method) body."""
    return {node.lineno for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}


def local_imports(path: Path) -> list[tuple[int, str]]:
    """The longeval modules `path` imports inside functions, with their lines."""
    lines = function_local_lines(ast.parse(path.read_text(), str(path)))
    return [(line, name) for line, name in imports(path) if line in lines]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")

def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(layer: str, forbidden: tuple[str, ...], package: Path = PACKAGE) -> list[str]:
    """`path:line imports name` for every import under `layer` of a module under `forbidden` (in `package`)."""
    names = tuple(f if f.startswith("longeval") else f"longeval.{f}" for f in forbidden)
    broken = []
    for path in sorted(package.rglob("*.py")):
        if not _within(module_name(path, package), layer):
            continue
        for line, name in imports(path, package):
            if any(_within(name, f) for f in names):
                broken.append(f"{path.relative_to(package.parent)}:{line} imports {name}")
    return broken


@pytest.mark.parametrize(("layer", "forbidden", "why"), RULES, ids=[r[0] for r in RULES])
def test_layer_does_not_import(layer, forbidden, why):
    broken = violations(layer, forbidden)
    assert not broken, f"{layer} must not import {', '.join(forbidden)} ({why}):\n" + "\n".join(broken)


def test_every_package_has_a_rule():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(SUBSYSTEMS), f"packages without a place in SUBSYSTEMS: {packages - set(SUBSYSTEMS)}"
    ruled = {layer.removeprefix("longeval.") for layer, _, _ in RULES}
    assert packages - {"cli"} <= ruled | {"scoring"}, f"packages without a rule: {packages - ruled}"


def test_a_planted_violation_fails(tmp_path):
    """The checker on a copy of two packages, one given an import its rule forbids: the rule catches it."""
    planted = tmp_path / "longeval"
    for sub in ("store", "stages"):
        (planted / sub).mkdir(parents=True)
        (planted / sub / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "stages" / "score.py").write_text("x = 1\n")
    (planted / "store" / "run_root.py").write_text("import os\n\n\ndef f():\n    from longeval.stages import score\n")
    rule = next(r for r in RULES if r[0] == "longeval.store")
    assert violations(rule[0], rule[1], planted) == ["longeval/store/run_root.py:5 imports longeval.stages",
                                                     "longeval/store/run_root.py:5 imports longeval.stages.score"]


def test_the_checker_sees_function_local_and_relative_imports():
    assert "longeval.store.run_root" in {n for _, n in imports(PACKAGE / "run" / "pipeline.py")}
    assert "longeval.report.table" in {n for _, n in imports(PACKAGE / "cli.py")}  # local to cmd_report


def test_longeval_imports_are_at_module_level():
    local = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = local_imports(path)
        if found and module_name(path) not in LOCAL_IMPORTS:
            local[path.relative_to(PACKAGE.parent)] = sorted({line for line, _ in found})
    assert not local, ("function-local longeval imports (move them to the top of the module; a cycle that follows "
                       "means code belongs in another module):\n"
                       + "\n".join(f"{path}: lines {', '.join(map(str, lines))}" for path, lines in local.items()))


def test_every_allowed_module_still_needs_its_local_imports():
    for name in LOCAL_IMPORTS:
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        assert local_imports(path), f"{name} has no function-local longeval imports: take it off LOCAL_IMPORTS"


def test_function_local_lines_finds_imports_in_functions_and_methods_only():
    tree = ast.parse("import a\n"
                     "def f():\n    import b\n    def g():\n        from c import d\n"
                     "class K:\n    import e\n    async def m(self):\n        import f\n")
    assert function_local_lines(tree) == {3, 5, 9}


PACKAGES = sorted(module_name(path) for path in PACKAGE.rglob("__init__.py"))
"""longeval and every package in it, nested ones too (`longeval.stages.infer`, `longeval.tasks.ruler`)."""


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_names_what_it_offers(package):
    """A package face (its `__init__`) has a docstring saying what it offers and an `__all__`, its public surface,
    which names only what exists (a moved name fails here) and no module of the package (`from package import
    name` would give the module or the name, depending on what was imported before)."""
    import importlib

    module = importlib.import_module(package)
    assert (module.__doc__ or "").strip(), f"{package}/__init__.py has no docstring saying what the package offers"
    offered = getattr(module, "__all__", None)
    assert offered, f"{package}/__init__.py has no __all__: list its public names (re-exports or `_EXPORTS`)"
    missing = [name for name in offered if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"
    folder = PACKAGE.parent / package.replace(".", "/")
    modules = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    assert not set(offered) & modules, f"{package}.__all__ names its own modules: {sorted(set(offered) & modules)}"


# -- the public surface: code outside the package uses only public names (issue #47) ---------------------------

OUTSIDE = ("tests", "benchmarks", "jobs", "dashboards")
"""The code beside the package that must use its public names (or a named testing seam), never its internals."""
OWN = ("longeval", *OUTSIDE)
"""Top-level names of this repository's modules: an underscored name imported from any of them is another
module's internal."""
REACHING = {"setattr", "getattr", "hasattr", "delattr"}
"""Calls that reach an attribute by its name as a string (`monkeypatch.setattr(module, "_name", ...)` too)."""


def _private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


def _own(module: str) -> bool:
    return module.split(".")[0] in OWN


def private_names(package: Path = PACKAGE) -> set[str]:
    """Every underscored name the package defines: functions, classes, variables, attributes (`self._x = ...`)."""
    return set().union(*(_defined(ast.parse(path.read_text(), str(path))) for path in package.rglob("*.py")))


def _defined(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return {name for name in found if _private(name)}


def _base(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def private_uses(path: Path, internals: set[str], root: Path = PACKAGE.parent) -> list[str]:
    """`path:line what` for every internal of another module that `path` reaches: `from longeval.x import _y` (or
    from a test helper), `import longeval.x._y`, `module._y` on a name imported from longeval, `obj._y` for an
    underscored name longeval defines (`root._kept`) and the file does not, and `monkeypatch.setattr(module,
    "_y", ...)` or `setattr("longeval.x._y", ...)`."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    own_here = _defined(tree)
    bound: set[str] = set()  # names this file binds to longeval's (and its helpers') modules and objects
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _own(alias.name):
                    bound.add(alias.asname or alias.name.split(".")[0])
                    found += [(node.lineno, alias.name)] if any(map(_private, alias.name.split("."))) else []
        elif isinstance(node, ast.ImportFrom) and (node.level or _own(node.module or "")):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name) or any(map(_private, (node.module or "").split("."))):
                    found.append((node.lineno, f"{module}.{alias.name}" if node.module else module + alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = _base(node.value)
            name = base.id if isinstance(base, ast.Name) else None
            if name in bound or (name not in ("self", "cls") and node.attr in internals - own_here):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and len(node.args) >= 1:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func not in REACHING:
                continue
            first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and _own(first.value) \
                    and any(map(_private, first.value.split("."))):
                found.append((node.lineno, first.value))
            elif isinstance(second, ast.Constant) and isinstance(second.value, str) and _private(second.value):
                base = _base(first)
                name = base.id if isinstance(base, ast.Name) else None
                if name in bound or (name not in ("self", "cls") and second.value in internals - own_here):
                    found.append((node.lineno, f"{ast.unparse(first)}.{second.value}"))
    return [f"{where}:{line} {what}" for line, what in sorted(set(found))]


def test_code_outside_the_package_uses_only_public_names():
    """Tests, benchmarks, jobs and dashboards use a module's public names or a named testing seam (`RunRoot.
    kept_reads`, `WorkQueue(moves=False)`), never an underscored internal of another module: an internal can then
    change without a test to rewrite, and what a test pins down is what callers rely on."""
    internals = private_names()
    root = PACKAGE.parent
    found = [use for folder in OUTSIDE if (root / folder).is_dir()
             for path in sorted((root / folder).rglob("*.py")) for use in private_uses(path, internals)]
    assert not found, ("underscored names of another module (make the name public, give the test a named testing "
                       "seam, or test through public behaviour):\n" + "\n".join(found))


def test_the_public_names_check_sees_each_way_in(tmp_path):
    """Planted: every way a file can reach another module's internal is reported; public names, dunders, its own
    classes' attributes and a third-party object's unknown internals are not."""
    (tmp_path / "tests").mkdir()
    planted = tmp_path / "tests" / "test_planted.py"
    planted.write_text(
        "import longeval.store._hidden as hidden\n"
        "from longeval.cli import _print_results, main\n"
        "from longeval.store import lease, run_root\n"
        "from tests.s3server import _free_ports\n"
        "from . import _helper\n"
        "\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "\n"
        "def test_it(monkeypatch, root, other):\n"
        "    lease._listed(root)\n"
        "    run_root.RunRoot._rel(root, 'x')\n"
        "    monkeypatch.setattr(lease, '_listed', None)\n"
        "    monkeypatch.setattr('longeval.store.lease._listed', None)\n"
        "    root._kept.clear()\n"
        "    Mine()._own, lease.__name__, other._not_longevals, self_free(root)\n"
        "    getattr(root, '_footers')\n")
    internals = {"_kept", "_footers", "_listed", "_rel"}
    assert private_uses(planted, internals, tmp_path) == [
        "tests/test_planted.py:1 longeval.store._hidden",
        "tests/test_planted.py:2 longeval.cli._print_results",
        "tests/test_planted.py:4 tests.s3server._free_ports",
        "tests/test_planted.py:5 ._helper",
        "tests/test_planted.py:12 lease._listed",
        "tests/test_planted.py:13 run_root.RunRoot._rel",
        "tests/test_planted.py:14 lease._listed",
        "tests/test_planted.py:15 longeval.store.lease._listed",
        "tests/test_planted.py:16 root._kept",
        "tests/test_planted.py:18 root._footers",
    ]


def test_the_architecture_doc_lists_every_module_and_package_with_its_job():
    """docs/architecture.md's module table names every module and package of longeval, each with a job."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.+?) \|$", text, re.M))
    wanted = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        wanted.add(f"{rel.parent.as_posix()}/" if path.name == "__init__.py" and rel.parent.parts else rel.as_posix())
    missing = sorted(w for w in wanted if not rows.get(w, "").strip())
    assert not missing, f"docs/architecture.md's module table lacks: {', '.join(missing)}"
    top = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 6, f"longeval/ holds {len(top)} modules at its top: {sorted(p.name for p in top)}"
