"""The layering of issue #13, as imports that must not exist (module-level and function-local alike).

A family's knowledge stays in its package, stages stay out of what reads results, and the pure parts (tasks,
scorers, text) never reach for I/O or engines. A new import that breaks a rule fails here with the line to fix.
Imports of longeval modules sit at the top of the module (style rule 15): a function-local one that would hide a
cycle means code belongs elsewhere, so only the few modules in LOCAL_IMPORTS, each for its stated reason, have any.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "longeval"

RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("longeval.tasks", ("longeval.engines", "longeval.run.pipeline", "longeval.stages", "longeval.store.run_root",
                        "longeval.cluster.ray_runtime"), "tasks are pure: data comes through longeval.store.location"),
    ("longeval.scoring", ("longeval.tasks",), "a judge is bound to its task; scorers know no task"),
    ("longeval.engines", ("longeval.tasks", "longeval.store.run_root", "longeval.run.pipeline", "longeval.stages"),
     "engines return rows; the infer stage writes them"),
    ("longeval.config.schema", ("longeval.engines",), "config is schema only"),
    ("longeval.tracking.wandb_run", ("longeval.run.pipeline", "longeval.stages"), "tracking reads results, never runs a
    stage"), ("longeval.report", ("longeval.run.pipeline", "longeval.stages"), "the report reads results, never runs a
    stage"), ("longeval.tracking.dashboards", ("longeval.run.pipeline", "longeval.stages"), "dashboards read results"),
    ("longeval.text", ("longeval.tasks",), "text is below tasks"),
    ("longeval.store.location", ("longeval.store.run_root", "longeval.tasks", "longeval.stages",
    "longeval.run.pipeline"),
     "the file layer is below the run store and the tasks"),
]

LOCAL_IMPORTS: dict[str, str] = {
    "longeval.cli": "each command imports what it runs in its handler, so `longeval --help` loads no pyarrow, "
                    "OmegaConf or task registry",
    "longeval.cluster.launch": "ray_cluster.sh runs it on login nodes before anything is set up: the standard library
    and "
                       "yaml only at module level",
}
"""The modules allowed function-local longeval imports, and why; never to break an import cycle."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every longeval module `path` imports, with its line: `from longeval import x` counts as longeval.x."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if (PACKAGE.parent / f"{base}.{alias.name}".replace(".", "/")).exists()
                      or (PACKAGE.parent / (f"{base}.{alias.name}".replace(".", "/") + ".py")).exists()]
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


@pytest.mark.parametrize(("layer", "forbidden", "why"), RULES, ids=[r[0] for r in RULES])
def test_layer_does_not_import(layer, forbidden, why):
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if not _within(module_name(path), layer):
            continue
        for line, name in imports(path):
            if any(_within(name, f) for f in forbidden):
                broken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert not broken, f"{layer} must not import {', '.join(forbidden)} ({why}):\n" + "\n".join(broken)


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    assert ("longeval.store.run_root" in {n for _, n in imports(PACKAGE / "pipeline.py")}
            or "longeval.store.run_root" in {n for p in PACKAGE.rglob("stages/*.py") for _, n in imports(p)})


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
