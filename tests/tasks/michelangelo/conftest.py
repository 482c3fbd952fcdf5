"""Session fixtures: the real SmolLM2 tokenizer and one generation context, so the filler blocks and the
MRCR writing pool are encoded once for the whole folder, and each (task, length) is drafted once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from longeval.tasks.base import Draft, GenContext
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder
from tests.tasks.michelangelo.mich_helpers import SPECS, make


@pytest.fixture(scope="session")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="session")
def ctx(encoder: Encoder) -> GenContext:
    return GenContext(encoder=encoder, fmt=PromptFormat())


@pytest.fixture(scope="session")
def drafts(ctx: GenContext) -> Callable[[str, int, int], list[Draft]]:
    """Drafts 0..n-1 of a (task, length), generated once per session."""
    cache: dict[tuple[str, int], list[Draft]] = {}

    def get(name: str, length: int, n: int) -> list[Draft]:
        have = cache.setdefault((name, length), [])
        have.extend(make(ctx, SPECS[name], length, i) for i in range(len(have), n))
        return have[:n]

    return get
