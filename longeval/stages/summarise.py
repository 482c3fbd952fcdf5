"""The summarise stage: scores in, the summary tables out (`summary/<name>` as Parquet and CSV, summary.json,
status.json): the common tables, then each family's own (`Family.tables`), looped over, never named."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from longeval.config import Config, validate
from longeval.errors import StaleScoresError, StoreError
from longeval.records import INSTANCE_SCHEMA, SCORE_SCHEMA
from longeval.run.consistency import SUMMARY_INPUT, Consistency, State, check_root, planned_ids, scores_digest
from longeval.run.provenance import stored_config
from longeval.stats.aggregate import cumulative, error_table, headline, length_table, summarise
from longeval.store.run_root import RunRoot
from longeval.tasks import FAMILIES, effective_thresholds, sampling

log = logging.getLogger(__name__)


SLICE_BY = ("model_id", "family", "task", "complexity", "target_length")
"""Scores per instance configuration: SYNC's node and language counts, Michelangelo's complexity and IDK's
known/unknown answers."""


@dataclass
class RunResult:
    root: str
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """The summary tables by name (`summary/<name>`): the common ones and those the suite's families declare."""
    status: dict | None = None
    """`run_status`: whether every planned shard, every instance's prediction and its score is there."""
    consistency: Consistency | None = None
    """The check status.json was written from: its `one_line` says what is missing, for the terminal."""
    tracking: str | None = None
    """Where the W&B run went (`tracking=wandb`), for the end of the output."""
    adaptive: dict | None = None
    """`suite.adaptive`: the per-cell and effective-length tables and the compute spent
    (longeval.run.adaptive_rounds)."""

    @property
    def summary(self) -> pa.Table | None:
        return self.tables.get("tasks")

    @property
    def lengths(self) -> pa.Table | None:
        return self.tables.get("lengths")

    @property
    def headline(self) -> pa.Table | None:
        return self.tables.get("headline")

    @property
    def errors(self) -> pa.Table | None:
        return self.tables.get("errors")


def report(cfg: Config, root: RunRoot, scores: pa.Table | None = None) -> RunResult:
    """Summaries per task x length, per length, and the headline numbers; written as Parquet, CSV, JSON."""
    import pyarrow.csv as pacsv

    consistency = check_root(root, cfg)
    root.write_json("status.json", consistency.as_status())
    if consistency.state is State.STALE:  # a number would be wrong: none is written
        raise StaleScoresError(consistency.one_line(root.uri))
    if scores is None:
        scores = root.read_stage("scores", SCORE_SCHEMA)
    dropped = scores.num_rows
    scores = scores.filter(pc.is_in(scores["instance_id"], value_set=planned_ids(cfg, root)))
    if dropped > scores.num_rows:
        log.warning("run root %s holds %d scored instances outside the current suite: left out of the summaries",
                    root.uri, dropped - scores.num_rows)
    summary = summarise(scores)
    lengths = length_table(summary, scores=scores)
    head = headline(lengths, threshold=effective_thresholds(cfg.suite.effective_threshold), scores=scores)
    scheme = sampling()
    weights = scheme.weights(cfg.suite.lengths, cfg.suite.subsets) if cfg.suite.subsets and scheme else None
    curve = cumulative(scores, weights)
    errors = error_table(scores)
    tables = {"tasks": summary, "lengths": lengths, "headline": head, "cumulative": curve, "errors": errors}
    if "complexity" in scores.column_names:
        labelled = scores.filter(pc.not_equal(pc.fill_null(scores["complexity"], ""), ""))
        if labelled.num_rows:
            tables["slices"] = summarise(labelled, by=SLICE_BY)
    present = set(summary["family"].to_pylist())
    for family in FAMILIES.values():
        if family.name in present and family.tables:
            rows = rows_with_meta(root, scores, family.name)
            tables.update({table.name: table.build(summary, rows) for table in family.tables})
    for name, table in tables.items():
        root.write_table("summary", name, table)
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        root.write_text(f"summary/{name}.csv", sink.getvalue().to_pybytes().decode("utf-8"))
    root.write_json("summary.json", {name: table.to_pylist() for name, table in tables.items()})
    root.write_json(SUMMARY_INPUT, {"scores": scores_digest(root)})
    return RunResult(root=root.uri, tables=tables, status=consistency.as_status(), consistency=consistency)


def run_status(cfg: Config, root: RunRoot) -> dict:
    """status.json: whether the run is complete and current (`longeval.run.consistency`): every planned instance shard
    committed, every planned instance (follow-up calls included) with a final prediction and a score from it.
    Summaries of an incomplete run are partial, and say so."""
    return check_root(root, cfg).as_status()


def rows_with_meta(root: RunRoot, scores: pa.Table, family: str) -> dict[str, list[dict]]:
    """One family's score rows with their instance's `meta` JSON, per model (for family-specific tables)."""
    # Only the family's shards (their names start with it): `meta` is the bulk of a shard's metadata.
    names = [n for n in root.shard_names("instances") if n.startswith(family + ".")]
    instances = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "family", "meta"], names=names)
    mine = instances.filter(pc.equal(instances["family"], family))
    meta = dict(zip(mine["instance_id"].to_pylist(), mine["meta"].to_pylist(), strict=True))
    rows: dict[str, list[dict]] = {}
    for row in scores.filter(pc.equal(scores["family"], family)).to_pylist():
        rows.setdefault(row["model_id"], []).append({**row, "meta": meta.get(row["instance_id"], "{}")})
    return dict(sorted(rows.items()))


def summarise_root(root: RunRoot) -> RunResult:
    """Write a scored run root's summaries with the config it stored (`config.yaml`): for `longeval report`
    on a root that was scored but never summarised."""
    stored = stored_config(root)
    if stored is None:
        raise StoreError(f"run root {root.uri} has scores but neither summary/ nor config.yaml; run "
                         "`longeval report` with the overrides it was made with to write its summaries")
    if stored.damage is not None or stored.tree is None:
        path = root.path("config.yaml")
        raise StoreError(f"run root {root.uri} has scores but no summary/, and {path}, which its summaries are "
                         f"computed with, is damaged: {stored.damage}; move it aside (e.g. to {path}.damaged) and "
                         "run `longeval report` with the overrides the run was made with: it writes config.yaml and "
                         "the summaries again and keeps the scores")
    return report(validate(stored.tree), root)
