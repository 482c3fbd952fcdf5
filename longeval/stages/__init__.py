"""The stages of a run, one module each: generate, infer, score, summarise.

Each reads what the one before wrote under the run root and commits its own shards, so any of them can stop
and resume; `longeval.run.pipeline` runs them in order.
"""
