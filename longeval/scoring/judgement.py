"""What a task-specific scorer returns: a score, the answer it parsed, and why it lost points."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Judgement:
    """One scored output. `error_type` is "" when the answer is right, else a task's own label
    (e.g. SYNC's "no_answer", "invalid_path", "suboptimal_path"), so summaries can count error kinds."""

    score: float
    parsed_answer: str = ""
    error_type: str = ""


Judge = Callable[[str, Sequence[str], dict[str, Any]], Judgement]
"""A scorer that needs the instance's meta: (output, references, meta) -> Judgement; never raises."""
