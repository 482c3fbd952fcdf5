"""Data files in the official LongBench v2 format, and a GenContext that points at them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longeval.tasks.base import DataPaths, GenContext
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder

DOMAIN_CYCLE = ("Single-Document QA", "Multi-Document QA", "Code Repository Understanding")


def make_item(i: int, **overrides: Any) -> dict[str, Any]:
    """Item `i`: difficulty alternates easy/hard, length cycles short/medium/long, domains cycle over three."""
    item = {
        "_id": f"66f{i:05d}",
        "domain": DOMAIN_CYCLE[i % 3],
        "sub_domain": "Academic",
        "difficulty": ("easy", "hard")[i % 2],
        "length": ("short", "medium", "long")[i % 3],
        "question": f"Which statement about document {i} is right?",
        "choice_A": f"first option {i}",
        "choice_B": f"second option {i}",
        "choice_C": f"third option {i}",
        "choice_D": f"fourth option {i}",
        "answer": "ABCD"[i % 4],
        "context": f"Document {i}. " + " ".join(f"word{k}" for k in range(50)),
    }
    item.update(overrides)
    return item


def write_json(path: Path, items: list[Any]) -> str:
    path.write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
    return str(path)


def write_jsonl(path: Path, items: list[Any]) -> str:
    path.write_text("\n".join(json.dumps(item, ensure_ascii=False) for item in items) + "\n", encoding="utf-8")
    return str(path)


def write_parquet(path: Path, items: list[dict[str, Any]]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(items), path)
    return str(path)


def context_for(encoder: Encoder, path: str | None, *, fmt: PromptFormat | None = None) -> GenContext:
    """A fresh GenContext (own cache) whose data names `path` as the LongBench v2 file."""
    return GenContext(encoder=encoder, fmt=fmt or PromptFormat(), data=DataPaths(longbench_v2_path=path))


def reference_fill(template: str, doc: str, question: str, choices: list[str], cot: str = "") -> str:
    """The reference's way: chained replacements of stripped values (fine when no value holds a marker)."""
    out = template.replace("$DOC$", doc.strip()).replace("$Q$", question.strip())
    for letter, choice in zip("ABCD", choices, strict=True):
        out = out.replace(f"$C_{letter}$", choice.strip())
    return out.replace("$COT$", cot)
