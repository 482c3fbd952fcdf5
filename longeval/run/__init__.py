"""A run end to end: the pipeline over the stages, adaptive rounds, asked positions, provenance and the consistency
of what a run root holds.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "ASKED_FILE": "asked",
    "CELL_SCHEMA": "adaptive_rounds",
    "COMPARED_SETTINGS": "provenance",
    "COMPARED_VERSIONS": "provenance",
    "Cell": "adaptive_rounds",
    "Consistency": "consistency",
    "EXIT_CODES": "consistency",
    "GROUP_SCHEMA": "adaptive_rounds",
    "LENGTH_SCHEMA": "adaptive_rounds",
    "PARTIAL_EXIT": "consistency",
    "RUN_SETTINGS": "provenance",
    "SUMMARY_INPUT": "consistency",
    "State": "consistency",
    "adaptive_tables": "adaptive_rounds",
    "ask": "asked",
    "asked_shards": "asked",
    "check_consistency": "consistency",
    "check_root": "consistency",
    "check_same_config": "provenance",
    "older_default_root": "provenance",
    "only_asked": "asked",
    "planned_ids": "consistency",
    "prediction_fingerprints": "consistency",
    "read_asked": "asked",
    "read_cells": "adaptive_rounds",
    "round_shards": "adaptive_rounds",
    "run": "pipeline",
    "run_identity": "provenance",
    "run_rounds": "adaptive_rounds",
    "scores_digest": "consistency",
    "seed_asked": "asked",
    "settings_for": "adaptive_rounds",
    "stored_config": "provenance",
    "summaries_current": "consistency",
    "target_groups": "adaptive_rounds",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
