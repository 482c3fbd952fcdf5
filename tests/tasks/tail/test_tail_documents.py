"""Reading a documents folder: composition order, whitespace, 600-word segments, PDFs and every error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from longeval.errors import DataFileError
from longeval.tasks.tail import SEGMENT_WORDS, compose, load_domains, normalise, segment
from tests.tasks.tail.tail_helpers import make_pdf, report

try:
    import pypdf  # noqa: F401

    HAVE_PYPDF = True
except ImportError:
    HAVE_PYPDF = False

needs_pypdf = pytest.mark.skipif(not HAVE_PYPDF, reason="pypdf is not installed in .venv (pip install pypdf)")


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_normalise_makes_one_run_of_words() -> None:
    assert normalise("  a\tb\n\n c\r\nd\u00a0e\x00f \ufb01ne ") == "a b c d e f fine"
    assert normalise("\n \t") == ""


def test_segment_cuts_600_words_and_keeps_a_short_last_one() -> None:
    words = [f"w{i}" for i in range(1300)]
    parts = segment(" ".join(words))
    assert [len(p.split(" ")) for p in parts] == [600, 600, 100]
    assert " ".join(parts) == " ".join(words)
    assert segment("") == ()
    with pytest.raises(ValueError):
        segment("a b", 0)


def test_compose_sorts_sources_and_skips_empty_ones() -> None:
    domain = compose("law", [("b.txt", "second  text"), ("a.md", "first\ntext"), ("c.txt", "  \n")])
    assert domain.sources == ("a.md", "b.txt")
    assert domain.text == "first text second text"
    assert compose("law", [("a.md", "first\ntext"), ("b.txt", "second text")]).fingerprint == domain.fingerprint
    assert compose("other", [("a.md", "first\ntext"), ("b.txt", "second text")]).fingerprint != domain.fingerprint


def test_folder_of_domains_is_read_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path / "finance" / "2_second.md", "# Second\n\n" + report("fin-b", 40))
    write(tmp_path / "finance" / "1_first.txt", report("fin-a", 40))
    write(tmp_path / "finance" / "notes.csv", "ignored,file")
    write(tmp_path / "finance" / ".hidden.txt", "ignored")
    write(tmp_path / "patent" / "p.txt", report("pat", 70))
    write(tmp_path / ".git" / "x.txt", "ignored folder")
    domains = load_domains(str(tmp_path))
    assert [d.name for d in domains] == ["finance", "patent"]
    finance = domains[0]
    assert finance.sources == ("1_first.txt", "2_second.md")
    assert finance.text == normalise(report("fin-a", 40) + " # Second " + report("fin-b", 40))
    assert all(len(s.split(" ")) == SEGMENT_WORDS for s in finance.segments[:-1])
    assert 0 < finance.word_counts[-1] <= SEGMENT_WORDS
    assert finance.words == len(finance.text.split(" "))
    assert load_domains(f"file://{tmp_path}")[1].fingerprint == domains[1].fingerprint


def test_segment_size_is_an_option(tmp_path: Path) -> None:
    write(tmp_path / "d" / "a.txt", " ".join(f"w{i}" for i in range(25)))
    assert load_domains(str(tmp_path), segment_words=10)[0].word_counts == (10, 10, 5)


@needs_pypdf
def test_pdf_text_layer_is_read(tmp_path: Path) -> None:
    write(tmp_path / "paper" / "a.pdf", make_pdf(["Alpha report (page one) says 42.", "Beta page two."]))
    write(tmp_path / "paper" / "b.txt", "Closing text.")
    domain = load_domains(str(tmp_path))[0]
    assert domain.sources == ("a.pdf", "b.txt")
    assert "Alpha report (page one) says 42." in domain.text and "Beta page two." in domain.text
    assert domain.text.endswith("Closing text.")


@needs_pypdf
def test_damaged_pdf_is_named(tmp_path: Path) -> None:
    bad = write(tmp_path / "paper" / "broken.pdf", b"%PDF-1.4\nthis is not a pdf body")
    with pytest.raises(DataFileError, match=r"broken\.pdf.*not a readable PDF"):
        load_domains(str(tmp_path))
    bad.write_bytes(b"not even a header")
    with pytest.raises(DataFileError, match=r"broken\.pdf"):
        load_domains(str(tmp_path))


def test_pdf_without_pypdf_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf now raises ImportError
    write(tmp_path / "paper" / "a.pdf", make_pdf(["text"]))
    with pytest.raises(DataFileError, match=r"a\.pdf.*pip install pypdf"):
        load_domains(str(tmp_path))


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="not found"):
        load_domains(str(tmp_path / "nowhere"))
    with pytest.raises(DataFileError, match="is not set"):
        load_domains("")
    write(tmp_path / "file.txt", "x")
    with pytest.raises(DataFileError, match="is a file"):
        load_domains(str(tmp_path / "file.txt"))


def test_no_domains_points_at_loose_files(tmp_path: Path) -> None:
    write(tmp_path / "report.txt", "text")
    with pytest.raises(DataFileError, match=r"no domain subfolders; found 1 file\(s\) directly in it \(report\.txt\)"):
        load_domains(str(tmp_path))
    (tmp_path / "report.txt").unlink()
    with pytest.raises(DataFileError, match="no domain subfolders"):
        load_domains(str(tmp_path))


def test_domain_without_readable_documents_is_named(tmp_path: Path) -> None:
    write(tmp_path / "good" / "a.txt", "words here")
    write(tmp_path / "legal" / "scan.docx", b"PK")
    expected = r"domain 'legal'.*no readable documents.*no \.txt, \.md or \.pdf.*scan\.docx"
    with pytest.raises(DataFileError, match=expected):
        load_domains(str(tmp_path))
    (tmp_path / "legal" / "scan.docx").unlink()
    write(tmp_path / "legal" / "empty.txt", " \n\t ")
    with pytest.raises(DataFileError, match=r"domain 'legal'.*hold no text"):
        load_domains(str(tmp_path))


def test_non_utf8_text_is_named(tmp_path: Path) -> None:
    write(tmp_path / "d" / "latin.txt", "caf\xe9".encode("latin-1"))
    with pytest.raises(DataFileError, match=r"latin\.txt.*not UTF-8"):
        load_domains(str(tmp_path))
