"""The rotary embedding vLLM builds, read from the live engine, for each preset's config.json layout (issue 26).

A tiny random Llama (or Qwen2) with each layout's rope keys; one short engine per case (about 10 s in-process).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longeval.config import ModelConfig
from longeval.engines.vllm_engine import VllmEngine
from longeval.errors import ConfigError
from tests.rope_layouts import QWEN_YARN, YARN_DOCUMENTED, YARN_WITH_THETA, layout_model

pytestmark = [pytest.mark.engine]

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def start(tiny: Path, tmp_path: Path, layout: str, overrides: dict | None = None,
          env: dict[str, str] = IN_PROCESS) -> VllmEngine:
    folder = layout_model(tiny, layout, tmp_path / layout)
    model = ModelConfig(name=f"tiny-{layout}", path=str(folder), dtype="float32", enforce_eager=True,
                        engine_kwargs={"hf_overrides": overrides} if overrides else {}, env=env)
    return VllmEngine(model, str(folder), 2048)


def test_the_old_yarn_recipe_is_recorded_with_base_10000_and_refused(tiny_model_path: Path, tmp_path: Path) -> None:
    engine = start(tiny_model_path, tmp_path, "llama31_legacy", YARN_DOCUMENTED)
    try:
        record = engine.info["rotary_embedding"]
        assert record["built"] == [{"class": "YaRNScalingRotaryEmbedding", "base": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32768}]
        assert record["declared"]["base"] == 500000.0
        with pytest.raises(ConfigError, match=r"vLLM built YaRNScalingRotaryEmbedding\(base 10000, factor 4\) .*"
                                              r"put rope_theta: 500000 inside"):
            engine.check_rotary()
    finally:
        engine.shutdown()


def test_yarn_with_the_base_inside_is_built_with_it_in_a_separate_engine_process(
        tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the engine core in its own process
    engine = start(tiny_model_path, tmp_path, "llama31_rope_parameters", YARN_WITH_THETA)
    try:
        assert engine.info["rotary_embedding"]["built"] == [
            {"class": "YaRNScalingRotaryEmbedding", "base": 500000.0, "factor": 4.0,
             "original_max_position_embeddings": 32768}]
        engine.check_rotary()
    finally:
        engine.shutdown()


@pytest.mark.parametrize(("layout", "built"), [
    ("llama31_legacy", {"class": "Llama3RotaryEmbedding", "base": 500000.0, "factor": 8.0,
                        "original_max_position_embeddings": 8192}),
    ("qwen25_1m_no_dca", {"class": "RotaryEmbedding", "base": 1e7, "factor": None,
                          "original_max_position_embeddings": None}),
    ("ultralong_yarn", {"class": "YaRNScalingRotaryEmbedding", "base": 500000.0, "factor": 128.0,
                        "original_max_position_embeddings": 8192}),
])
def test_each_preset_layout_is_built_as_declared(tiny_model_path: Path, tmp_path: Path, layout: str,
                                                 built: dict) -> None:
    engine = start(tiny_model_path, tmp_path, layout)
    try:
        record = engine.info["rotary_embedding"]
        assert record["built"] == [built]
        assert record["declared"]["class"] == built["class"] and record["declared"]["base"] == built["base"]
        engine.check_rotary()
    finally:
        engine.shutdown()


def test_qwen_1m_with_the_recipe_without_its_base_is_built_with_qwen2s_default_and_refused(
        tiny_model_path: Path, tmp_path: Path) -> None:
    """The preset's layout (rope_theta 1e7, no dual chunk attention) with a rope dict lacking the base: vLLM's Qwen2
    fills 1e6, not the checkpoint's 1e7, and fills it into the dict it was given (before, that made the engine's
    declaration read 1e6 too, and the check pass)."""
    engine = start(tiny_model_path, tmp_path, "qwen25_1m_no_dca", YARN_DOCUMENTED)
    try:
        record = engine.info["rotary_embedding"]
        assert record["built"] == [{"class": "YaRNScalingRotaryEmbedding", "base": 1e6, "factor": 4.0,
                                    "original_max_position_embeddings": 32768}]
        assert record["declared"]["base"] == 1e7
        # vLLM wrote 1e6 into the rope dict it was given; the record keeps the user's override as written
        assert engine.info["kwargs"]["hf_overrides"] == YARN_DOCUMENTED
        with pytest.raises(ConfigError, match=r"base 1e\+06.*put rope_theta: 1e\+07 inside"):
            engine.check_rotary()
    finally:
        engine.shutdown()


def test_qwen25_yarn_recipe_is_built_with_its_base(tiny_model_path: Path, tmp_path: Path) -> None:
    """Qwen2.5-7B-Instruct's layout (32K, base 1e6) with its model card's YaRN x4 and the base inside."""
    engine = start(tiny_model_path, tmp_path, "qwen25_32k", QWEN_YARN)
    try:
        assert engine.info["rotary_embedding"]["built"] == [
            {"class": "YaRNScalingRotaryEmbedding", "base": 1e6, "factor": 4.0,
             "original_max_position_embeddings": 32768}]
        engine.check_rotary()
    finally:
        engine.shutdown()


def test_an_engine_puts_back_the_environment_it_changed(tiny_model_path: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its `model.env` lasts as long as the engine: a later engine or subprocess of this process sees none of it.
    The model's own OMP_NUM_THREADS wins over the one Ray sets in an actor."""
    for key in IN_PROCESS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in a one-CPU actor; the engine drops it on CPU
    env = {**IN_PROCESS, "OMP_NUM_THREADS": "2"}
    engine = start(tiny_model_path, tmp_path, "llama31_legacy", env=env)
    try:
        assert engine.info["env"] == env
        assert engine.info["omp_num_threads"] == "2"
    finally:
        engine.shutdown()
    assert {key: os.environ.get(key) for key in IN_PROCESS} == {key: None for key in IN_PROCESS}
    assert os.environ.get("OMP_NUM_THREADS") == "1"
