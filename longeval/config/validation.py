"""The run configuration checked and written out: `conform` to the schema alone (what a stored config.yaml must
pass), `validate` by the run's rules too (names, sizes, limits, the tasks and their parameters, the API), and
`to_yaml`, config.yaml with every secret hidden (`redactor`)."""

from __future__ import annotations

import dataclasses
import logging
import re
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from longeval.config.explain import explain_type, non_optional
from longeval.config.redaction import PUBLIC_ENV, Redactor, is_secret_name
from longeval.config.schema import (
    ADAPTIVE_ALPHA_SPLITS,
    ADAPTIVE_SHARD_SIZE,
    ADAPTIVE_TARGETS,
    GROUP_ALPHA_SPLIT,
    GROUP_GROWTH,
    GROUP_ROUND_MAX,
    GROUP_SHARD_SIZE,
    GROUP_STEP,
    SCHEDULE_BEFORE,
    SHARD_SIZE,
    ApiMode,
    ClusterConfig,
    Config,
    Engine,
    ModelConfig,
    SuiteConfig,
)
from longeval.errors import ConfigError
from longeval.scoring.deadline import import_plugins
from longeval.stats.adaptive import COLUMN_POWER
from longeval.tasks import check_overrides, get_task, sampling, selected_overrides
from longeval.text.render import prompt_format

__all__ = ["MAX_SHARDS", "RUN_NAME", "check_api", "conform", "redactor", "to_yaml", "validate"]

log = logging.getLogger("longeval.config.schema")  # where these checks lived: their lines read as before


def _refuse_unknown_keys(node: Any, schema: Any, prefix: str) -> None:
    """A key the schema lacks, which an override with '+' (`+suite.foo=1`) gets past Hydra and OmegaConf's merge:
    refused like a typo, since it would change nothing but the run root's name."""
    if not isinstance(node, DictConfig | dict) or not dataclasses.is_dataclass(schema):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = _hints(schema)
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key {full!r}; keys under {prefix.rstrip('.') or 'the top level'}: "
                              f"{known}")
        _refuse_unknown_keys(node[key], non_optional(hints.get(key)), f"{full}.")


def _hints(schema: Any) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def validate(raw: DictConfig | dict, *, preset_scopes: frozenset[str] = frozenset()) -> Config:
    """The config checked against the schema and its rules. `preset_scopes`: the `suite.params` scopes a config
    file set, not an override (those of tasks the suite does not run are dropped; the user's are checked)."""
    cfg = conform(raw)
    _resolve_defaults(cfg.suite)
    _check(cfg, preset_scopes)
    return cfg


def conform(raw: DictConfig | dict) -> Config:
    """The config checked against the schema alone (known keys, types, mandatory values), without the run rules
    of `validate`: what a stored config.yaml must pass to be whole, however old (`provenance.stored_config`)."""
    schema = OmegaConf.structured(Config)
    _refuse_unknown_keys(raw, Config, "")
    try:
        merged = OmegaConf.merge(schema, raw)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        first = str(exc).splitlines()[0]
        raise ConfigError(explain_type(exc) or f"config error at {key!r}: {first}") from exc


def _resolve_defaults(suite: SuiteConfig) -> None:
    """Fill the settings left unset with their defaults, which depend on the run: adaptive or not, and the target.

    Why per target: the round schedule and the alpha split by length (benchmarks/README.md, "Round schedule and
    alpha split") cut a group target's tokens (11.3 -> 10.1 % on the replay curves) with the same decisions; for
    `tasks` they were not measured, so it keeps constant rounds of 10 and the equal split. The resolved values
    are what config.yaml records, so a run root is resumed with the settings it was sampled with."""
    group = suite.adaptive and suite.adaptive_target in ("suite", "groups")
    if suite.shard_size is None:
        suite.shard_size = GROUP_SHARD_SIZE if group else ADAPTIVE_SHARD_SIZE if suite.adaptive else SHARD_SIZE
    if suite.shuffle is None:
        suite.shuffle = suite.adaptive
    if suite.adaptive_growth is None:
        suite.adaptive_growth = GROUP_GROWTH if group else SCHEDULE_BEFORE["adaptive_growth"]
    if suite.adaptive_round_max is None:
        suite.adaptive_round_max = (max(1, GROUP_ROUND_MAX // max(1, suite.shard_size)) if group
                                    else SCHEDULE_BEFORE["adaptive_round_max"])
    if suite.adaptive_column_power is None:
        suite.adaptive_column_power = COLUMN_POWER if group else SCHEDULE_BEFORE["adaptive_column_power"]
    if suite.adaptive_alpha_split is None:
        suite.adaptive_alpha_split = GROUP_ALPHA_SPLIT if group else SCHEDULE_BEFORE["adaptive_alpha_split"]
    if suite.adaptive_step is None:
        suite.adaptive_step = GROUP_STEP if group else suite.shard_size * suite.adaptive_round


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
"""A run name is one folder name under store.root: no separators, no '..', nothing absolute."""


def _check(cfg: Config, preset_scopes: frozenset[str] = frozenset()) -> None:
    if cfg.run_name is not None and (not RUN_NAME.fullmatch(cfg.run_name) or ".." in cfg.run_name):
        raise ConfigError(
            f"run_name={cfg.run_name!r} would not be a folder inside store.root ({cfg.store.root}); expected one name "
            "of letters, digits and . _ = + - (no '/', '\\', '..' or absolute path), e.g. run_name=llama-ruler-v2; "
            "to write elsewhere, change store.root")
    _check_public_keys(cfg)
    import_plugins(cfg.plugins)
    if not cfg.suite.tasks:
        raise ConfigError("suite.tasks is empty; give at least one task, e.g. suite.tasks=[niah_single_1] "
                          "(`longeval plan` lists a suite's tasks)")
    for name in cfg.suite.tasks:
        get_task(name)
    if preset_scopes:  # a preset's params for tasks the user's suite.tasks left out change nothing: drop them
        preset = {k: v for k, v in cfg.suite.params.items() if k in preset_scopes}
        kept = selected_overrides(preset, cfg.suite.tasks)
        cfg.suite.params = {k: v for k, v in cfg.suite.params.items() if k not in preset or k in kept}
    check_overrides(cfg.suite.params, cfg.suite.tasks)
    if not cfg.suite.lengths:
        raise ConfigError("suite.lengths is empty; give at least one length, e.g. suite.lengths=[4096]")
    for length in cfg.suite.lengths:
        if length < 256:
            raise ConfigError(f"suite.lengths has {length}; lengths are in tokens and must be at least 256")
    if cfg.suite.subsets:
        choices = sampling().choices if sampling() else ()
        unknown = [s for s in cfg.suite.subsets if s.lower() not in choices]
        if unknown:
            raise ConfigError(f"suite.subsets has {', '.join(map(repr, unknown))}; choices: {', '.join(choices)}")
    prompt_format(cfg.model)  # names a wrong prompt_format, ruler_template or a system prompt RULER cannot hold
    if cfg.model.engine == Engine.openai:
        check_api(cfg.model)
    if cfg.model.engine == Engine.stand_in:
        log.warning("model.engine=stand_in: the STAND-IN engine answers instead of %s (canned answers, no model "
                    "runs); for scale work only, the scores are not a model's", cfg.model.name)
    if cfg.suite.samples < 1 or cfg.suite.shard_size < 1:
        raise ConfigError("suite.samples and suite.shard_size must be at least 1")
    _check_size(cfg.suite)
    if cfg.suite.adaptive and not (0 < cfg.suite.adaptive_confidence < 1 and cfg.suite.adaptive_round >= 1
                                   and cfg.suite.adaptive_step >= 1):
        raise ConfigError("suite.adaptive_confidence must lie strictly between 0 and 1 (e.g. 0.95), and "
                          "suite.adaptive_round and suite.adaptive_step must be at least 1")
    if cfg.suite.adaptive and (cfg.suite.adaptive_growth < 1 or cfg.suite.adaptive_round_max < 0):
        raise ConfigError(f"suite.adaptive_growth={cfg.suite.adaptive_growth} must be at least 1 (1: constant"
                          f" rounds; e.g. 1.25) and suite.adaptive_round_max={cfg.suite.adaptive_round_max} at"
                          " least 0 (0: no limit)")
    if cfg.suite.adaptive_alpha_split not in ADAPTIVE_ALPHA_SPLITS:
        raise ConfigError(f"suite.adaptive_alpha_split={cfg.suite.adaptive_alpha_split!r}; choices: "
                          f"{', '.join(ADAPTIVE_ALPHA_SPLITS)} (e.g. suite.adaptive_alpha_split=length)")
    if cfg.suite.adaptive_target not in ADAPTIVE_TARGETS:
        raise ConfigError(f"suite.adaptive_target={cfg.suite.adaptive_target!r}; choices: "
                          f"{', '.join(ADAPTIVE_TARGETS)} (e.g. suite.adaptive_target=suite)")
    for key in ("replicas", "batch_size", "inflight"):
        value = getattr(cfg.cluster, key)
        if value is not None and value < 1:
            raise ConfigError(f"cluster.{key}={value}: expected an integer of at least 1; e.g. cluster.{key}="
                              f"{getattr(ClusterConfig, key) or 1}")
    if cfg.cluster.commit_interval_s < 0:
        raise ConfigError(f"cluster.commit_interval_s={cfg.cluster.commit_interval_s}: expected seconds >= 0, "
                          "e.g. cluster.commit_interval_s=30 (0 commits every prediction at once)")
    if not 0 < 2 * cfg.store.lease_heartbeat_s <= cfg.store.lease_stale_s:
        raise ConfigError(f"store.lease_heartbeat_s={cfg.store.lease_heartbeat_s} and store.lease_stale_s="
                          f"{cfg.store.lease_stale_s}: expected a heartbeat > 0 at most half the stale limit, e.g. "
                          "store.lease_heartbeat_s=30 store.lease_stale_s=300")
    port = cfg.cluster.metrics_export_port
    if port is not None and not 1024 <= port <= 65535:
        raise ConfigError(f"cluster.metrics_export_port={port}: expected a port from 1024 to 65535, or null (a free "
                          "one Ray picks)")
    if cfg.cluster.scorer_timeout_s <= 0:
        raise ConfigError(f"cluster.scorer_timeout_s={cfg.cluster.scorer_timeout_s}: expected seconds > 0, "
                          "e.g. cluster.scorer_timeout_s=30")


MAX_SHARDS = 100_000
"""The most shards a plan lists. A plan is one spec per shard, so `plan` and `run` take time in proportion to
their number (about 3 s per 100,000 here): far beyond any real suite (RULER's full sweep is 1,560 shards), a size
is refused at once rather than after minutes of silence."""


def _check_size(suite: SuiteConfig) -> None:
    """Refuse a suite whose shard count (closed form: ceil(samples / shard_size) per task and length) is absurd."""
    lengths = sorted(set(suite.lengths))
    scheme = sampling() if suite.subsets else None
    counts = scheme.counts(lengths, suite.subsets, suite.samples) if scheme else dict.fromkeys(lengths, suite.samples)
    shards = len(suite.tasks) * sum(-(-n // suite.shard_size) for n in counts.values())
    if shards > MAX_SHARDS:
        most = MAX_SHARDS * suite.shard_size // max(1, len(suite.tasks) * len(lengths))
        raise ConfigError(
            f"suite.samples={suite.samples:,} makes {shards:,} shards ({len(suite.tasks)} tasks x {len(lengths)} "
            f"lengths, suite.shard_size={suite.shard_size}); a plan holds at most {MAX_SHARDS:,}: use suite.samples "
            f"<= {most:,} or a larger suite.shard_size")


def _check_public_keys(cfg: Config) -> None:
    """A public key that is neither a model.env variable nor a secret-looking name would change nothing: most
    likely a typo of the variable meant, which would then stay hidden."""
    for key in cfg.public_keys:
        if key not in cfg.model.env and key not in PUBLIC_ENV and not is_secret_name(key):
            env = ", ".join(sorted(cfg.model.env)) or "none"
            raise ConfigError(f"public_keys has {key!r}, which is no model.env variable (those set: {env}) and no "
                              "secret-looking name, so it is written in clear already; list model.env variables or "
                              "secret-looking names, e.g. public_keys=[VLLM_PLUGINS]")


def check_api(model: ModelConfig) -> None:
    """Fail before any work when the API settings cannot work, naming the fix (the OpenAI engine checks again)."""
    api = model.api
    if not api.base_url:
        raise ConfigError("model.engine=openai needs model.api.base_url, e.g. model.api.base_url=http://host:8000/v1")
    if api.mode == ApiMode.chat and model.chat_template:
        raise ConfigError(
            "model.api.mode=chat sends the task text as a chat message and the server applies its own template; "
            "render instances without ours: set model.chat_template=false (or use model.api.mode=completions, "
            "which sends the exact token ids)"
        )
    if api.concurrency < 1:
        raise ConfigError("model.api.concurrency must be at least 1")


def redactor(cfg: Config, environ: Mapping[str, str] | None = None) -> Redactor:
    """What this run must hide wherever it writes (`longeval.config.redaction`): the secrets of its config and of the
    environment (`environ`, default: this process's), less `public_keys`."""
    return Redactor.of(_container(cfg), environ=environ)


def to_yaml(cfg: Config, environ: Mapping[str, str] | None = None) -> str:
    """The resolved config as YAML, for the run root: every secret of the config or the environment hidden
    (`redactor`)."""
    everything = _container(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(Redactor.of(everything, environ=environ).tree(everything)))


def _container(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)  # type: ignore[return-value]
