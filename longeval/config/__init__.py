"""The run configuration: the schema, loading Hydra overrides with clear errors, the checks, and redaction of secrets.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "ADAPTIVE_SHARD_SIZE": "schema",
    "ApiConfig": "schema",
    "ApiMode": "schema",
    "Config": "schema",
    "Dispatch": "schema",
    "Engine": "schema",
    "GROUP_SHARD_SIZE": "schema",
    "HIDDEN": "redaction",
    "ModelConfig": "schema",
    "PUBLIC_ENV": "redaction",
    "Redactor": "redaction",
    "SCHEDULE_BEFORE": "schema",
    "SHARD_SIZE": "schema",
    "StoreConfig": "schema",
    "check_api": "validation",
    "conf_dir": "load",
    "conform": "validation",
    "group_choices": "load",
    "is_secret_name": "redaction",
    "load_config": "load",
    "redacted_logs": "redaction",
    "redactor": "validation",
    "suite_hash": "schema",
    "to_yaml": "validation",
    "validate": "validation",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
