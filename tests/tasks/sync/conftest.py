"""Fixtures of the SYNC tests: the real SmolLM2 tokenizer, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.tasks.base import GenContext
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder


@pytest.fixture(scope="session")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="session")
def ctx(encoder: Encoder) -> GenContext:
    return GenContext(encoder=encoder, fmt=PromptFormat())
