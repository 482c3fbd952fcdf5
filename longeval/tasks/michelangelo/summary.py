"""Michelangelo's chance rates beside the scores (Appendix B): what guessing scores on each task."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from rich.text import Text

from longeval.tasks.family import ScoreRows
from longeval.tasks.michelangelo.chance import chance_table


def chance_rates(tasks: pa.Table, rows: ScoreRows) -> pa.Table:
    """The chance rate (ours, simulated on our generators, and the paper's) of each Michelangelo task run."""
    mine = tasks.filter(pc.equal(tasks["family"], "michelangelo"))
    return chance_table(sorted(set(mine["task"].to_pylist())))


def render_chance(table: pa.Table) -> Text:
    return Text("chance rates, what guessing scores (ours / the paper's Appendix B): " + ", ".join(
        f"{r['task']} {r['chance']:.1f} / {r['paper']:.1f}" for r in table.to_pylist()))
