"""Fixtures of the LongBench v2 tests: the real SmolLM2 tokenizer, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.text.tokenizer import Encoder, load_encoder


@pytest.fixture(scope="session")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))
