"""The registry: benchmark families (`longeval.tasks.family.Family`), their tasks by the papers' names.

A family is one package plus one entry in FAMILIES; a plugin module (`plugins=`) adds its own with `register`.

A suite can change a task's parameters without new code: `suite.params` maps a family (`sync`), a bare
task name (`shortest_path`) or, in YAML, a full key (`sync/shortest_path`) to field values of the task's
params dataclass, applied in that order, plus `max_new_tokens` for the output budget.

`__all__` is the package's public surface: the registry, and the records a family is made of (`base`: a task's
spec, its generator's context and draft; `family`: the family with its tables, panels and report sections).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from longeval.errors import ConfigError, UnknownTaskError
from longeval.scoring.judgement import Judge
from longeval.tasks import longbench_v2, michelangelo, ruler, sync, tail
from longeval.tasks.base import Draft, GenContext, TaskSpec, draft
from longeval.tasks.family import (
    RULER_THRESHOLD,
    Family,
    Panel,
    ReportSection,
    Sampling,
    SummaryTable,
    Threshold,
    borrowed_threshold,
)

__all__ = [
    "BUDGET_KEY",
    "FAMILIES",
    "RULER_THRESHOLD",
    "TASKS",
    "Draft",
    "Family",
    "GenContext",
    "Panel",
    "ReportSection",
    "Sampling",
    "SummaryTable",
    "TaskSpec",
    "Threshold",
    "borrowed_threshold",
    "check_overrides",
    "configure",
    "draft",
    "effective_thresholds",
    "get_task",
    "judge_for",
    "register",
    "sampling",
    "selected_overrides",
    "skill_group",
]

FAMILIES: dict[str, Family] = {}
"""Every family by name, in the order reports show them."""
TASKS: dict[str, TaskSpec] = {}
"""Every task by `family/name`."""


def effective_thresholds(override: float | None = None) -> dict[str, float]:
    """Each family's effective-length threshold (points) for a run: its own (`Family.threshold`), or the suite's
    `effective_threshold` for all of them when the suite sets one."""
    return {name: family.effective_threshold.value if override is None else override
            for name, family in FAMILIES.items()}


def register(family: Family) -> Family:
    """Add a family and its tasks (a plugin calls this on import).

    A family's name must be new and its intro (the report's paragraph) non-empty; every task must belong to it,
    carry a judge, and have a bare name no other task has, since `suite.tasks` and `suite.params` select tasks
    by bare name (`shortest_path`) as well as by key (`sync/shortest_path`).

    Raises:
        ConfigError: naming the requirement broken and what to change.
    """
    if family.name in FAMILIES:
        raise ConfigError(f"a family called {family.name!r} is registered already")
    names = {spec.name: spec.key for spec in TASKS.values()}
    for spec in family.tasks:
        if spec.family != family.name:
            raise ConfigError(f"task {spec.key} is declared in family {family.name!r}")
        if not callable(spec.judge):
            raise ConfigError(f"task {spec.key} has no judge: give its TaskSpec judge=<scorer>")
        if spec.key in TASKS:
            raise ConfigError(f"a task {spec.key} is registered already")
        if spec.name in names:
            raise ConfigError(f"task {spec.key}: the bare name {spec.name!r} is taken by {names[spec.name]}; bare "
                              "names select tasks in suite.tasks and suite.params, so give it a name of its own")
        names[spec.name] = spec.key
    if not family.intro.strip():
        raise ConfigError(f"family {family.name!r} has no intro: give Family(intro=...) the paragraph the HTML "
                          "report puts above its section (how to read its numbers)")
    FAMILIES[family.name] = family
    TASKS.update({spec.key: spec for spec in family.tasks})
    return family


for _family in (ruler.FAMILY, sync.FAMILY, michelangelo.FAMILY, longbench_v2.FAMILY, tail.FAMILY):
    register(_family)


def judge_for(family: str, task: str) -> Judge:
    """The judge of a scored instance's task (the score stage hands this to `scoring.deadline`)."""
    return _lookup(f"{family}/{task}").judge


def skill_group(key: str) -> str:
    """The skill group its family declares for a task key (`ruler/vt` -> multi-hop tracking)."""
    family, _, name = key.partition("/")
    return FAMILIES[family].skill_group(name) if family in FAMILIES else family


def sampling() -> Sampling | None:
    """The one registered way of spreading instances over lengths by `suite.subsets`, if any family has one."""
    return next((f.sampling for f in FAMILIES.values() if f.sampling is not None), None)

BUDGET_KEY = "max_new_tokens"


def get_task(name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> TaskSpec:
    """Look a task up by `family/name`, or by its bare name when that is unambiguous, with `suite.params`."""
    spec = _lookup(name)
    return configure(spec, overrides) if overrides else spec


def _lookup(name: str) -> TaskSpec:
    if name in TASKS:
        return TASKS[name]
    matches = [spec for spec in TASKS.values() if spec.name == name]
    if len(matches) == 1:
        return matches[0]
    raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")


def configure(spec: TaskSpec, overrides: Mapping[str, Mapping[str, Any]]) -> TaskSpec:
    """The task with the suite's parameter overrides for its family, bare name and full key applied."""
    fields = {f.name: f for f in dataclasses.fields(spec.params)}
    # A family-wide value reaches the tasks that have the field (`sync.cot` is every SYNC task's, but
    # `ruler.num_needle_v` only the NIAH tasks'); a task's own values must all exist.
    values = {k: v for k, v in (overrides.get(spec.family) or {}).items() if k in fields or k == BUDGET_KEY}
    for scope in (spec.name, spec.key):
        values.update(overrides.get(scope) or {})
    if not values:
        return spec
    budget = values.pop(BUDGET_KEY, None)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"suite.params: {spec.key} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join([*fields, BUDGET_KEY])}"
        )
    for key, value in values.items():
        default = getattr(spec.params, key)
        if isinstance(default, tuple) and isinstance(value, list | tuple):
            values[key] = tuple(value)
        _check_type(spec, key, value, default)
    try:
        params = dataclasses.replace(spec.params, **values)  # a params dataclass checks its limits on creation
    except ConfigError as exc:
        raise ConfigError(f"suite.params: {spec.key} parameter {exc}") from exc
    if budget is None:
        budget = spec.budget(params) if spec.budget else spec.max_new_tokens
    return dataclasses.replace(spec, params=params, max_new_tokens=int(budget))


def _check_type(spec: TaskSpec, key: str, value: Any, default: Any) -> None:
    """A parameter override of another type than the parameter's default names the type expected."""
    if default is None or value is None:
        return
    expected: type | tuple[type, ...] = type(default)
    if isinstance(default, float):
        expected = (int, float)
    elif isinstance(default, tuple):
        expected = (list, tuple)
    ok = isinstance(value, expected) and not (isinstance(value, bool) and not isinstance(default, bool))
    if not ok:
        raise ConfigError(
            f"suite.params: {spec.key} parameter {key}={value!r} is a {type(value).__name__}; expected "
            f"{type(default).__name__}, like its default {default!r}: e.g. +suite.params.{spec.name}.{key}={default!r}"
        )


def selected_overrides(overrides: Mapping[str, Mapping[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """`suite.params` without the scopes of registered tasks and families the suite does not run.

    For a preset's scopes (the caller passes only those): a preset sets parameters for all its tasks
    (michelangelo_quick: `params.mrcr`); `suite.tasks=[idk]` narrows the suite, and those parameters then change
    no instance. Dropping them is sound for that reason, and keeps the run root's suite hash equal for equal
    instances. A scope that names nothing registered is kept, so `check_overrides` still refuses a typo.
    """
    specs = [_lookup(name) for name in tasks]
    wanted = {s for spec in specs for s in (spec.family, spec.name, spec.key)}
    registered = {s for spec in TASKS.values() for s in (spec.family, spec.name, spec.key)}
    return {scope: values for scope, values in overrides.items() if scope in wanted or scope not in registered}


def check_overrides(overrides: Mapping[str, Mapping[str, Any]], tasks: list[str]) -> None:
    """Every scope in `suite.params` names a family, task or key of the suite, and every field exists."""
    specs = [_lookup(name) for name in tasks]
    scopes = {s for spec in specs for s in (spec.family, spec.name, spec.key)}
    for scope in overrides:
        if scope not in scopes:
            raise ConfigError(
                f"suite.params.{scope} names no family or task of this suite; use one of: {', '.join(sorted(scopes))}"
            )
    for spec in specs:
        configure(spec, overrides)
    groups: dict[str, set] = {}
    for spec in specs:
        if spec.context_group:
            done = configure(spec, overrides)
            groups.setdefault(spec.context_group, set()).add((done.params, done.max_new_tokens))
    for group, settings in groups.items():
        if len(settings) > 1:
            raise ConfigError(
                f"the tasks of context group {group} share one context, so they need the same parameters; "
                f"set them for the family (e.g. suite.params.{group.split('/')[0]}.cot=false), not per task"
            )
    for family in {spec.family for spec in specs} & set(overrides):
        known = {f.name for spec in specs if spec.family == family for f in dataclasses.fields(spec.params)}
        unknown = sorted(set(overrides[family]) - known - {BUDGET_KEY})
        if unknown:
            raise ConfigError(
                f"suite.params.{family}: no {family} task of this suite has {', '.join(map(repr, unknown))}; "
                f"their parameters: {', '.join(sorted(known | {BUDGET_KEY}))}"
            )
