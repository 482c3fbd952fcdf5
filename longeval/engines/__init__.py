"""Inference engines: vLLM in-process (one engine per Ray actor), or an OpenAI-compatible server over HTTP.

The infer stage (`longeval.stages.infer`) drives `vllm_engine.VllmEngine` in its own replica actors and
`ApiPredictor` as a Ray Data callable; builders use either through `predictor_class`, a batch of rows in,
prediction rows out.
"""

from __future__ import annotations

from longeval.config import ModelConfig
from longeval.engines.openai_compat import ApiPredictor
from longeval.engines.vllm_engine import VllmPredictor
from longeval.errors import ConfigError


def predictor_class(model: ModelConfig) -> type:
    """The engine callable for `model.engine`."""
    if model.engine == "openai":
        return ApiPredictor
    if model.engine == "vllm":
        return VllmPredictor
    raise ConfigError(f"model.engine={model.engine!r}; choices: vllm, openai")
