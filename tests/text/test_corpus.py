"""The haystack corpora: the pinned default, user folders of .txt files, and the noise sentences."""

from __future__ import annotations

from pathlib import Path

import pytest

from longeval.errors import DataFileError
from longeval.text.corpus import (
    MAX_UNIT_WORDS,
    NOISE,
    _make,
    comparable_with_ruler,
    load_essays,
    noise_sentences,
    split_sentences,
    split_units,
)


def test_default_corpus_is_pinned_and_large() -> None:
    first = load_essays()
    again = load_essays.__wrapped__()  # bypass the cache: a real second load
    assert first is not again
    assert first.fingerprint == again.fingerprint
    assert first.sentences == again.sentences
    assert first.name == "pydoc_data.topics (not RULER's)" and not comparable_with_ruler(first.name)
    assert first.words > 50_000
    assert len(first.fingerprint) == 16
    assert all(s.startswith(" ") and s.strip() for s in first.sentences)
    assert max(len(s.split()) for s in first.sentences) <= MAX_UNIT_WORDS


def test_folder_is_read_in_sorted_order(tmp_path: Path) -> None:
    folder = tmp_path / "essays"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("Second file here. It has two sentences.", encoding="utf-8")
    (folder / "a.txt").write_text("First file.\n\nIt  is   spaced\noddly!", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text("Third, in a subfolder?", encoding="utf-8")
    (folder / "notes.md").write_text("Not an essay.", encoding="utf-8")
    corpus = load_essays(str(folder))
    assert corpus.sentences == (
        " First file.", " It is spaced oddly!", " Second file here.", " It has two sentences.",
        " Third, in a subfolder?",
    )
    assert corpus.words == 17
    assert corpus.name == f"{folder} (user folder)" and not comparable_with_ruler(corpus.name)
    # Same content in another folder: same fingerprint; changed content: a different one.
    twin = tmp_path / "twin"
    twin.mkdir()
    for f in ("a.txt", "b.txt"):
        (twin / f).write_text((folder / f).read_text(encoding="utf-8"), encoding="utf-8")
    (twin / "c.txt").write_text("Third, in a subfolder?", encoding="utf-8")
    assert load_essays(str(twin)).fingerprint == corpus.fingerprint
    (twin / "c.txt").write_text("Third, changed.", encoding="utf-8")
    assert load_essays.__wrapped__(str(twin)).fingerprint != corpus.fingerprint


@pytest.mark.parametrize("kind", ["empty", "missing", "only-other-files"])
def test_unusable_folder_names_the_setting(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / kind
    if kind != "missing":
        folder.mkdir()
    if kind == "only-other-files":
        (folder / "essay.md").write_text("Markdown is not read.", encoding="utf-8")
    with pytest.raises(DataFileError, match="no .txt files") as info:
        load_essays(str(folder))
    assert str(folder) in str(info.value)
    assert "essay_dir" in str(info.value)


def test_unusable_folder_names_the_real_config_key(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"suite\.data\.essay_dir"):
        load_essays(str(tmp_path))


def test_long_sentences_are_cut_into_units() -> None:
    text = " ".join(f"w{i}" for i in range(2 * MAX_UNIT_WORDS + 5)) + ". Next."
    units = split_sentences(text)
    assert [len(u.split()) for u in units] == [MAX_UNIT_WORDS, MAX_UNIT_WORDS, 5, 1]
    assert "".join(units).split() == text.split()


def test_units_say_which_begin_a_sentence() -> None:
    """Needles go only before a sentence's first unit, never between the word chunks of a long one."""
    text = "Short one. " + " ".join(f"w{i}" for i in range(MAX_UNIT_WORDS + 3)) + "! Why? Done"
    units = split_units(text)
    assert [start for _, start in units] == [True, True, False, True, True]
    assert [u for u, _ in units] == split_sentences(text)
    corpus = _make("x", [text])
    assert corpus.starts == (True, True, False, True, True) and len(corpus.starts) == len(corpus.sentences)


def test_noise_sentences_are_rulers() -> None:
    assert NOISE == "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    units = noise_sentences()
    assert len(units) == 5
    assert "".join(units).strip() == NOISE
