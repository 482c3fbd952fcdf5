"""Jobs that build benchmark data with a model (MRCR writings pools, TAIL questions).

They call the engines through Ray Data like the pipeline does; `tasks/` stays pure (no engine, no Ray, no I/O).
"""
