"""The user's documents, composed into one long document per domain and cut into 600-word segments (TAIL §3.1, §3.2).

Layout: `<root>/<domain>/*.txt|*.md|*.pdf`, on local disk, as `file://` or as `s3://bucket/prefix` (read through
pyarrow's filesystem layer). Each domain's documents are concatenated in sorted file-name order, so the same folder
always gives the same long document; whitespace is normalised so the composed text is a plain run of words, and the
words are cut into segments of `SEGMENT_WORDS` (the paper's "paragraphs"; the last one may be shorter). PDFs need
`pypdf`, imported only when a PDF is read.

Everything here fails with a `DataFileError` that names the folder or file and what to do.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from longeval.errors import DataFileError, StoreError
from longeval.store.location import filesystem

SEGMENT_WORDS = 600
"""§3.2: segments of 600 words carry enough information for one question."""
SUFFIXES = (".txt", ".md", ".pdf")
"""The document types read; other files in a domain folder are ignored (and listed when nothing is readable)."""
ROOT_KEY = "the TAIL documents folder"
"""What errors call the folder unless the caller names its own setting."""
LAYOUT = "one subfolder per domain holding .txt, .md or .pdf files, e.g. <root>/finance/report_2024.pdf"

_LIGATURES = re.compile("[\ufb00-\ufb06]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\u200b\ufeff]")


@dataclass(frozen=True)
class Domain:
    """One domain's composed document, cut into segments, and where it came from."""

    name: str
    """The domain folder's name (e.g. "finance")."""
    segments: tuple[str, ...]
    """The composed document in segments of `SEGMENT_WORDS` words, single-spaced, without leading spaces."""
    sources: tuple[str, ...]
    """The documents composed, by file name, in composition order."""
    fingerprint: str
    """A hash of the name, the sources and the segments: two builds from the same text agree."""

    @property
    def word_counts(self) -> tuple[int, ...]:
        return tuple(len(s.split(" ")) for s in self.segments)

    @property
    def words(self) -> int:
        return sum(self.word_counts)

    @property
    def text(self) -> str:
        """The composed document: the segments joined by single spaces."""
        return " ".join(self.segments)


def normalise(text: str) -> str:
    """NFC text with PDF ligatures expanded, control characters dropped and every whitespace run made one space.

    The composed document is a plain run of words: segment boundaries then fall between words, and any window of
    segments tokenizes as the whole text would (see `testdocs`).
    """
    text = unicodedata.normalize("NFC", text)
    text = _LIGATURES.sub(lambda m: unicodedata.normalize("NFKC", m.group(0)), text)
    text = _CONTROL.sub(" ", text)
    return " ".join(text.split())


def segment(text: str, words: int = SEGMENT_WORDS) -> tuple[str, ...]:
    """Cut a text into pieces of `words` words (the last may be shorter); empty text gives no segments."""
    if words <= 0:
        raise ValueError(f"segment size must be positive, got {words}")
    tokens = text.split()
    return tuple(" ".join(tokens[i : i + words]) for i in range(0, len(tokens), words))


def compose(name: str, documents: Sequence[tuple[str, str]], *, segment_words: int = SEGMENT_WORDS) -> Domain:
    """A Domain from `(source name, text)` pairs, composed in sorted source order (pure: no I/O)."""
    ordered = sorted(documents, key=lambda pair: pair[0])
    parts = [normalise(text) for _, text in ordered]
    segments = segment(" ".join(p for p in parts if p), segment_words)
    sources = tuple(source for (source, _), part in zip(ordered, parts, strict=True) if part)
    blob = json.dumps([name, segment_words, sources, segments], ensure_ascii=False)
    return Domain(name=name, segments=segments, sources=sources,
                  fingerprint=hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16])


def load_domains(root: str, *, segment_words: int = SEGMENT_WORDS, key: str = ROOT_KEY) -> tuple[Domain, ...]:
    """Read every domain folder under `root` (sorted by name) and compose each; `key` names the setting in errors."""
    if not root:
        raise DataFileError(f"TAIL needs a folder of documents and {key} is not set; expected {LAYOUT}")
    fs, base = _filesystem(root, key)
    folders, loose = _listing(fs, base, root, key)
    if not folders:
        shown = ", ".join(loose[:3]) + (", ..." if len(loose) > 3 else "")
        hint = (f"; found {len(loose)} file(s) directly in it ({shown}) - move them into a subfolder named after "
                "their domain") if loose else ""
        raise DataFileError(f"TAIL documents folder {root!r} has no domain subfolders{hint}. Expected {LAYOUT}; "
                            f"set {key}")
    return tuple(_domain(fs, path, name, root, key, segment_words) for name, path in folders)


def _filesystem(root: str, key: str):
    try:
        fs, base = filesystem(root)  # s3:// with the run's endpoint and credentials, like every other path
        return fs, base.rstrip("/")
    except (OSError, ValueError, StoreError) as exc:  # bad URIs and S3 set-up problems
        raise DataFileError(f"TAIL documents folder {root!r}: cannot open it ({type(exc).__name__}: {exc}); "
                            f"set {key} to a local folder, file:// or s3:// URI") from exc


def _listing(fs, base: str, root: str, key: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(domain name, path) of the subfolders, sorted, and the names of files lying loose in the root."""
    import pyarrow.fs as pafs

    try:
        info = fs.get_file_info(base)
        if info.type == pafs.FileType.NotFound:
            raise DataFileError(f"TAIL documents folder {root!r} not found. Expected {LAYOUT}; set {key}")
        if info.type != pafs.FileType.Directory:
            raise DataFileError(f"TAIL documents folder {root!r} is a file, not a folder. Expected {LAYOUT}; set {key}")
        entries = fs.get_file_info(pafs.FileSelector(base, recursive=False))
    except OSError as exc:
        raise DataFileError(f"TAIL documents folder {root!r}: cannot list it ({exc}); set {key}") from exc
    folders = sorted((e.base_name, e.path) for e in entries
                     if e.type == pafs.FileType.Directory and not e.base_name.startswith("."))
    loose = sorted(e.base_name for e in entries if e.type == pafs.FileType.File and not e.base_name.startswith("."))
    return folders, loose


def _domain(fs, path: str, name: str, root: str, key: str, segment_words: int) -> Domain:
    import pyarrow.fs as pafs

    try:
        entries = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    except OSError as exc:
        raise DataFileError(f"TAIL domain {name!r} in {root!r}: cannot list it ({exc})") from exc
    files = sorted((e.base_name, e.path) for e in entries
                   if e.type == pafs.FileType.File and not e.base_name.startswith("."))
    readable = [(n, p) for n, p in files if n.lower().endswith(SUFFIXES)]
    documents = []
    for file_name, file_path in readable:
        try:
            with fs.open_input_stream(file_path) as stream:
                raw = stream.read()
        except OSError as exc:
            raise DataFileError(f"TAIL document {_where(root, name, file_name)!r}: cannot read it ({exc})") from exc
        documents.append((file_name, read_document(_where(root, name, file_name), raw)))
    domain = compose(name, documents, segment_words=segment_words)
    if not domain.segments:
        others = f" (found: {', '.join(n for n, _ in files[:5])})" if files else ""
        found = (f"its {len(readable)} document(s) hold no text (a scanned PDF has no text layer: run OCR first)"
                 if readable else f"it has no .txt, .md or .pdf files{others}")
        raise DataFileError(f"TAIL domain {name!r} in {root!r} has no readable documents: {found}. Expected {LAYOUT}; "
                            f"remove the folder or add documents to it")
    return domain


def _where(root: str, domain: str, file_name: str) -> str:
    return f"{root.rstrip('/')}/{domain}/{file_name}"


def read_document(path: str, raw: bytes) -> str:
    """The text of one document by its suffix: UTF-8 for .txt and .md, the text layer for .pdf."""
    if path.lower().endswith(".pdf"):
        return pdf_text(path, raw)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFileError(f"TAIL document {path!r} is not UTF-8 text ({exc}); convert it to UTF-8") from exc


def pdf_text(path: str, raw: bytes) -> str:
    """The text layer of a PDF, page by page; an encrypted or damaged file is an error naming it."""
    try:
        import pypdf
    except ImportError as exc:
        raise DataFileError(f"TAIL document {path!r} is a PDF and reading PDFs needs pypdf: pip install pypdf") from exc
    try:
        reader = pypdf.PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DataFileError(f"TAIL document {path!r} is an encrypted PDF; save a decrypted copy")
        return "\n".join(page.extract_text() or "" for page in reader.pages)
    except DataFileError:
        raise
    except Exception as exc:  # pypdf raises many exception types on damaged files; name the file either way
        raise DataFileError(f"TAIL document {path!r} is not a readable PDF ({type(exc).__name__}: {exc}); "
                            "re-export it or convert it to .txt") from exc
