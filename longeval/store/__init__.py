"""Run roots on local disk or S3: locations, shards and their commit records, compaction and the one-writer lease.

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "CopiedShard": "commits",
    "ENDPOINT_ENV_VARS": "s3",
    "Elsewhere": "listings",
    "FOOTER_METADATA": "shard_format",
    "Holder": "lease",
    "LEGACY_STAGES": "commits",
    "Location": "location",
    "ORPHANS": "shards",
    "PROMPT_GROUP_BYTES": "row_group_reads",
    "RunRoot": "run_root",
    "ShardName": "shards",
    "StoredShard": "listings",
    "WHOLE_READ_BYTES": "row_group_reads",
    "acquire": "lease",
    "bulky_last": "shard_format",
    "claim_name": "lease",
    "compact_predictions": "compact",
    "compacted_prefix": "shards",
    "current": "lease",
    "default_patience": "s3",
    "filesystem": "location",
    "fingerprint": "location",
    "footer_metadata": "shard_format",
    "held_generation": "lease",
    "is_transient": "s3",
    "list_files": "location",
    "prompt_group_bytes": "row_group_reads",
    "read_uri": "location",
    "rows_per_group": "shard_format",
    "s3_endpoint_from_env": "s3",
    "shard_prefixes": "compact",
    "stat": "location",
    "superseded": "lease",
    "write_uri": "location",
    "writer_warning": "lease",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
