"""Run roots on local disk or S3: locations, shards and their commit records, compaction and the one-writer lease.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "CopiedShard": "run_root",
    "ENDPOINT_ENV_VARS": "location",
    "Elsewhere": "run_root",
    "FOOTER_METADATA": "run_root",
    "Holder": "lease",
    "LEGACY_STAGES": "run_root",
    "Location": "location",
    "ORPHANS": "shards",
    "PROMPT_GROUP_BYTES": "run_root",
    "RunRoot": "run_root",
    "ShardName": "shards",
    "StoredShard": "run_root",
    "WHOLE_READ_BYTES": "run_root",
    "acquire": "lease",
    "bulky_last": "run_root",
    "claim_name": "lease",
    "compact_predictions": "compact",
    "compacted_prefix": "shards",
    "current": "lease",
    "default_patience": "location",
    "filesystem": "location",
    "fingerprint": "location",
    "footer_metadata": "run_root",
    "held_generation": "lease",
    "is_transient": "location",
    "list_files": "location",
    "prompt_group_bytes": "run_root",
    "read_uri": "location",
    "rows_per_group": "run_root",
    "s3_endpoint_from_env": "location",
    "shard_prefixes": "compact",
    "stat": "location",
    "superseded": "lease",
    "write_uri": "location",
    "writer_warning": "lease",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
