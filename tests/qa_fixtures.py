"""Fixtures of the synthetic SQuAD v2.0 and HotpotQA files RULER's QA tasks read (`longeval.tasks.ruler.samples`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.tasks.ruler.samples import write_hotpotqa, write_squad

__all__ = ["hotpotqa_file", "squad_file", "write_hotpotqa", "write_squad"]


@pytest.fixture(scope="session")
def squad_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic SQuAD v2.0 dev file large enough for qa_1 at 4096 tokens (~300 paragraphs)."""
    return write_squad(tmp_path_factory.mktemp("qa") / "dev-v2.0.json", n_articles=30, paragraphs=10)


@pytest.fixture(scope="session")
def hotpotqa_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic HotpotQA dev distractor file (30 questions x 10 paragraphs)."""
    return write_hotpotqa(tmp_path_factory.mktemp("qa") / "hotpot_dev_distractor_v1.json")
