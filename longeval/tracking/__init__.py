"""Experiment tracking: Weights & Biases runs and the dashboards defined as code.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "INSTANCE_COLUMNS": "payloads",
    "RESULT_TABLES": "keys",
    "create": "dashboards",
    "summary_metrics": "payloads",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
