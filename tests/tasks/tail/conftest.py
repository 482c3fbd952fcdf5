"""Fixtures of the TAIL tests: the real SmolLM2 tokenizer, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.tasks.base import GenContext
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder


@pytest.fixture(scope="session")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture
def ctx(encoder: Encoder) -> GenContext:
    """A fresh context per test: its cache holds the parsed benchmark, which tests write anew."""
    return GenContext(encoder=encoder, fmt=PromptFormat())
