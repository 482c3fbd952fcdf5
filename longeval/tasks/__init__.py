"""The task registry: names from the papers, mapped to one parametrised generator each."""

from __future__ import annotations

from longeval.errors import UnknownTaskError
from longeval.tasks.base import TaskSpec
from longeval.tasks.ruler import RULER_TASKS

TASKS: dict[str, TaskSpec] = {spec.key: spec for spec in RULER_TASKS}


def get_task(name: str) -> TaskSpec:
    """Look a task up by `family/name`, or by its bare name when that is unambiguous."""
    if name in TASKS:
        return TASKS[name]
    matches = [spec for spec in TASKS.values() if spec.name == name]
    if len(matches) == 1:
        return matches[0]
    raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
