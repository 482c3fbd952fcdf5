"""Test environment: offline, repo-local caches, and the model folders built once per session.

Environment variables are set at import, before any test module imports transformers or vLLM, because
both read them at import time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SCRATCH_PARENT = REPO / ".cache" / "tmp"
_STALE_AFTER_S = 24 * 3600


def _scratch_tmpdir() -> Path:
    """A fresh temp folder per session: vLLM leaves ZMQ socket files in the temp dir, so keep them here.

    Folders of earlier sessions older than a day are removed; recent ones may belong to a parallel run.
    """
    _SCRATCH_PARENT.mkdir(parents=True, exist_ok=True)
    for old in _SCRATCH_PARENT.glob("session-*"):
        try:
            if time.time() - old.stat().st_mtime > _STALE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return Path(tempfile.mkdtemp(prefix="session-", dir=_SCRATCH_PARENT))


os.environ["TMPDIR"] = str(_scratch_tmpdir())
tempfile.tempdir = None  # forget any temp dir computed before TMPDIR was set
os.environ.setdefault("LONGEVAL_CACHE", str(REPO / ".cache"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The packaged SmolLM2-135M-Instruct as a Hugging Face folder (converted on the first run, ~25 s)."""
    from longeval.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def tiny_model_path(smollm2_path: Path) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, for plumbing tests (its output is junk)."""
    from longeval.models import build_tiny_model

    return build_tiny_model()
