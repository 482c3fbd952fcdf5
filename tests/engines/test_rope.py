"""The rotary embedding a checkpoint declares vs the one vLLM 0.32 builds (issue 26), without an engine."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from longeval.config import ModelConfig, load_config
from longeval.engines.rope import Rotary, check_built, check_rope_overrides, declared_rotary, vllm_rotary
from longeval.errors import ConfigError
from longeval.planning.capacity import check_runnable
from tests.rope_layouts import (
    LAYOUTS,
    QWEN_1M_YARN_LLAMA_BASE,
    QWEN_YARN,
    YARN_DOCUMENTED,
    YARN_PARAMETERS,
    YARN_WITH_THETA,
    layout_config,
)

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 2, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
LLAMA31 = Rotary("llama3", 500000.0, 8.0, 8192)
YARN_500K = Rotary("yarn", 500000.0, 4.0, 32768)


def cfg(layout: str) -> dict:
    return layout_config(TINY, layout)


@pytest.mark.parametrize("layout", ["llama31_legacy", "llama31_rope_parameters"])
def test_llama31_rope_is_read_from_either_layout(layout: str) -> None:
    assert declared_rotary(cfg(layout)) == vllm_rotary(cfg(layout)) == LLAMA31
    assert check_rope_overrides(cfg(layout), {}) == LLAMA31
    assert LLAMA31.describe() == "Llama3RotaryEmbedding(base 500000, factor 8, original 8192)"


@pytest.mark.parametrize("layout", ["llama31_legacy", "llama31_rope_parameters"])
def test_the_old_yarn_recipe_loses_the_base_and_is_refused(layout: str) -> None:
    assert declared_rotary(cfg(layout), YARN_DOCUMENTED) == YARN_500K
    assert vllm_rotary(cfg(layout), YARN_DOCUMENTED) == Rotary("yarn", 10000.0, 4.0, 32768)
    with pytest.raises(ConfigError) as err:
        check_rope_overrides(cfg(layout), YARN_DOCUMENTED)
    message = str(err.value)
    assert "\n" not in message
    assert "would build YaRNScalingRotaryEmbedding(base 10000, factor 4, original 32768)" in message
    assert "declares YaRNScalingRotaryEmbedding(base 500000, factor 4, original 32768)" in message
    assert "put rope_theta: 500000 inside model.engine_kwargs.hf_overrides.rope_scaling" in message


@pytest.mark.parametrize("overrides", [YARN_WITH_THETA, YARN_PARAMETERS])
@pytest.mark.parametrize("layout", ["llama31_legacy", "llama31_rope_parameters"])
def test_yarn_with_the_base_inside_is_accepted(layout: str, overrides: dict) -> None:
    assert vllm_rotary(cfg(layout), overrides) == declared_rotary(cfg(layout), overrides) == YARN_500K
    assert check_rope_overrides(cfg(layout), overrides) == YARN_500K


def test_qwen_1m_without_dual_chunk_attention_keeps_its_base() -> None:
    config = cfg("qwen25_1m_no_dca")
    assert check_rope_overrides(config, {}) == Rotary("default", 1e7)
    # vLLM's Qwen2 fills a missing base with 1e6, which is still not the checkpoint's 1e7
    assert vllm_rotary(config, YARN_DOCUMENTED).base == 1e6
    with pytest.raises(ConfigError, match="put rope_theta: 1e[+]07 inside"):
        check_rope_overrides(config, YARN_DOCUMENTED)


def test_ultralong_like_yarn_in_config_json_is_what_vllm_builds() -> None:
    config = cfg("ultralong_yarn")
    assert check_rope_overrides(config, {}) == Rotary("yarn", 500000.0, 128.0, 8192)


def test_a_top_level_rope_theta_override_is_refused_since_vllm_ignores_it() -> None:
    config = cfg("llama31_legacy")
    assert vllm_rotary(config, {"rope_theta": 1e6}).base == 500000.0
    with pytest.raises(ConfigError, match="ignores a top-level rope_theta override"):
        check_rope_overrides(config, {"rope_theta": 1e6})
    right = {"rope_parameters": {**LAYOUTS["llama31_legacy"]["rope_scaling"], "rope_theta": 1e6}}
    assert check_rope_overrides(config, right) == Rotary("llama3", 1e6, 8.0, 8192)


@pytest.mark.parametrize(("overrides", "says"), [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                       "rope_theta": 500000.0}}, "write rope_type: yarn"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0}},
     "no original_max_position_embeddings"),
    ({**YARN_WITH_THETA, **YARN_PARAMETERS}, "both rope_scaling and rope_parameters"),
])
def test_overrides_vllm_would_misread_are_refused(overrides: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_rope_overrides(cfg("llama31_legacy"), overrides)


def test_without_the_checkpoint_config_an_override_must_carry_its_base() -> None:
    with pytest.raises(ConfigError, match="has no rope_theta"):
        check_rope_overrides(None, YARN_DOCUMENTED)
    assert check_rope_overrides(None, YARN_WITH_THETA) is None


def test_plan_time_check_reads_config_json_and_the_preset(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(cfg("llama31_legacy")))
    model = ModelConfig(name="m", path=str(tmp_path), engine_kwargs={"hf_overrides": YARN_DOCUMENTED})
    with pytest.raises(ConfigError, match="base 10000"):
        check_runnable(model)
    check_runnable(ModelConfig(name="m", path=str(tmp_path), engine_kwargs={"hf_overrides": YARN_WITH_THETA}))
    # no config.json at hand: the preset's architecture block says the base
    preset = ModelConfig(name="m", path="/nowhere", architecture={"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}},
        engine_kwargs={"hf_overrides": YARN_DOCUMENTED})
    with pytest.raises(ConfigError, match="put rope_theta: 500000 inside"):
        check_runnable(preset)


def test_check_built_compares_class_base_and_factor() -> None:
    built = {"class": "YaRNScalingRotaryEmbedding", "base": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 32768}
    with pytest.raises(ConfigError, match=r"vLLM built YaRNScalingRotaryEmbedding\(base 10000, factor 4\)"):
        check_built(YARN_500K, [built], overrides=YARN_DOCUMENTED)
    check_built(YARN_500K, [{**built, "base": 500000.0}])


CROSS = [("llama31_legacy", {}), ("llama31_rope_parameters", {}), ("llama31_legacy", YARN_DOCUMENTED),
         ("llama31_rope_parameters", YARN_DOCUMENTED), ("llama31_legacy", YARN_WITH_THETA),
         ("llama31_rope_parameters", YARN_PARAMETERS), ("llama31_legacy", {"rope_theta": 1e6}),
         ("qwen25_1m_no_dca", {}), ("ultralong_yarn", {}), ("qwen25_1m_no_dca", YARN_DOCUMENTED),
         ("qwen25_1m_no_dca", QWEN_1M_YARN_LLAMA_BASE), ("qwen25_32k", QWEN_YARN), ("qwen25_32k", YARN_DOCUMENTED)]


def test_vllm_rotary_matches_vllms_own_config_handling(tmp_path: Path) -> None:
    """The pure prediction against vLLM 0.32's ModelConfig (config only, no engine) for every layout."""
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig as VllmModelConfig

    from longeval.engines.rope import rotary_of

    for i, (layout, overrides) in enumerate(CROSS):
        folder = tmp_path / f"{i}-{layout}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg(layout)))
        hf = VllmModelConfig(model=str(folder), tokenizer=str(folder), skip_tokenizer_init=True,
                             hf_overrides=json.loads(json.dumps(overrides)), max_model_len=2048).hf_config
        rope = dict(hf.rope_parameters)
        default = 1e6 if layout.startswith("qwen") else 10000.0
        assert rotary_of(rope, default_theta=default) == vllm_rotary(cfg(layout), overrides), (layout, overrides)


PRESETS = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "model").glob("*.yaml"))
ROPE_UNCONFIRMED = {"ultralong8b_1m": "its published config.json was not reachable (conf/model/ultralong8b_1m.yaml)"}
"""Presets with an architecture block that state no rope keys, and why."""
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")


def _architecture(preset: str) -> dict:
    return dict(load_config([f"model={preset}"]).model.architecture)


ARCH_PRESETS = [p for p in PRESETS if _architecture(p)]
ROPE_PRESETS = [p for p in ARCH_PRESETS if p not in ROPE_UNCONFIRMED]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_model_preset_passes_the_rope_check(preset: str) -> None:
    check_runnable(load_config([f"model={preset}"]).model)


@pytest.mark.parametrize("preset", ARCH_PRESETS)
def test_a_preset_with_an_architecture_block_states_its_checkpoints_rope_base(preset: str) -> None:
    """Without the weights at hand the architecture block is the checkpoint's config: it must carry the base, or a
    rope override with the wrong one would pass the check (before issue 26's leftovers, Qwen2.5-1M's did not)."""
    arch = _architecture(preset)
    if preset in ROPE_UNCONFIRMED:
        assert not any(key in arch for key in ROPE_KEYS), "a preset states no rope numbers it cannot source"
        return
    assert arch.get("rope_theta"), f"{preset}: set model.architecture.rope_theta to its config.json's"


@pytest.mark.parametrize("preset", ROPE_PRESETS)
def test_each_presets_rope_block_is_a_layout_the_engine_test_builds(preset: str) -> None:
    """tests/engines/test_rotary_embedding.py starts a real engine on every layout in LAYOUTS; each preset's rope
    keys are one of them, so each preset's rotary embedding is measured, not only predicted."""
    arch = _architecture(preset)
    mine = {key: arch.get(key) for key in ROPE_KEYS} | {"model_type": arch.get("model_type", "llama")}
    layouts = {name: {key: layout.get(key) for key in ROPE_KEYS} | {"model_type": layout.get("model_type", "llama")}
               for name, layout in LAYOUTS.items()}
    assert mine in layouts.values(), f"{preset}'s rope keys {mine} are in no layout of tests/rope_layouts.py"


@pytest.mark.parametrize("preset", ROPE_PRESETS)
def test_a_preset_alone_refuses_the_recipe_without_its_base_and_names_it(preset: str) -> None:
    """The preset alone (no config.json at /models here): the recipe without rope_theta is refused with the preset's
    own base in the fix, and passes with it. (Before, a Qwen2.5-1M preset could only say "has no rope_theta".)"""
    model = load_config([f"model={preset}"]).model
    base = float(_architecture(preset)["rope_theta"])
    with pytest.raises(ConfigError, match=re.escape(f"put rope_theta: {base:g} inside")):
        check_runnable(replace(model, engine_kwargs={"hf_overrides": YARN_DOCUMENTED}))
    right = {"rope_parameters": {**YARN_DOCUMENTED["rope_scaling"], "rope_theta": base},
             "max_position_embeddings": 131072}
    check_runnable(replace(model, engine_kwargs={"hf_overrides": right}))


def test_a_base_written_in_the_override_is_taken_as_meant() -> None:
    """A rope_theta inside the override is the user's declared base (a base change is a technique of its own), so
    the Llama recipe's 500000 copied onto Qwen2.5-1M (1e7) passes the check and is what vLLM builds: the docs
    say to copy the checkpoint's own base."""
    config = cfg("qwen25_1m_no_dca")
    assert vllm_rotary(config, QWEN_1M_YARN_LLAMA_BASE) == declared_rotary(config, QWEN_1M_YARN_LLAMA_BASE)
    assert check_rope_overrides(config, QWEN_1M_YARN_LLAMA_BASE).base == 500000.0


def test_qwen25_yarn_recipe_keeps_its_base_with_or_without_rope_theta() -> None:
    """Qwen2.5-7B-Instruct's base is vLLM's Qwen2 default (1e6), so its model card's recipe is right either way;
    the same recipe on Qwen2.5-1M (1e7) is not (test_qwen_1m_without_dual_chunk_attention_keeps_its_base)."""
    config = cfg("qwen25_32k")
    assert check_rope_overrides(config, QWEN_YARN) == Rotary("yarn", 1e6, 4.0, 32768)
    assert check_rope_overrides(config, YARN_DOCUMENTED) == Rotary("yarn", 1e6, 4.0, 32768)
