"""GPU time of an evaluation, estimated from the model's shapes and the GPU's datasheet (a roofline model).

What a user weighs before a sweep, and what an adaptive run reports it saved: the GPU-hours of its prompts and
outputs. Prefill is compute-bound: 2 x parameters FLOPs per token plus causal attention, 2 x layers x heads x
head_dim x P^2 for a prompt of P tokens (QK^T and AV, half of each under the causal mask, 2 FLOPs per
multiply-add), at PREFILL_MFU of the GPU's dense bf16 peak. Decode is memory-bound: each step reads the weights
once for the whole batch and each sequence's KV cache, at DECODE_BANDWIDTH of the datasheet bandwidth, or is
compute-bound when that is slower. A replica of TP GPUs has TP times the FLOPs and bandwidth and costs TP GPUs.

The efficiencies are what vLLM reaches on A100s for long prompts in published measurements (40-60 % MFU in
prefill, 60-80 % of bandwidth in decode); the estimate is for planning and comparing, within a factor of about
1.5, not a promise. Shapes come from `longeval.planning.capacity.ModelArch`.
"""

from __future__ import annotations

from dataclasses import dataclass

from longeval.config import ModelConfig
from longeval.planning.capacity import ModelArch, get_gpu, kv_cache_tokens, plan_bucket

PREFILL_MFU = 0.5
DECODE_BANDWIDTH = 0.7
DECODE_MFU = 0.5
MAX_BATCH = 256
"""vLLM's max_num_seqs default: more sequences than this never decode together."""


@dataclass(frozen=True)
class GpuPeak:
    """Datasheet figures: dense bf16 tensor-core TFLOP/s (no sparsity) and memory bandwidth in GB/s."""

    tflops: float
    bandwidth_gbs: float


PEAKS: dict[str, GpuPeak] = {
    "a100_40gb": GpuPeak(312.0, 1555.0),
    "a100_80gb": GpuPeak(312.0, 2039.0),
    "a40_48gb": GpuPeak(149.7, 696.0),
    "h100_80gb": GpuPeak(989.0, 3350.0),
}
"""Keyed like `longeval.planning.capacity.GPUS` (the `cluster.gpu` presets)."""

DEFAULT_GPU = "a100_80gb"
"""The GPU an estimate is made for when the run names none (a CPU run, or cluster.gpu unset)."""


@dataclass(frozen=True)
class Cost:
    """GPU-seconds of a set of calls, split by phase."""

    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def gpu_seconds(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.prefill_s + other.prefill_s, self.decode_s + other.decode_s)


def call_cost(arch: ModelArch, gpu: str, *, prompt_tokens: int, output_tokens: int, tensor_parallel_size: int = 1,
              kv_cache_tokens: int | None = None, dtype_bytes: int = 2, kv_dtype_bytes: int = 2) -> Cost:
    """GPU-seconds of one call: its prefill, and its share of the decode steps it takes part in.

    The batch it decodes in is as many sequences of its size as the replica's KV cache holds
    (`kv_cache_tokens`, from the planner), at most MAX_BATCH; unknown capacity means a batch of one
    (the worst case).
    """
    peak = PEAKS[gpu]
    tp = tensor_parallel_size
    flops_s = peak.tflops * 1e12 * tp
    bytes_s = peak.bandwidth_gbs * 1e9 * tp
    params = arch.num_parameters()
    attn_width = arch.num_hidden_layers * (arch.num_attention_heads or arch.num_key_value_heads) * arch.head_dim
    p = float(prompt_tokens)
    prefill_flops = 2 * params * p + 2 * attn_width * p * p
    prefill = prefill_flops / (flops_s * PREFILL_MFU)

    sequence = max(1, prompt_tokens + output_tokens)
    batch = max(1, min(MAX_BATCH, (kv_cache_tokens or sequence) // sequence))
    kv_per_token = arch.kv_bytes_per_token(kv_dtype_bytes)
    mean_context = p + output_tokens / 2
    weights = params * dtype_bytes
    read_s = (weights / batch + kv_per_token * mean_context) / (bytes_s * DECODE_BANDWIDTH)
    compute_s = (2 * params + 4 * attn_width * mean_context) / (flops_s * DECODE_MFU)
    decode = output_tokens * max(read_s, compute_s)
    return Cost(prefill_s=prefill * tp, decode_s=decode * tp)


def replica_shape(arch: ModelArch, gpu: str, model: ModelConfig, length: int, *, num_gpus: int,
                  gpus_per_node: int) -> tuple[int, int | None]:
    """The tensor-parallel size and KV-cache tokens the planner gives a replica for sequences of `length`."""
    placement = plan_bucket(arch, get_gpu(gpu), model=model, max_model_len=length, num_gpus=num_gpus,
                            gpus_per_node=gpus_per_node)
    return placement.tensor_parallel_size, kv_cache_tokens(model, placement=placement)
