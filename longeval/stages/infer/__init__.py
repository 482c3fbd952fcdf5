"""The infer stage: every instance without a final prediction through its length bucket's engine pool.

One module a job: `stage` (the stage's entry, `infer`, and the pool's schedule), `pending` (what is left to run),
`placement` (placement groups and the live pools, `Engines`), `replica` (the replica actor), `reader` (its prompt
reader), `writer` (its prediction writer), `drivers` (static and dynamic dispatch, restarts), `failures` (what a
replica died of), `dispatch` (which replica runs which prompt: pure), `speeds` (how fast each replica runs: pure)
and `api` (models behind an HTTP API).

The names below are the package's public surface; each lives in the module named beside it and is imported
when first used (so a Ray worker that unpickles a `WorkQueue` or a `Replica` imports only what that class needs).
"""

from longeval._lazy import lazy_exports

_EXPORTS = {
    "META_COLUMNS": "pending",
    "REASK_S": "replica",
    "RELEASE_BEFORE_TOKENS": "reader",
    "RESERVE_CPUS": "placement",
    "ApiWriter": "api",
    "Engines": "placement",
    "PoolReplicas": "placement",
    "PredictionWriter": "writer",
    "PromptReader": "reader",
    "Replica": "replica",
    "actor_options": "placement",
    "bundles": "placement",
    "cause_of": "failures",
    "engine_redactor": "replica",
    "final_ids": "pending",
    "first_calls": "stage",
    "has_room": "placement",
    "infer": "stage",
    "kept_engines": "placement",
    "pending_predictions": "pending",
    "pool_shards": "stage",
    "record_too_long": "stage",
    "release_engines": "placement",
    "schedule": "stage",
    "size_pool": "placement",
    "stop_on_fatal": "failures",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
