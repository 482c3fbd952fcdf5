"""Statistics over scores: summaries and effective length, anytime-valid adaptive decisions, paired comparison.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "DEPTH_BIN": "aggregate",
    "depth_grid": "aggregate",
    "ABOVE": "adaptive",
    "BELOW": "adaptive",
    "CI_BOOTSTRAP": "aggregate",
    "COLUMN_POWER": "adaptive",
    "COMPARISON_SCHEMA": "compare",
    "Comparison": "compare",
    "EFFECTIVE_LENGTH_THRESHOLD": "aggregate",
    "OVERALL": "compare",
    "Settings": "adaptive",
    "assess": "adaptive",
    "assess_group": "adaptive",
    "column_fractions": "adaptive",
    "compare_scores": "compare",
    "cumulative": "aggregate",
    "effective_length": "adaptive",
    "error_table": "aggregate",
    "group_effective_length": "adaptive",
    "headline": "aggregate",
    "ladder": "aggregate",
    "length_table": "aggregate",
    "near_threshold": "adaptive",
    "next_group_round": "adaptive",
    "next_round": "adaptive",
    "summarise": "aggregate",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
