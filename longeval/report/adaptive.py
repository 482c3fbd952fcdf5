"""The terminal view of an adaptive run: where the samples went, the decisions and the effective lengths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from rich.console import Group
from rich.table import Table
from rich.text import Text

from longeval.report.table import format_length

__all__ = ["effective_length_text", "render_adaptive", "schedule_text"]

_MARK = {"above": "[green]above[/]", "below": "[red]below[/]", "undecided": "[yellow]open[/]",
         "presumed_below": "[magenta]below?[/]"}


def render_adaptive(cells: pa.Table, lengths: pa.Table, compute: dict, groups: pa.Table | None = None) -> Group:
    """Per task x length: decision and instances spent (`*` decided early, `~` near the threshold, `!` above a
    failed shorter length); then the effective length per task and skill group with its interval (a group decided
    on its mean's own bound, `suite.adaptive_target`, says `[group mean]`), and the compute against the full
    sweep. `below?`: stopped by the confirmation rule without a decision. `groups` (`adaptive_groups`): a group
    decided on its mean also gets its score and interval per length."""
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
                f"{compute['gpu']} (longeval.planning.cost's estimate)" if compute.get("gpu_hours") is not None else "")
             + f"; {compute['decided_early']}/{compute['cells']} cells decided early at "
             f"{100 * compute['confidence']:.0f} % confidence")
    parts = [table, Text("effective length: " + " · ".join(lines))]
    for name, rows_of in _on_mean(groups).items():
        parts.append(Text(f"group {name} on its mean (score [interval], points): " + " · ".join(
            f"{format_length(g['target_length'])} "
            + ("–" if g["score"] is None else f"{g['score']:.1f} [{g['ci_low']:.1f}, {g['ci_high']:.1f}]")
            + f" {g['decision']}" + ("~" if g["near_threshold"] else "") for g in rows_of)))
    sampled = schedule_text(compute.get("schedule"))
    return Group(*parts, Text("compute: " + spent), *([Text("sampled: " + sampled)] if sampled else []))


def schedule_text(schedule: Mapping[str, Any] | None) -> str:
    """`compute.schedule` (adaptive.json) in words: how the run sampled, so a reader of its numbers knows at which
    draws the bounds were looked at and how alpha was split. "" for a root written before it was recorded."""
    if not schedule:
        return ""
    start, growth, most = schedule["round_start"], schedule["growth"], schedule["round_max"]
    rounds = (f"rounds of {start} growing by {100 * (growth - 1):g} % up to {max(start, most)}" if growth > 1 and most
              else f"rounds of {start} growing by {100 * (growth - 1):g} % without limit" if growth > 1
              else f"constant rounds of {start}")
    split = "over the lengths in proportion to the length" if schedule["alpha_split"] == "length" \
        else "equally over the lengths"
    shards = f" (shards of {schedule['shard_size']})" if schedule.get("shard_size") else ""
    return (f"{rounds} instances per cell{shards}; α split {split}; near stop "
            f"{'on' if schedule['near_stop'] else 'off'}")


def _on_mean(groups: pa.Table | None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for g in groups.to_pylist() if groups is not None else []:
        if g["bound"] == "group mean":
            out.setdefault(g["group"], []).append(g)
    return out


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
