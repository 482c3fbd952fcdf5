"""The GPU-time estimate: its arithmetic by hand, and the properties a planner relies on."""

from __future__ import annotations

import pytest

from longeval.planning.capacity import ModelArch
from longeval.planning.cost import DECODE_BANDWIDTH, PEAKS, PREFILL_MFU, call_cost

LLAMA_8B = ModelArch(num_hidden_layers=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                     num_attention_heads=32, hidden_size=4096, intermediate_size=14336, vocab_size=128256)


def test_prefill_is_parameters_plus_causal_attention_at_the_stated_mfu():
    cost = call_cost(LLAMA_8B, "a100_80gb", prompt_tokens=131072, output_tokens=0)
    p = 131072
    flops = 2 * LLAMA_8B.num_parameters() * p + 2 * (32 * 32 * 128) * p * p
    assert cost.decode_s == 0
    assert cost.prefill_s == pytest.approx(flops / (PEAKS["a100_80gb"].tflops * 1e12 * PREFILL_MFU))
    assert 20 < cost.prefill_s < 80  # a 128K prefill of an 8B model takes tens of seconds on an A100


def test_decode_alone_is_bound_by_reading_weights_and_cache():
    cost = call_cost(LLAMA_8B, "a40_48gb", prompt_tokens=1000, output_tokens=100)
    per_token = (LLAMA_8B.num_parameters() * 2 + LLAMA_8B.kv_bytes_per_token(2) * 1050) / (
        PEAKS["a40_48gb"].bandwidth_gbs * 1e9 * DECODE_BANDWIDTH)
    assert cost.decode_s == pytest.approx(100 * per_token)


def test_batching_shares_the_weight_reads_and_tensor_parallel_keeps_gpu_seconds():
    alone = call_cost(LLAMA_8B, "a100_80gb", prompt_tokens=4000, output_tokens=200)
    batched = call_cost(LLAMA_8B, "a100_80gb", prompt_tokens=4000, output_tokens=200, kv_cache_tokens=400_000)
    assert batched.decode_s < alone.decode_s / 10
    assert batched.prefill_s == alone.prefill_s
    tp2 = call_cost(LLAMA_8B, "a100_80gb", prompt_tokens=4000, output_tokens=200, tensor_parallel_size=2)
    assert tp2.gpu_seconds == pytest.approx(alone.gpu_seconds)


def test_cost_grows_faster_than_length():
    kv = 500_000  # batched decoding, as in a real sweep
    short = call_cost(LLAMA_8B, "h100_80gb", prompt_tokens=4096, output_tokens=64, kv_cache_tokens=kv).gpu_seconds
    long = call_cost(LLAMA_8B, "h100_80gb", prompt_tokens=131072, output_tokens=64, kv_cache_tokens=kv).gpu_seconds
    assert long > 32 * short  # attention makes one 128K prompt dearer than 32 of 4K
