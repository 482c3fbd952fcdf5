"""The rotary embedding a checkpoint declares, the one vLLM 0.32 will build from it, and the check between them.

A long-context score means something only if the engine ran the model's own positions. Two layouts of the rope
settings are in use: legacy config.json files keep `rope_theta` at the top level next to `rope_scaling`,
transformers 5 keeps everything in one `rope_parameters` dict (and aliases `rope_scaling` to it). What vLLM 0.32
does with `model.engine_kwargs.hf_overrides` (measured with `vllm.config.ModelConfig` on both layouts):

- a dict value (`rope_scaling` or `rope_parameters`) *replaces* the checkpoint's rope dict, after transformers
  has moved `rope_theta` into it, so an override without `rope_theta` builds base 10000 (1,000,000 for Qwen2/3);
- a top-level `rope_theta` is ignored once the checkpoint's dict holds one (transformers only `setdefault`s it);
- a legacy `type` key inside the override is not renamed to `rope_type` (vLLM fails with `KeyError: 'rope_type'`).

`declared_rotary` reads what the user means (the checkpoint's rope with the override's keys on top, base kept),
`vllm_rotary` what vLLM will build, and `check_rope_overrides` refuses a difference before any engine starts.
After the start, `VllmEngine` reads the rotary embeddings vLLM built (`built_rotaries`) and `check_built`
compares them with the declaration: that is the ground truth. Pure functions: no vLLM import here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longeval.errors import ConfigError

VLLM_DEFAULT_THETA = 10000.0
"""What vLLM's `get_rope` uses when the rope dict has no `rope_theta`."""

VLLM_MODEL_DEFAULT_THETA = {"qwen2": 1e6, "qwen3": 1e6, "exaone4": 1e6, "ernie4_5_moe": 500000.0}
"""Model types whose vLLM 0.32 implementation fills a missing `rope_theta` itself (`set_default_rope_theta`)."""

VLLM_ROPE_CLASSES = {
    "default": "RotaryEmbedding",
    "llama3": "Llama3RotaryEmbedding",
    "yarn": "YaRNScalingRotaryEmbedding",
    "linear": "LinearScalingRotaryEmbedding",
    "dynamic": "DynamicNTKScalingRotaryEmbedding",
    "ntk": "NTKScalingRotaryEmbedding",
    "longrope": "Phi3LongRoPEScaledRotaryEmbedding",
    "deepseek_yarn": "DeepseekScalingRotaryEmbedding",
    "deepseek_llama_scaling": "DeepseekScalingRotaryEmbedding",
}
"""The class vLLM 0.32's `get_rope` builds per rope type (vllm/model_executor/layers/rotary_embedding)."""

SCALED_FROM_ORIGINAL = frozenset({"llama3", "yarn", "longrope", "deepseek_yarn", "deepseek_llama_scaling"})
"""Rope types that need `original_max_position_embeddings` (vLLM's `get_rope` reads it without a default)."""

ROPE_DICT_KEYS = ("rope_scaling", "rope_parameters")


@dataclass(frozen=True)
class Rotary:
    """A rotary embedding as vLLM builds it: its type, base (`rope_theta`), scaling factor and original length."""

    rope_type: str
    base: float
    factor: float | None = None
    """None for unscaled rope."""
    original_max_position_embeddings: int | None = None

    @property
    def vllm_class(self) -> str:
        """The class name vLLM 0.32 gives this rotary embedding (`?<type>` for a type it does not know)."""
        return VLLM_ROPE_CLASSES.get(self.rope_type, f"?{self.rope_type}")

    def describe(self) -> str:
        """One line, e.g. `YaRNScalingRotaryEmbedding(base 500000, factor 4, original 32768)`."""
        parts = [f"base {self.base:g}"]
        if self.factor is not None:
            parts.append(f"factor {self.factor:g}")
        if self.original_max_position_embeddings is not None:
            parts.append(f"original {self.original_max_position_embeddings}")
        return f"{self.vllm_class}({', '.join(parts)})"

    def record(self) -> dict[str, Any]:
        """The fields of an engine record (`engines/*.json`)."""
        return {"class": self.vllm_class, "rope_type": self.rope_type, "base": self.base, "factor": self.factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's keys: a multimodal config keeps them under `text_config`, whose keys win."""
    return {**config, **(config.get("text_config") or {})}


def checkpoint_rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's rope dict as transformers 5 loads it: `rope_theta` inside, `rope_type` set.

    Legacy files (`rope_scaling` + top-level `rope_theta`) and transformers 5 files (`rope_parameters` holding
    both) give the same dict. A legacy `rope_scaling` wins over `rope_parameters` (transformers' precedence).
    """
    text = text_config(config)
    rope = dict(text.get("rope_scaling") or text.get("rope_parameters") or {})
    theta = checkpoint_theta(text)
    if theta is not None:
        rope.setdefault("rope_theta", theta)
    rope = _rope_type_named(rope)
    if rope["rope_type"] in ("llama3", "yarn", "longrope"):
        original = text.get("original_max_position_embeddings") or text.get("max_position_embeddings")
        rope.setdefault("original_max_position_embeddings", original)
    return rope


def checkpoint_theta(config: Mapping[str, Any]) -> float | None:
    """The checkpoint's `rope_theta` wherever its layout keeps it (a rope dict, or the top level); None if absent."""
    text = text_config(config)
    for key in ROPE_DICT_KEYS:
        rope = text.get(key)
        if isinstance(rope, Mapping) and rope.get("rope_theta") is not None:
            return float(rope["rope_theta"])
    value = text.get("rope_theta", text.get("rotary_emb_base"))
    return None if value is None else float(value)


def declared_rotary(config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> Rotary:
    """The rotary embedding the checkpoint declares after the user's `hf_overrides`, as the user means them.

    The override's rope keys go on top of the checkpoint's, and what it does not say (the base, above all) stays
    the checkpoint's. A different rope type keeps only the base: another type's scaling keys do not carry over.
    A top-level `rope_theta` override sets the base.
    """
    rope = checkpoint_rope(config)
    overrides = overrides or {}
    for key in ROPE_DICT_KEYS:
        value = overrides.get(key)
        if isinstance(value, Mapping):
            new = _rope_type_named(dict(value))
            if new["rope_type"] != rope.get("rope_type"):
                rope = {k: v for k, v in rope.items() if k == "rope_theta"}
            rope = {**rope, **new}
    if overrides.get("rope_theta") is not None:
        rope["rope_theta"] = float(overrides["rope_theta"])
    return rotary_of(rope, default_theta=_model_default_theta(config))


def vllm_rotary(config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> Rotary:
    """The rotary embedding vLLM 0.32 (with transformers 5) builds from the checkpoint and `hf_overrides`.

    Mirrors what was measured: a dict override replaces the checkpoint's rope dict as given (no `rope_theta`
    filled in, no `type` renamed), and a top-level `rope_theta` override never reaches the rope dict.
    """
    rope = checkpoint_rope(config)
    overrides = overrides or {}
    for key in ROPE_DICT_KEYS:  # vLLM sets dict overrides in the order given; the last one wins
        value = overrides.get(key)
        if isinstance(value, Mapping):
            rope = dict(value)
    rope.setdefault("rope_type", "default")
    return rotary_of(rope, default_theta=_model_default_theta(config))


def check_rope_overrides(config: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None,
                         *, where: str = "model.engine_kwargs.hf_overrides") -> Rotary | None:
    """Refuse `hf_overrides` with which vLLM would build another rotary embedding than the checkpoint declares.

    `config` is the checkpoint's config.json (or the preset's `model.architecture`); None when unknown, and then
    any rope dict in the override must carry its own `rope_theta`. Returns the declared rotary embedding (None
    when the config is unknown).

    Raises:
        ConfigError: one line naming what vLLM would build, what is declared, and the override that fixes it.
    """
    overrides = overrides or {}
    for key in ROPE_DICT_KEYS:
        value = overrides.get(key)
        if not isinstance(value, Mapping):
            continue
        if "rope_type" not in value and "type" in value:
            raise ConfigError(f"{where}.{key} has the legacy key type={value['type']!r}, which vLLM 0.32 does not "
                              f"rename in an override (KeyError: 'rope_type'): write rope_type: {value['type']}")
        if value.get("rope_type") in SCALED_FROM_ORIGINAL and "original_max_position_embeddings" not in value:
            raise ConfigError(f"{where}.{key} (rope_type {value['rope_type']}) has no "
                              f"original_max_position_embeddings, which vLLM 0.32 needs: add the context the "
                              f"model was trained on before scaling")
    if sum(isinstance(overrides.get(key), Mapping) for key in ROPE_DICT_KEYS) > 1:
        raise ConfigError(f"{where} has both rope_scaling and rope_parameters, which are one setting in "
                          f"transformers 5 (the last replaces the first): keep one, with rope_theta inside")
    if config is None:
        for key in ROPE_DICT_KEYS:
            value = overrides.get(key)
            if isinstance(value, Mapping) and "rope_theta" not in value:
                raise ConfigError(f"{where}.{key} has no rope_theta, so vLLM 0.32 builds its default base "
                                  f"({VLLM_DEFAULT_THETA:g}; 1e+06 for Qwen2/3) whatever the checkpoint's is: put the "
                                  f"checkpoint's rope_theta inside {where}.{key}")
        return None
    declared, built = declared_rotary(config, overrides), vllm_rotary(config, overrides)
    if not same_rotary(declared, built.record()):
        raise ConfigError(f"with {where}={_flat(overrides)}, vLLM 0.32 would build {built.describe()} but the "
                          f"checkpoint with your override declares {declared.describe()}: "
                          f"{_fix(declared, overrides, where)}")
    return declared


def built_rotaries(model: Any) -> list[dict[str, Any]]:
    """The distinct rotary embeddings in a loaded model (a torch module), as engine-record fields.

    Read from the modules vLLM built, not from its config: class name, `base`, and `scaling_factor` /
    original length where the class has them.
    """
    seen: dict[tuple, dict[str, Any]] = {}
    for module in model.modules():
        name = type(module).__name__
        if not name.endswith("RotaryEmbedding") or not hasattr(module, "base"):
            continue
        factor = getattr(module, "scaling_factor", None)
        original = _built_original(module, name)
        entry = {"class": name, "base": float(module.base),
                 "factor": None if factor is None else float(factor),
                 "original_max_position_embeddings": None if original is None else int(original)}
        seen.setdefault(tuple(entry.values()), entry)
    return list(seen.values())


def same_rotary(expected: Rotary, built: Mapping[str, Any]) -> bool:
    """Whether a built rotary embedding (an engine-record entry) is the expected one: class, base, factor."""
    if built.get("class") != expected.vllm_class or not math.isclose(float(built["base"]), expected.base,
                                                                     rel_tol=1e-6):
        return False
    factor = built.get("factor")
    return factor is None or expected.factor is None or math.isclose(float(factor), expected.factor, rel_tol=1e-6)


def check_built(expected: Rotary, built: list[dict[str, Any]], *, overrides: Mapping[str, Any] | None = None,
                where: str = "model.engine_kwargs.hf_overrides") -> None:
    """Refuse a started engine whose rotary embeddings are not the declared one (after the override).

    Raises:
        ConfigError: one line with what vLLM built, what is declared, and the fix.
    """
    wrong = [b for b in built if not same_rotary(expected, b)]
    if not built or not wrong:
        return
    got = "; ".join(_describe_built(b) for b in wrong)
    raise ConfigError(f"vLLM built {got} but the checkpoint with your override declares {expected.describe()}: "
                      f"{_fix(expected, overrides or {}, where)}")


def _built_original(module: Any, name: str) -> int | None:
    """The pre-scaling length a built rotary embedding holds: YaRN keeps it as its max_position_embeddings."""
    if name in ("YaRNScalingRotaryEmbedding", "DeepseekScalingRotaryEmbedding"):
        return getattr(module, "max_position_embeddings", None)
    return getattr(module, "original_max_position_embeddings", None) or getattr(module, "orig_max_position", None)


def _describe_built(entry: Mapping[str, Any]) -> str:
    parts = [f"base {entry['base']:g}"]
    if entry.get("factor") is not None:
        parts.append(f"factor {entry['factor']:g}")
    return f"{entry['class']}({', '.join(parts)})"


def _fix(declared: Rotary, overrides: Mapping[str, Any], where: str) -> str:
    """The override that yields `declared`, in one clause."""
    key = next((k for k in ROPE_DICT_KEYS if isinstance(overrides.get(k), Mapping)), None)
    theta = f"rope_theta: {declared.base:g}"
    if key is not None:
        return (f"put {theta} inside {where}.{key} (or write {where}.rope_parameters with it); vLLM replaces "
                f"the checkpoint's rope dict with the override's")
    if overrides.get("rope_theta") is not None:
        return (f"vLLM ignores a top-level rope_theta override: write {where}.rope_parameters with the rope "
                f"type and {theta} inside")
    return f"set {where}.rope_parameters with rope_type {declared.rope_type} and {theta}"


def rotary_of(rope: Mapping[str, Any], *, default_theta: float) -> Rotary:
    """The rotary embedding `get_rope` builds from a final rope dict (`hf_config.rope_parameters`, with `rope_type`),
    with `default_theta` for a dict without `rope_theta`."""
    rope_type = str(rope.get("rope_type") or "default")
    theta = rope.get("rope_theta")
    factor = rope.get("factor") if rope_type != "default" else None
    original = rope.get("original_max_position_embeddings") if rope_type != "default" else None
    return Rotary(rope_type=rope_type, base=float(default_theta if theta is None else theta),
                  factor=None if factor is None else float(factor),
                  original_max_position_embeddings=None if original is None else int(original))


def _rope_type_named(rope: dict[str, Any]) -> dict[str, Any]:
    """`type` -> `rope_type` and `su` -> `longrope`, as transformers and vLLM do when they load a config."""
    if "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type", "default")
    else:
        rope.pop("type", None)
    if rope["rope_type"] == "su":
        rope["rope_type"] = "longrope"
    return rope


def _model_default_theta(config: Mapping[str, Any]) -> float:
    return VLLM_MODEL_DEFAULT_THETA.get(str(text_config(config).get("model_type", "")), VLLM_DEFAULT_THETA)


def _flat(overrides: Mapping[str, Any]) -> str:
    """The override on one line, as the user wrote it."""
    return json.dumps(dict(overrides), separators=(",", ":"), default=str)
