"""Inference engines: vLLM in-process (one engine per Ray actor)."""
