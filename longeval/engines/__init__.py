"""Inference engines: vLLM in-process (one engine per Ray actor), or an OpenAI-compatible server over HTTP.

The infer stage (`longeval.stages.infer`) drives the engine `replica_engine` names (`vllm_engine.VllmEngine`, or
for scale work only the model-less `stand_in.StandInEngine`) in its own replica actors and `ApiPredictor` as a
Ray Data callable; builders use vLLM or the API through `predictor_class`, a batch of rows in, prediction rows out.
"""

from __future__ import annotations

from longeval.config import Engine, ModelConfig
from longeval.engines.openai_compat import ApiPredictor
from longeval.engines.stand_in import StandInEngine
from longeval.engines.vllm_engine import VllmEngine, VllmPredictor
from longeval.errors import ConfigError


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
