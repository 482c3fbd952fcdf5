"""Before running: shards and inference pools, GPU capacity, the suite's sizing and its GPU cost.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "Cost": "cost",
    "DECODE_BANDWIDTH": "cost",
    "DEFAULT_GPU": "cost",
    "GPUS": "capacity",
    "ModelArch": "capacity",
    "PEAKS": "cost",
    "PREFILL_MFU": "cost",
    "Plan": "plan",
    "PlanKey": "plan",
    "Pool": "plan",
    "ShardSpec": "plan",
    "TaskFigures": "sizing",
    "adaptive_threshold": "plan",
    "call_cost": "cost",
    "check_config": "plan",
    "check_runnable": "capacity",
    "figures_for": "sizing",
    "find_model_arch": "capacity",
    "format_bytes": "capacity",
    "in_plan": "plan",
    "kv_cache_dtype_bytes": "capacity",
    "kv_cache_tokens": "capacity",
    "make_plan": "plan",
    "planned_keys": "plan",
    "print_plan": "view",
    "replica_shape": "cost",
    "samples_per_length": "plan",
    "size_pool": "plan",
    "size_suite": "sizing",
    "suite_seq_tokens": "plan",
    "task_figures": "sizing",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
