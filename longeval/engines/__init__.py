"""Inference engines: vLLM in-process (one engine per Ray actor), or an OpenAI-compatible server over HTTP.

Both are Ray Data callables with the same contract: instance rows in, prediction rows out (and written to the
run root batch by batch).
"""

from __future__ import annotations

from longeval.config import ModelConfig
from longeval.errors import ConfigError


def predictor_class(model: ModelConfig) -> type:
    """The engine callable for `model.engine`."""
    if model.engine == "openai":
        from longeval.engines.openai_compat import ApiPredictor

        return ApiPredictor
    if model.engine == "vllm":
        from longeval.engines.vllm_engine import VllmPredictor

        return VllmPredictor
    raise ConfigError(f"model.engine={model.engine!r}; choices: vllm, openai")
