"""The terminal view of an adaptive run: where the samples went, the decisions and the effective lengths."""

from __future__ import annotations

import pyarrow as pa
from rich.console import Group
from rich.table import Table
from rich.text import Text

from longeval.report.table import format_length

__all__ = ["effective_length_text", "render_adaptive"]

_MARK = {"above": "[green]above[/]", "below": "[red]below[/]", "undecided": "[yellow]open[/]",
         "presumed_below": "[magenta]below?[/]"}


def render_adaptive(cells: pa.Table, lengths: pa.Table, compute: dict) -> Group:
    """Per task x length: decision and instances spent (`*` decided early, `~` near the threshold, `!` above a
    failed shorter length); then the effective length per task and skill group with its interval (a group decided
    on its mean's own bound, `suite.adaptive_target`, says `[group mean]`), and the compute against the full
    sweep. `below?`: stopped by the confirmation rule without a decision."""
    rows = cells.to_pylist()
    all_lengths = sorted({r["target_length"] for r in rows})
    table = Table(title="adaptive run: decision / instances per cell (* decided early, ~ near the threshold, "
                        "! beats a failed shorter length)")
    table.add_column("task")
    for n in all_lengths:
        table.add_column(format_length(n), justify="right")
    by_task: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], {})[r["target_length"]] = r
    for task, cells_of in sorted(by_task.items()):
        table.add_row(task.split("/")[-1], *[
            _cell(cells_of[n]) if n in cells_of else "–" for n in all_lengths])
    lines = [f"{r['scope']} {r['name']}: {effective_length_text(r)}"
             + (" [group mean]" if r.get("bound") == "group mean" else "") for r in lengths.to_pylist()]
    share = compute.get("token_share")
    spent = (f"{compute['instances']:,}/{compute['full_instances']:,} instances, {compute['tokens']:,} tokens of "
             f"~{compute['full_tokens_est']:,} for the full sweep"
             + (f" ({100 * share:.1f} %)" if share is not None else "")
             + (f"; ~{compute['gpu_hours']:.3g} of ~{compute['full_gpu_hours_est']:.3g} GPU-hours on "
                f"{compute['gpu']} (longeval.cost's estimate)" if compute.get("gpu_hours") is not None else "")
             + f"; {compute['decided_early']}/{compute['cells']} cells decided early at "
             f"{100 * compute['confidence']:.0f} % confidence")
    return Group(table, Text("effective length: " + " · ".join(lines)), Text("compute: " + spent))


def effective_length_text(r: dict) -> str:
    """One `adaptive_lengths` row in words: the length, or the range it is undecided in. Near the threshold the
    row's decisions give a length, but a full sweep with other instances could give another: it is called
    undecided, with that range, rather than passed off as the answer."""
    def length(n: int | None) -> str:
        return format_length(n) if n else "none"

    if not r["decided"]:
        return f"undecided, between {length(r['effective_length_low'])} and {length(r['effective_length_high'])}"
    value = format_length(r["effective_length"]) if r["effective_length"] else "none passes"
    if r.get("near_threshold"):  # absent in roots written before the flag
        return f"undecided near the threshold: a full sweep could give {length(r['noise_low'])} to " \
               f"{length(r['noise_high'])} (these instances give {value})"
    return value


def _cell(r: dict) -> str:
    flag = ("*" if r["decided_early"] else "") + ("~" if r.get("near_threshold") else "") \
        + ("!" if r["beats_shorter"] else "")
    return f"{_MARK.get(r['decision'], r['decision'])} {r['instances']}{flag}"
