"""A small LongBench v2 file in the official format (the dataset's JSON list): LongBench v2's `Family.sample_data`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longeval.tasks.family import SampleData

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



def sample_data(folder: Path) -> SampleData:
    """Four items: both difficulties, the three lengths, three domains, each answer letter once."""
    folder.mkdir(parents=True, exist_ok=True)
    return SampleData(data={"longbench_v2_path": write_json(folder / "longbench_v2.json",
                                                            [make_item(i) for i in range(4)])})
