"""What a run root records about how it was made, and the checks that keep a root to one configuration."""

from __future__ import annotations

import logging
import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from longeval import __version__
from longeval.config import ADAPTIVE_SHARD_SIZE, GROUP_SHARD_SIZE, SCHEDULE_BEFORE, Config, conform, to_yaml
from longeval.errors import ConfigError
from longeval.planning.plan import make_plan
from longeval.store.run_root import RunRoot
from longeval.tasks.base import DataPaths, data_fingerprint
from longeval.tasks.ruler.templates import TEMPLATES_FINGERPRINT
from longeval.text.corpus import essays_identity
from longeval.text.ruler_format import RULER_MODEL_TEMPLATES_FINGERPRINT
from longeval.text.tokenizer import chat_template_fingerprint, load_tokenizer, tokenizer_fingerprint

log = logging.getLogger(__name__)

PROMPT_SETTINGS = ("model.chat_template", "model.answer_prefix", "model.reasoning", "model.system_prompt",
                   "model.prompt_format", "model.ruler_template")
"""Model settings that change the prompts or how outputs are read, and so the instance ids."""
SUITE_SETTINGS = ("suite.seed", "suite.params")
"""Suite settings that change every instance (lengths, tasks and samples only choose which exist)."""
DATA_SETTINGS = ("suite.data.essay_dir", "suite.data.squad_path", "suite.data.hotpotqa_path",
                 "suite.data.longbench_v2_path")
"""Where the data lives: a run root keeps its paths, and its `data_fingerprint` for what they hold."""
RUN_SETTINGS = ("model.path", *PROMPT_SETTINGS, *SUITE_SETTINGS, *DATA_SETTINGS)
"""The config keys that identify a run root's rows: a rerun into the root must keep every one of them."""
COMPARED_SETTINGS = (*SUITE_SETTINGS, *PROMPT_SETTINGS)
"""The run settings two runs of different models (or machines) should share to compare instance by instance."""
COMPARED_VERSIONS = ("tokenizer_fingerprint", "chat_template_fingerprint", "data_fingerprint")
"""Their `versions.json` fingerprints that decide instance ids."""
WRITTEN_KEYS = ("model", "suite", "cluster", "store", "tracking", "run_name", "model.name", "model.path",
                "suite.name", "suite.tasks", "suite.lengths", "suite.seed", "store.root")
"""Keys every config.yaml a run has written holds, since the first version (`run_name` is written after the
sections, null or not): one that lacks any was cut short or edited, and the schema's defaults must not stand in."""
_ABSENT = object()


def write_provenance(cfg: Config, root: RunRoot, model_path: str) -> None:
    """The resolved config and every version and fingerprint needed to reproduce a number."""
    tokenizer = load_tokenizer(model_path)
    corpus = essays_identity(cfg.suite.data.essay_dir)
    versions = {
        "longeval": __version__,
        "python": platform.python_version(),
        **{name: _version(name) for name in ("vllm", "ray", "transformers", "tokenizers", "torch", "pyarrow")},
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "ruler_templates_fingerprint": TEMPLATES_FINGERPRINT,
        "ruler_model_templates_fingerprint": RULER_MODEL_TEMPLATES_FINGERPRINT,
        "essay_corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "words": corpus.words},
        "data_fingerprint": _data_fingerprint(cfg),
        "model_path": model_path,
    }
    root.write_text("config.yaml", to_yaml(cfg))
    root.write_json("versions.json", versions)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in (dist, f"{dist}-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


def _data_fingerprint(cfg: Config) -> str:
    return data_fingerprint(DataPaths(**asdict(cfg.suite.data)))


def run_identity(config: Config | DictConfig | dict[str, Any],
                 keys: tuple[str, ...] = RUN_SETTINGS) -> dict[str, Any]:
    """`{key: value}` of the settings that identify a run (None where an older config.yaml lacks one), from a
    config or a run root's stored config.yaml."""
    tree = config if isinstance(config, DictConfig) else OmegaConf.create(config)
    return {key: OmegaConf.select(tree, key, default=None) for key in keys}


@dataclass(frozen=True)
class StoredConfig:
    """A run root's config.yaml as read back: its settings, and what is wrong with the file when it is damaged."""

    tree: DictConfig | None
    """The settings as written (what of them parses: a cut-short file keeps its first keys); None when the file is
    no mapping of settings at all."""
    damage: str | None = None
    """Why the file cannot be the config a run wrote (it does not parse, is no mapping, lacks keys every written
    config holds, or does not match the schema); None when it is whole."""


def stored_config(root: RunRoot) -> StoredConfig | None:
    """The run root's config.yaml, None when it has none. A damaged file is no error here: a run refuses it
    (`check_same_config`), a report reads the root from its instances instead (`report.runs`)."""
    raw = root.read_if_exists("config.yaml")
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return StoredConfig(None, f"it is not UTF-8 text (byte {exc.start})")
    try:
        shape = yaml.safe_load(text)
        tree = OmegaConf.create(text) if isinstance(shape, dict) else None
    except (yaml.YAMLError, OmegaConfBaseException, ValueError, AssertionError) as exc:
        return StoredConfig(None, f"it does not parse as YAML ({_yaml_problem(exc)})")
    if tree is None:
        what = "it is empty" if shape is None else f"it holds a {type(shape).__name__}, not a mapping of settings"
        return StoredConfig(None, what)
    missing = [key for key in WRITTEN_KEYS if OmegaConf.select(tree, key, default=_ABSENT) is _ABSENT]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return StoredConfig(tree, f"it lacks {', '.join(missing[:3])}{more} of the keys every config.yaml a run "
                                  "writes holds, as if cut short")
    try:
        conform(tree)
    except ConfigError as exc:
        return StoredConfig(tree, f"it does not match the config schema ({str(exc).split('; ')[0]})")
    return StoredConfig(tree)


def _yaml_problem(exc: BaseException) -> str:
    """A YAML error as its problem and line (1-based), e.g. "could not find expected ':' at line 3"."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def damaged_config_message(root: RunRoot, damage: str) -> str:
    """The one line a run refused by a damaged config.yaml prints: the file, what it was checked against, and how
    to restore it without losing the root's work."""
    path = root.path("config.yaml")
    return (f"{path} is damaged: {damage}. This command's config is checked against it, the config run root "
            f"{root.uri} was made with, and cannot be; nothing was changed. To restore it and keep the root's "
            f"instances and predictions: move it aside (e.g. to {path}.damaged) and rerun this command with the "
            "overrides the run was made with, which writes config.yaml again (`longeval report "
            f"{root.uri} -o report.html` reads the root from its instances meanwhile)")


def check_same_config(cfg: Config, root: RunRoot) -> None:
    """Refuse to mix instances from a different suite or model into an existing run root, and to check against a
    damaged config.yaml (whose missing keys would read as settings the root was never made with)."""
    stored = stored_config(root)
    if stored is None:
        return
    if stored.damage is not None or stored.tree is None:
        raise ConfigError(damaged_config_message(root, stored.damage or "it does not parse"))
    old = stored.tree
    before, after = run_identity(old), run_identity(cfg)
    for key in RUN_SETTINGS:
        was, now = before[key], after[key]
        if was != now:
            again = _override(was)
            raise ConfigError(
                f"run root {root.uri} was made with {key}={was!r}, not {now!r}; use another run_name=... or "
                f"store.root=... to run with {key}={now!r}"
                + (f", or pass {key}={again} to go on with that root" if again is not None else "")
                + _start_over(root)
            )
    _check_same_schedule(cfg, old, root)
    _check_same_ranges(cfg, old, root)
    versions = root.json_if_exists("versions.json")
    if versions is not None:
        was = versions.get("data_fingerprint")
        if was and was != _data_fingerprint(cfg):
            raise ConfigError(
                f"the data files behind run root {root.uri} changed since it was made (essay corpus or QA files); "
                "use another run_name=... to evaluate the new data" + _start_over(root)
            )


def _start_over(root: RunRoot) -> str:
    """The advice to delete a run root, only for one that holds no predictions: deleting one that does would
    destroy finished work (another run_name is always offered instead)."""
    if root.shard_names("predictions"):
        return ""
    return ", or delete that run root (it holds no predictions) to start over"


_PLAIN = re.compile(r"[A-Za-z0-9_./:+-]+")
_NUMBER = re.compile(r"[-+]?[0-9._]+([eE][-+]?[0-9]+)?")


def _override(value: Any) -> str | None:
    """A stored scalar as a Hydra override's value (null, true, 4096, a plain string); None for anything that
    needs quoting or is a list or mapping (the message then names no override to pass again)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if (isinstance(value, str) and _PLAIN.fullmatch(value) and not _NUMBER.fullmatch(value)
            and value.lower() not in ("null", "true", "false")):
        return value
    return None


def older_default_root(cfg: Config) -> str | None:
    """The run root this config named before a group target's defaults (shards of 10), when it exists and this
    run's own does not: the default run name hashes the shard size, so rerunning an older command would start a
    new root beside it instead of resuming it. The caller warns (`pipeline`); None otherwise."""
    import dataclasses

    suite = cfg.suite
    if (cfg.run_name is not None or not suite.adaptive or suite.adaptive_target == "tasks"
            or suite.shard_size != GROUP_SHARD_SIZE):
        return None
    before = dataclasses.replace(cfg, suite=dataclasses.replace(suite, shard_size=ADAPTIVE_SHARD_SIZE))
    if RunRoot(cfg.run_root).exists("config.yaml") or not RunRoot(before.run_root).exists("config.yaml"):
        return None
    return before.run_root


def _check_same_schedule(cfg: Config, old, root: RunRoot) -> None:
    """Refuse to go on sampling an adaptive root with another round schedule or alpha split than it was sampled
    with. Why: the split shares alpha over the lengths before any draw; choosing it again after seeing scores
    would void the guarantee, and a changed schedule would silently change the plan the root's numbers describe.
    The defaults differ per target (config.SCHEDULE_BEFORE for roots whose config.yaml lacks the keys), so this
    also keeps a root made under older defaults from taking the new ones."""
    if not (cfg.suite.adaptive and OmegaConf.select(old, "suite.adaptive", default=False)):
        return
    was = {k: OmegaConf.select(old, f"suite.{k}", default=None) for k in ("shard_size", *SCHEDULE_BEFORE)}
    was = {k: SCHEDULE_BEFORE.get(k) if v is None else v for k, v in was.items()}
    if was["adaptive_step"] is None and was["shard_size"] is not None:  # rounds were whole shards then
        was["adaptive_step"] = was["shard_size"] * OmegaConf.select(old, "suite.adaptive_round", default=1)
    elif was["adaptive_step"] is None:
        del was["adaptive_step"]
    if was["shard_size"] is None:  # a root without one: `_check_same_ranges` has nothing to compare either
        del was["shard_size"]
    now = {k: getattr(cfg.suite, k) for k in was}
    if was != now:  # shard_size too: with its default per target, one message names every setting to pass again
        def overrides(values: dict) -> str:
            return " ".join(f"suite.{k}={v}" for k, v in values.items())

        raise ConfigError(
            f"run root {root.uri} was sampled with {overrides(was)}; this run would go on with {overrides(now)} "
            f"(the defaults differ per suite.adaptive_target, docs/adaptive.md). Pass the root's settings again "
            f"({overrides(was)}), or use another run_name=... to sample anew")


def _check_same_ranges(cfg: Config, old, root: RunRoot) -> None:
    """Refuse a samples, shard_size or shuffle change that gives a finished shard name instances it does not hold:
    the rerun would take the old shard for done and miss them. Fewer samples in index order are fine: the
    summaries keep only the current plan's instances (`in_plan`). A shuffled cell's order depends on its
    instance count, so there any change is refused."""
    import dataclasses

    was = {k: OmegaConf.select(old, f"suite.{k}") for k in ("samples", "shard_size", "subsets", "shuffle")}
    if None in (was["samples"], was["shard_size"]):
        return
    was["shuffle"] = bool(was["shuffle"])  # roots made before the setting existed are in index order
    before = dataclasses.replace(cfg, suite=dataclasses.replace(
        cfg.suite, samples=int(was["samples"]), shard_size=int(was["shard_size"]),
        subsets=list(was["subsets"] or []), shuffle=was["shuffle"]))
    old_indices = {s.name: s.indices() for s in make_plan(before, check_data=False).shards}
    changed = sorted(s.name for s in make_plan(cfg, check_data=False).shards
                     if s.name in old_indices and s.indices() != old_indices[s.name][:len(s.indices())])
    if changed:
        now = (cfg.suite.samples, cfg.suite.shard_size, cfg.suite.shuffle)
        raise ConfigError(
            f"run root {root.uri} was made with suite.samples={was['samples']}, suite.shard_size="
            f"{was['shard_size']} and suite.shuffle={str(was['shuffle']).lower()}; with suite.samples={now[0]}, "
            f"suite.shard_size={now[1]} and suite.shuffle={str(now[2]).lower()} shard {changed[0]} would need "
            "instances it does not hold. Pass the root's settings again (completing an adaptive root into the full "
            "sweep keeps its shard size and order), use another run_name=..., or the default run name (it differs "
            "per suite)")
