"""Data files in the official LongBench v2 format, and a GenContext that points at them (the item builder is
the family's own, `longeval.tasks.longbench_v2.samples`)."""

from __future__ import annotations

__all__ = ["DOMAIN_CYCLE", "context_for", "make_item", "reference_fill", "write_json", "write_jsonl",
           "write_parquet"]

import json
from pathlib import Path
from typing import Any

from longeval.tasks.base import DataPaths, GenContext
from longeval.tasks.longbench_v2.samples import DOMAIN_CYCLE, make_item, write_json
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder


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
