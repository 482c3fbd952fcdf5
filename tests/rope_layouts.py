"""config.json rope layouts of the presets' checkpoints, applied to the tiny model's config for tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0}
YARN_DOCUMENTED = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                   "max_position_embeddings": 131072}
"""The docs' recipe before issue 26: no rope_theta inside, so vLLM 0.32 builds base 10000."""
YARN_WITH_THETA = {"rope_scaling": {**YARN_DOCUMENTED["rope_scaling"], "rope_theta": 500000.0},
                   "max_position_embeddings": 131072}
YARN_PARAMETERS = {"rope_parameters": {**YARN_DOCUMENTED["rope_scaling"], "rope_theta": 500000.0},
                   "max_position_embeddings": 131072}

QWEN_YARN = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                 "rope_theta": 1000000.0}, "max_position_embeddings": 131072}
"""Qwen2.5's YaRN x4 recipe for its 32K models, with Qwen2.5-7B-Instruct's base inside."""
QWEN_1M_YARN_LLAMA_BASE = {"rope_parameters": {**YARN_WITH_THETA["rope_scaling"]}, "max_position_embeddings": 131072}
"""The Llama recipe (base 500000 inside) copied onto a Qwen2.5-1M checkpoint (base 1e7): the wrong base."""

LAYOUTS: dict[str, dict[str, Any]] = {
    # Llama-3.1 as its hub config.json (legacy: rope_scaling next to a top-level rope_theta)
    "llama31_legacy": {"rope_theta": 500000.0, "rope_scaling": LLAMA3, "max_position_embeddings": 131072},
    # the same as transformers 5 saves it (one rope_parameters dict holding the base)
    "llama31_rope_parameters": {"rope_parameters": {"rope_theta": 500000.0, **LLAMA3},
                                "max_position_embeddings": 131072},
    # Qwen2.5-1M after dual_chunk_attention_config is deleted (the preset's instructions): plain rope, base 1e7
    "qwen25_1m_no_dca": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rope_theta": 10000000.0,
                         "max_position_embeddings": 1010000, "sliding_window": 32768, "use_sliding_window": False,
                         "max_window_layers": 2, "attention_bias": True},
    # Qwen2.5-7B-Instruct (32K, base 1e6): the checkpoint Qwen's model card extends with YaRN x4 (QWEN_YARN)
    "qwen25_32k": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0,
                   "max_position_embeddings": 32768, "sliding_window": 32768, "use_sliding_window": False,
                   "max_window_layers": 2, "attention_bias": True},
    # UltraLong-like: Llama-3.1 base with YaRN in config.json. An ASSUMPTION, not the published file: the real
    # config.json of nvidia/Llama-3.1-8B-UltraLong-1M-Instruct was not reachable (conf/model/ultralong8b_1m.yaml);
    # factor 128 from 8192 is 1,048,576 / 8192, the base is Llama-3.1-8B-Instruct's. The preset states no rope keys,
    # so what the engine test pins is vLLM's handling of a YaRN config.json, not UltraLong's numbers.
    "ultralong_yarn": {"rope_theta": 500000.0, "max_position_embeddings": 1048576,
                       "rope_scaling": {"rope_type": "yarn", "factor": 128.0,
                                        "original_max_position_embeddings": 8192}},
}


def layout_config(base: dict[str, Any], layout: str) -> dict[str, Any]:
    """The tiny model's config.json with `layout`'s rope keys instead of its own."""
    config = {k: v for k, v in base.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    config.update(json.loads(json.dumps(LAYOUTS[layout])))
    if config.get("model_type") == "qwen2":
        config.pop("head_dim", None)  # Qwen2 derives it: hidden 128 / 2 heads = 64
        config.pop("mlp_bias", None)
    return config


def layout_model(tiny: Path, layout: str, out: Path) -> Path:
    """A model folder: the tiny model's weights and tokenizer (linked) with `layout`'s config.json."""
    out.mkdir(parents=True, exist_ok=True)
    for item in tiny.iterdir():
        if item.name != "config.json" and not (out / item.name).exists():
            os.symlink(item, out / item.name)
    base = json.loads((tiny / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(layout_config(base, layout), indent=2))
    return out
