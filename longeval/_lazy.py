"""Lazy re-exports for package faces: `from longeval.store import RunRoot` without importing every module of
the package (or pyarrow, Ray, vLLM) at `import longeval.store`, and without import cycles between packages.

vLLM's `vllm/__init__.py` does the same with its `MODULE_ATTRS` table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a package that re-exports `name` from its module `exports[name]`."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
