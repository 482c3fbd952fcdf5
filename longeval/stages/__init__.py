"""The stages of a run, one module each: generate, infer, score, summarise.

Each reads what the one before wrote under the run root and commits its own shards, so any of them can stop
and resume; `longeval.run.pipeline` runs them in order. Around them: `followup` (the second call of a two-call
task) and `instance_cache` (generated instances kept across runs).

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used. A stage's entry has its module's name, so it is reached through the module
(`longeval.stages.score.score`, `longeval.stages.infer.infer`); `summarise`'s is `report`."""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "DAMAGED": "instance_cache",
    "InstanceCache": "instance_cache",
    "PREFLIGHT_MAX_LENGTH": "generate",
    "PruneResult": "instance_cache",
    "RunResult": "summarise",
    "ScoringUnit": "score",
    "ShardGenerator": "generate",
    "cache_uri": "instance_cache",
    "check_cache_location": "instance_cache",
    "generate_shard": "generate",
    "make_context": "generate",
    "parents_with_followups": "followup",
    "parse_age": "instance_cache",
    "parse_size": "instance_cache",
    "path_fingerprint": "instance_cache",
    "preflight": "generate",
    "prune": "instance_cache",
    "report": "summarise",
    "rows_with_meta": "summarise",
    "run_status": "summarise",
    "score_fingerprint": "score",
    "scores_current": "score",
    "scoring_input": "score",
    "scoring_units": "score",
    "shard_key": "instance_cache",
    "summarise_root": "summarise",
    "write_followups": "followup",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
