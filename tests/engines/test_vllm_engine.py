"""The vLLM engine's settings, as far as they are pure: the environment it asks for."""

from __future__ import annotations

from longeval.config import load_config
from longeval.engines.vllm_engine import engine_env
from longeval.redaction import PUBLIC_ENV


def test_batch_invariant_asks_vllm_for_its_batch_invariant_kernels_and_stays_readable_in_records():
    assert "VLLM_BATCH_INVARIANT" not in engine_env(load_config(["model=tiny_random"]).model)
    model = load_config(["model=tiny_random", "model.batch_invariant=true"]).model
    assert engine_env(model)["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" in PUBLIC_ENV  # an engine setting, written in clear in config.yaml and records


def test_a_users_own_setting_of_the_variable_wins():
    model = load_config(["model=tiny_random", "model.batch_invariant=true", "+model.env.VLLM_BATCH_INVARIANT=0"]).model
    assert engine_env(model)["VLLM_BATCH_INVARIANT"] == "0"
