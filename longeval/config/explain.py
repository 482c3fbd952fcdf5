"""Hydra's and OmegaConf's errors in the user's words: the file and line of a YAML syntax error, the quoting an
override needs, and for a value of the wrong type or a key the schema lacks, the full dotted key, the type
expected, the value given and a value that would do.

Loading (`longeval.config.load`: config files and overrides) and `validation.conform` (a stored config.yaml, a
config built in code) both explain their errors here, which is why this is a module of its own.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ConfigTypeError, OmegaConfBaseException, ValidationError

from longeval.config.schema import Config

__all__ = ["EXAMPLES", "explain_override", "explain_parse", "explain_type", "explain_yaml", "non_optional"]


def explain_yaml(exc: yaml.YAMLError) -> str:
    """A YAML syntax error as the file, the line and column (1-based, as editors count) and the parser's problem."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"a config file is not valid YAML: {problem}; fix its syntax"
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    since = f" ({context} that starts at line {start.line + 1}, column {start.column + 1})" if context and start else ""
    return f"{where}: {problem}{since}; fix the YAML syntax there"


def explain_parse(override: str, overrides: list[str]) -> str:
    """An override Hydra cannot parse, with the quoting rule: words split by the shell, or characters outside
    Hydra's unquoted values (spaces, non-ASCII letters), need quotes for Hydra inside quotes for the shell."""
    index = overrides.index(override) if override in overrides else -1
    if "=" not in override:
        # `run_name=my run` reaches us as two arguments: find the override this word was split from.
        start, stop = index, index + 1
        while start > 0 and "=" not in overrides[start]:
            start -= 1
        while stop < len(overrides) and "=" not in overrides[stop]:
            stop += 1
        if start >= 0 and "=" in overrides[start]:
            words = overrides[start:stop]
            key, _, value = words[0].partition("=")
            whole = " ".join([value, *words[1:]])
            return (f"{override!r} is not an override (KEY=VALUE); if it belongs to {words[0]!r}, quote the whole "
                    f"value for Hydra and the override for the shell: {_quoted(key, whole)}{_run_name_rule(key)}")
        return f"{override!r} is not an override: write KEY=VALUE, e.g. suite=ruler or suite.samples=10"
    key, _, value = override.partition("=")
    if value.isascii() and not any(c.isspace() for c in value):  # not a quoting matter: brackets or quotes
        return (f"cannot parse the override {override!r}: check its brackets and quotes (a list is [a,b], a mapping "
                f"{{k:v}}); to pass the text as it is, quote it for Hydra and the shell: {_quoted(key, value)}")
    return (f"cannot parse the override {override!r}: an unquoted value is ASCII letters, digits and _-./:+@ "
            f"without spaces; quote the value for Hydra and the override for the shell: {_quoted(key, value)}"
            f"{_run_name_rule(key)}")


def _quoted(key: str, value: str) -> str:
    """`key="value"` in double quotes for Hydra, the whole in single quotes for a POSIX shell."""
    inner = value.replace("\\", "\\\\").replace('"', '\\"')
    return "'" + f'{key}="{inner}"'.replace("'", "'\\''") + "'"


def _run_name_rule(key: str) -> str:
    """A run name must also be one folder name, which quoting does not change."""
    if key.lstrip("+~") != "run_name":
        return ""
    return " (a run name itself takes only ASCII letters, digits and . _ = + -, e.g. run_name=my-run)"


_CONVERT = re.compile(r"Value '(.*)' (?:of type '\w+' could not be converted to (\w+)|is not a valid (\w+))")
_NOT_A_CHOICE = re.compile(r"Invalid value '(.*)', expected one of \[(.*)\]")
_IN_FILE = re.compile(r"^In '([^']+)': ")
EXAMPLES = {"suite.lengths": "[4096,8192]", "suite.tasks": "[niah_single_1,vt]", "cluster.bucket_edges": "[16384]",
            "suite.params": "{vt:{num_hops:2}}"}
"""Examples for keys whose schema default shows nothing (MISSING or empty)."""


def _schema_type(key: str) -> Any:
    """The schema's type of a dotted key (`suite.lengths`, `suite.lengths[1]`), or None off the schema."""
    node: Any = Config
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        if part.startswith("["):
            args = typing.get_args(node)
            node = args[0] if typing.get_origin(node) is list and args else None
        elif dataclasses.is_dataclass(node):
            node = typing.get_type_hints(node).get(part)
        elif typing.get_origin(node) is dict:
            node = typing.get_args(node)[1]
        else:
            return None
        if node is None:
            return None
        node = non_optional(node)
    return node


def non_optional(tp: Any) -> Any:
    """`X | None` as X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


def _describe(tp: Any, *, plural: bool = False) -> str:
    """A schema type in words: `a list of integers`, `true or false`, `one of vllm, openai, stand_in`."""
    origin = typing.get_origin(tp)
    if origin is list:
        args = typing.get_args(tp)
        return "a list of " + (_describe(args[0], plural=True) if args else "values")
    if origin is dict or tp is dict:
        return "mappings" if plural else "a mapping (key: value)"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(m.value for m in tp)
    if dataclasses.is_dataclass(tp):
        return f"a group of settings ({', '.join(f.name for f in dataclasses.fields(tp))})"
    names = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
             str: ("a string", "strings")}
    return names.get(tp, ("a value", "values"))[plural]


def _example(key: str, tp: Any, given: str | None) -> str:
    """A value of the right type for `key`: the given value in brackets when that is all it lacks (`[4096]`),
    a known example, the schema's default, or one by type."""
    base = re.sub(r"\[\d+\]$", "", key)
    if typing.get_origin(tp) is list and given and not given.startswith("[") and "," not in given:
        element = typing.get_args(tp)[0] if typing.get_args(tp) else str
        if element is not int or given.lstrip("-").isdigit():
            return f"[{given}]"
    if base in EXAMPLES and base == key:
        return EXAMPLES[base]
    schema = OmegaConf.structured(Config)
    if not OmegaConf.is_missing(schema, key):
        default = OmegaConf.select(schema, key)
        if default not in (None, [], {}) and not isinstance(default, DictConfig):
            if isinstance(default, bool):
                return str(default).lower()
            return "[" + ",".join(map(str, default)) + "]" if OmegaConf.is_list(default) else str(default)
    by_type = {int: "1", float: "1.0", bool: "true", str: "text", dict: "{key:value}"}
    if typing.get_origin(tp) is dict:
        return "{key:value}"
    if typing.get_origin(tp) is list:
        element = typing.get_args(tp)[0] if typing.get_args(tp) else str
        return f"[{by_type.get(element, 'a')}]"
    return by_type.get(tp, "...")


def _given(key: str, overrides: list[str], message: str, source: str | None, file: Path | None) -> str | None:
    """The value the user gave for `key`: the last override of it, the value in OmegaConf's message, or the
    value in the config file the error came from (`source`, e.g. suite/mine, at `file`)."""
    base = re.sub(r"\[\d+\]$", "", key)
    match = _CONVERT.search(message)
    if match and base != key:  # one element of a list: the element, not the whole list given
        return match.group(1)
    for item in reversed(overrides):
        name, eq, value = item.partition("=")
        if eq and name.lstrip("+~") in (key, base):
            return value
    match = _CONVERT.search(message)
    if match:
        return match.group(1)
    if source is not None and file is not None:
        group, _, _ = source.partition("/")
        try:
            loaded = OmegaConf.load(file)
            inner = key[len(group) + 1:] if key.startswith(group + ".") else key
            value = OmegaConf.select(loaded, inner, throw_on_missing=False)
        except Exception:  # the value only decorates the message; the message stands without it
            return None
        if value is not None:
            return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
    return None


def explain_type(exc: BaseException, overrides: list[str] | None = None, conf: Path | None = None) -> str | None:
    """A value of the wrong type, or a key the schema lacks, from an override or a config file: the full dotted
    key, the type expected, the value given and a value that would do. `conf`: the config tree Hydra composed,
    where a file its error names lies (None for a config that comes from no file)."""
    source_match = _IN_FILE.match(str(exc))
    source = source_match.group(1) if source_match and conf is not None else None
    file = conf / f"{source}.yaml" if source and conf is not None else None
    where = f"{file}: " if file else ""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__  # Hydra re-raises a config file's error as the context
    if cause is None:
        return None
    key = getattr(cause, "full_key", None) or ""
    if not key:
        return None
    first = str(cause).splitlines()[0]
    if isinstance(cause, ConfigKeyError) and "not in" in first:
        parent, _, name = key.rpartition(".")
        tp = _schema_type(parent) if parent else Config
        known = ", ".join(sorted(f.name for f in dataclasses.fields(tp))) if dataclasses.is_dataclass(tp) else ""
        return (f"{where}unknown config key {key!r}" + (f"; keys under {parent or 'the top level'}: {known}"
                                                         if known else ""))
    choice = _NOT_A_CHOICE.search(str(cause))
    if choice:
        return f"{where}{key}={choice.group(1)!r}; choices: {choice.group(2)}"
    if isinstance(cause, ConfigTypeError) and "does not support deletion" in first and _schema_type(key):
        return (f"~{key} removes a setting the schema requires; give it a value instead, e.g. "
                f"{key}={_example(key, _schema_type(key), None)}")
    if not isinstance(cause, ValidationError):
        return None
    tp = _schema_type(key)
    if tp is None:
        return None
    given = _given(key, overrides or [], str(cause), source, file)
    got = f", got {given!r}" if given is not None else ""
    base = re.sub(r"\[\d+\]$", "", key)  # the fix of one element of a list is the whole list
    if dataclasses.is_dataclass(tp):
        fix = f"set its keys one by one, e.g. {key}.{dataclasses.fields(tp)[0].name}=..."
    elif source:  # the fix goes in the file, as YAML
        fix = f"write {base.split('.')[-1]}: {_example(base, _schema_type(base), None if base != key else given)}"
    else:
        fix = f"write {base}={_example(base, _schema_type(base), None if base != key else given)}"
    return f"{where}{key} must be {_describe(tp)}{got}; {fix}"


def explain_override(message: str) -> str:
    """Turn Hydra's 'Could not override' into the unknown key and the keys that exist there."""
    first = message.splitlines()[0]
    if first.startswith("Could not override"):
        key = first.split("'")[1]
        parent, _, _ = key.rpartition(".")
        node: Any = OmegaConf.structured(Config)
        for part in parent.split(".") if parent else []:
            node = node.get(part) if isinstance(node, DictConfig) else None
        known = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else ""
        if key.startswith("suite.params."):  # a free-form map: the suite lists some parameters, not all
            return (f"{key!r} is not set by this suite; add it with a leading '+': +{key}=... "
                    "(parameter names are in the task family's docs)")
        return f"unknown config key {key!r}" + (f"; keys under {parent or 'the top level'}: {known}" if known else "")
    if first.startswith("Could not append to config. An item is already at"):
        key = first.split("'")[1]
        return f"{key!r} is already set by the suite; override it without the leading '+': {key}=..."
    return f"bad override: {first}"
