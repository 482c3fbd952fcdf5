"""What a run root records about how it was made, and the checks that keep a root to one configuration."""

from __future__ import annotations

import logging
import platform
from dataclasses import asdict

from longeval import __version__
from longeval.config import Config, to_yaml
from longeval.plan import make_plan
from longeval.store import RunRoot

log = logging.getLogger(__name__)


def write_provenance(cfg: Config, root: RunRoot, model_path: str) -> None:
    """The resolved config and every version and fingerprint needed to reproduce a number."""
    from longeval.tasks.base import DataPaths, data_fingerprint
    from longeval.tasks.ruler.templates import TEMPLATES_FINGERPRINT
    from longeval.text.corpus import load_essays
    from longeval.text.ruler_format import RULER_MODEL_TEMPLATES_FINGERPRINT
    from longeval.text.tokenizer import chat_template_fingerprint, load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(model_path)
    corpus = load_essays(cfg.suite.data.essay_dir)
    versions = {
        "longeval": __version__,
        "python": platform.python_version(),
        **{name: _version(name) for name in ("vllm", "ray", "transformers", "tokenizers", "torch", "pyarrow")},
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_template_fingerprint": chat_template_fingerprint(tokenizer),
        "ruler_templates_fingerprint": TEMPLATES_FINGERPRINT,
        "ruler_model_templates_fingerprint": RULER_MODEL_TEMPLATES_FINGERPRINT,
        "essay_corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "words": corpus.words},
        "data_fingerprint": data_fingerprint(DataPaths(**asdict(cfg.suite.data))),
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


def _check_same_config(cfg: Config, root: RunRoot) -> None:
    """Refuse to mix instances from a different suite or model into an existing run root."""
    from longeval.errors import ConfigError

    if not root.exists("config.yaml"):
        return
    from omegaconf import OmegaConf

    old = OmegaConf.create(root.read_text("config.yaml"))
    for key in ("model.path", "model.chat_template", "model.answer_prefix", "model.reasoning", "model.system_prompt",
                "model.prompt_format", "model.ruler_template",
                "suite.seed", "suite.params", "suite.data.essay_dir", "suite.data.squad_path",
                "suite.data.hotpotqa_path", "suite.data.longbench_v2_path"):
        was, now = OmegaConf.select(old, key), OmegaConf.select(OmegaConf.structured(cfg), key)
        if was != now:
            raise ConfigError(
                f"run root {root.uri} was made with {key}={was!r}, not {now!r}; use another run_name=... "
                "or store.root=..., or delete that run root to start over"
            )
    _check_same_ranges(cfg, old, root)
    if root.exists("versions.json"):
        from longeval.tasks.base import DataPaths, data_fingerprint

        was = root.read_json("versions.json").get("data_fingerprint")
        if was and was != data_fingerprint(DataPaths(**asdict(cfg.suite.data))):
            raise ConfigError(
                f"the data files behind run root {root.uri} changed since it was made (essay corpus or QA files); "
                "use another run_name=... to evaluate the new data, or delete that run root"
            )


def _check_same_ranges(cfg: Config, old, root: RunRoot) -> None:
    """Refuse a samples or shard_size change that gives a finished shard name instances it does not hold: the
    rerun would take the old shard for done and miss them. Fewer samples are fine: the summaries keep only the
    current plan's instances (`in_plan`)."""
    import dataclasses

    from omegaconf import OmegaConf

    from longeval.errors import ConfigError

    was = {k: OmegaConf.select(old, f"suite.{k}") for k in ("samples", "shard_size", "subsets")}
    if None in (was["samples"], was["shard_size"]):
        return
    before = dataclasses.replace(cfg, suite=dataclasses.replace(
        cfg.suite, samples=int(was["samples"]), shard_size=int(was["shard_size"]),
        subsets=list(was["subsets"] or [])))
    old_ranges = {s.name: (s.start, s.stop) for s in make_plan(before, check_data=False).shards}
    changed = sorted(s.name for s in make_plan(cfg, check_data=False).shards
                     if s.name in old_ranges and not old_ranges[s.name][0] == s.start < s.stop <= old_ranges[s.name][1])
    if changed:
        raise ConfigError(
            f"run root {root.uri} was made with suite.samples={was['samples']} and suite.shard_size="
            f"{was['shard_size']}; with suite.samples={cfg.suite.samples} and suite.shard_size={cfg.suite.shard_size}"
            f" shard {changed[0]} would need instances it does not hold. Use another run_name=..., "
            "or the default run name (it differs per suite)")
