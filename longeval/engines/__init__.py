"""Inference engines: vLLM in-process (one engine per Ray actor), or an OpenAI-compatible server over HTTP.

The infer stage (`longeval.stages.infer`) drives the engine `replica_engine` names (`vllm_engine.VllmEngine`, or
for scale work only the model-less `stand_in.StandInEngine`) in its own replica actors and `ApiPredictor` as a
Ray Data callable; builders use vLLM or the API through `predictor_class`, a batch of rows in, prediction rows out.
Around them: `models` (model folders: paths, aliases, the packaged and tiny test models) and `rope` (the rotary
embedding a checkpoint declares, checked against what vLLM builds).

The names in `__all__` are the package's public surface (vLLM itself is imported only when an engine starts).
"""

from __future__ import annotations

from longeval.config import Engine, ModelConfig
from longeval.engines.models import build_tiny_model, built_model_dir, prepare_smollm2, resolve_model_path
from longeval.engines.openai_compat import ApiPredictor
from longeval.engines.rope import Rotary, check_rope_overrides, checkpoint_theta, text_config
from longeval.engines.stand_in import StandInEngine
from longeval.engines.vllm_engine import Partial, Request, VllmEngine, VllmPredictor
from longeval.errors import ConfigError

__all__ = [
    "ApiPredictor",
    "Partial",
    "Request",
    "Rotary",
    "StandInEngine",
    "VllmEngine",
    "VllmPredictor",
    "build_tiny_model",
    "built_model_dir",
    "check_rope_overrides",
    "checkpoint_theta",
    "predictor_class",
    "prepare_smollm2",
    "replica_engine_class",
    "resolve_model_path",
    "text_config",
]


def predictor_class(model: ModelConfig) -> type:
    """The engine callable for `model.engine`."""
    if model.engine == Engine.openai:
        return ApiPredictor
    if model.engine == Engine.vllm:
        return VllmPredictor
    if model.engine == Engine.stand_in:
        raise ConfigError("model.engine=stand_in serves the infer stage only (scale work): builders need a model, "
                          "model.engine=vllm or openai")
    raise ConfigError(f"model.engine={model.engine!r}; choices: vllm, openai")


def replica_engine_class(model: ModelConfig) -> type[VllmEngine] | type[StandInEngine]:
    """The engine a replica actor runs for `model.engine`: vLLM, unless the stand-in is asked for by name."""
    return StandInEngine if model.engine == Engine.stand_in else VllmEngine
