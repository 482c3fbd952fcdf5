"""Shared builders for the TAIL tests: varied report text, a hand-made PDF, a small built benchmark."""

from __future__ import annotations

import json
from pathlib import Path

from longeval.tasks.tail import (
    LETTERS,
    Domain,
    Question,
    TailQuestion,
    compose,
    make_manifest,
    question_id,
    write_tail_dataset,
)

NOUNS = ("revenue", "headcount", "backlog", "inventory", "margin", "turnover", "output", "demand", "yield", "cost")
PLACES = ("Aberdeen", "Leeds", "Cardiff", "Belfast", "Dundee", "Exeter", "Bristol", "Durham", "Bangor", "Oxford")


def report(tag: str, sentences: int, *, start: int = 0) -> str:
    """Distinct, varied sentences (numbers, names, punctuation), so tokenization is realistic and nothing repeats."""
    lines = []
    for k in range(start, start + sentences):
        lines.append(
            f"In {PLACES[k % 10]}, the {NOUNS[(k * 7) % 10]} of {tag} unit {k} changed by "
            f"{(k * 37) % 101 - 50}.{k % 10}% (quarter {k % 4 + 1}); "
            f"officials called it \"{'notable' if k % 3 else 'routine'}\"."
        )
        if k % 5 == 4:
            lines.append("")  # a paragraph break, normalised away
    return "\n".join(lines)


def make_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF 1.4 with one line of Helvetica text per page, written by hand (no PDF library)."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    font_ref = 3 + 2 * len(pages)
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                       f"/Resources << /Font << /F1 {font_ref} 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def domain_of(name: str, sentences: int) -> Domain:
    return compose(name, [(f"{name}.txt", report(name, sentences))])


def question_for(domain: Domain, segment: int, depth: float, answer: str = "C") -> TailQuestion:
    options = tuple(f"{domain.name} option {letter} for segment {segment}" for letter in LETTERS)
    q = Question(f"What does {domain.name} segment {segment} report at depth {depth}?", options, answer)
    return TailQuestion(
        question_id=question_id(domain.fingerprint, segment, depth, q), domain=domain.name, gold_segment=segment,
        depth=depth, question=q.question, options=options, answer=answer, gold_text=domain.segments[segment],
        generator_model="test-generator", provenance=json.dumps({"attempts": []}),
    )


def build_dataset(folder: Path, domains: list[Domain], depths: tuple[float, ...]) -> str:
    """Write a benchmark with one question per (domain, depth), gold at the segment nearest that depth."""
    from longeval.tasks.tail import initial_segments

    questions = []
    for domain in domains:
        for depth, seg in zip(depths, initial_segments(domain.word_counts, depths), strict=True):
            questions.append(question_for(domain, seg, depth, answer=LETTERS[seg % 6]))
    write_tail_dataset(str(folder), questions, {d.name: d.segments for d in domains},
                       make_manifest(generator_model="test-generator", seed=7, domains=domains))
    return str(folder)
