"""A vLLM worker extension that reports the rotary embeddings the engine built.

vLLM mixes this class into its worker (`worker_extension_cls`), so `LLM.collective_rpc` can call the method by
name on every worker: in-process, in vLLM's engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=1) and on
tensor-parallel ranks alike, without sending a pickled function (which vLLM refuses unless
VLLM_ALLOW_INSECURE_SERIALIZATION=1). Kept tiny and import-light: every worker imports it.
"""

from __future__ import annotations

from typing import Any

from longeval.engines.rope import built_rotaries

ROTARY_PROBE = "longeval.engines.rotary_probe.RotaryProbe"
"""The `worker_extension_cls` value."""


class RotaryProbe:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def longeval_rotary_embeddings(self) -> list[dict[str, Any]]:
        """The distinct rotary embeddings of this worker's model (class, base, scaling factor, original length)."""
        return built_rotaries(self.get_model())  # type: ignore[attr-defined]
