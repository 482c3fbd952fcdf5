"""Jobs that build benchmark data with a model (MRCR writings pools, TAIL questions).

They call the engines through Ray Data like the pipeline does; `tasks/` stays pure (no engine, no Ray, no I/O).
`complete` runs a model over chat requests, `embed` embeds text for TAIL's retrieval check, `mrcr_pool` builds
Michelangelo MRCR's writings pool and `tail_build` a TAIL dataset from the user's documents.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used (so `longeval --help` loads no Ray). The module `complete` and its function of that name are
reached as `longeval.builders.complete.complete`."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "BuildResult": "tail_build",
    "Completer": "complete",
    "Embedder": "embed",
    "POOL_SCHEMA": "mrcr_pool",
    "Request": "complete",
    "build_pool": "mrcr_pool",
    "build_tail": "tail_build",
    "minilm_path": "embed",
    "pool_requests": "mrcr_pool",
    "render_requests": "complete",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
