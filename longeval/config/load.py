"""Loading the run configuration: `conf/` (or $LONGEVAL_CONF) composed by Hydra with the user's overrides, then
checked (`longeval.config.validation`); every error names the key, the file or the override to fix."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from longeval.config.explain import explain_override, explain_parse, explain_type, explain_yaml
from longeval.config.schema import Config
from longeval.config.validation import validate
from longeval.errors import ConfigError

__all__ = ["PACKAGED_CONF", "conf_dir", "group_choices", "load_config"]

PACKAGED_CONF = Path(__file__).resolve().parents[2] / "conf"


def conf_dir() -> Path:
    """The config tree: $LONGEVAL_CONF, else conf/ beside the package. A LONGEVAL_CONF without a config.yaml is
    refused by name: Hydra would call it a bad override, "Primary config directory not found"."""
    given = os.environ.get("LONGEVAL_CONF")
    if not given:
        return PACKAGED_CONF
    folder = Path(given).expanduser()
    if not (folder / "config.yaml").is_file():
        what = ("no such folder" if not folder.exists() else "not a folder" if not folder.is_dir()
                else "a folder without config.yaml")
        raise ConfigError(f"LONGEVAL_CONF={given}: {what} ({folder.resolve()}); point it at a config tree like "
                          f"conf/ (config.yaml with model/, suite/, cluster/ ...), or unset it for the packaged "
                          f"one ({PACKAGED_CONF})")
    return folder


def group_choices(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def load_config(overrides: list[str] | None = None) -> Config:
    """Compose conf/ with Hydra-style overrides and validate against the schema."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, OverrideParseException

    overrides = list(overrides or [])
    for item in overrides:
        group = item.split("=", 1)[0].lstrip("+~")
        if "=" in item and "." not in group and (conf_dir() / group).is_dir():
            choice = item.split("=", 1)[1]
            if choice not in group_choices(group):
                raise ConfigError(f"unknown {group} {choice!r}; choices: {', '.join(group_choices(group))}")
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="longeval_schema", node=Config)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            raw = compose(config_name="config", overrides=overrides)
    except OverrideParseException as exc:
        raise ConfigError(explain_parse(exc.override, overrides)) from exc
    except HydraException as exc:
        raise ConfigError(explain_type(exc, overrides, conf_dir()) or explain_override(str(exc))) from exc
    except yaml.YAMLError as exc:  # Hydra lets a config file's syntax error through as the parser's own
        raise ConfigError(explain_yaml(exc)) from exc
    finally:
        GlobalHydra.instance().clear()
    return validate(raw, preset_scopes=_preset_scopes(raw, overrides))


def _preset_scopes(raw: DictConfig, overrides: list[str]) -> frozenset[str]:
    """The `suite.params` scopes that come from config files, not from the user's overrides."""
    scopes = set(OmegaConf.select(raw, "suite.params") or {})
    for item in overrides:
        key = item.lstrip("+~").split("=", 1)[0]
        if key == "suite.params":  # the whole map replaced: every scope is the user's
            return frozenset()
        if key.startswith("suite.params."):
            scopes.discard(key.split(".")[2])
    return frozenset(scopes)

