"""Small synthetic run roots for report tests: every family, known numbers, no engine.

Two models share their instances (same ids, as two models of one tokenizer on one suite would), so they can
be compared. RULER's numbers are chosen so the leaderboard is known by heart:

- model A: 100 / 90 / 50 at 4K / 8K / 16K -> Avg 80.00, wAvg(inc) 71.67, wAvg(dec) 88.33, effective 8K;
- model B: 100 / 80 / 70 -> Avg 83.33, wAvg(inc) 78.33, wAvg(dec) 88.33, effective 4K.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa

from longeval.config import to_yaml, validate
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, content_id
from longeval.run.consistency import prediction_fingerprints
from longeval.stages.summarise import report
from longeval.store.run_root import RunRoot

LENGTHS = (4096, 8192, 16384)
RULER_TASKS = ("niah_single_1", "vt", "cwe")
RULER_N = 10
RULER_FRACTIONS = {"model-a": (1.0, 0.9, 0.5), "model-b": (1.0, 0.8, 0.7)}
SYNC_TASKS = ("connected_nodes", "shortest_path", "longest_path")
SYNC_LENGTHS = (4096, 8192)
SYNC_N = 6
MICHELANGELO_TASKS = ("latent_list", "mrcr", "idk")
LONGBENCH_N = 12
TAIL_LENGTHS = (4096, 8192)
TAIL_DEPTHS = (10.0, 50.0, 90.0)
TAIL_N = 2
TASKS = (*RULER_TASKS, *SYNC_TASKS, *MICHELANGELO_TASKS, "longbench_v2", "tail")
EXPECTED_HEADLINE = {
    "model-a": {"avg": "80.00", "wavg_inc": "71.67", "wavg_dec": "88.33", "effective": "8K"},
    "model-b": {"avg": "83.33", "wavg_inc": "78.33", "wavg_dec": "88.33", "effective": "4K"},
}
HOSTILE_OUTPUT = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def instance(family: str, task: str, length: int, index: int, *, depth: float = -1.0, complexity: str = "",
              meta: dict | None = None, references: tuple[str, ...] = ("42",)) -> dict:
    return {
        "instance_id": content_id(family, task, length, index), "family": family, "task": task,
        "context_id": content_id(family, length, index, "context"), "target_length": length,
        "input_tokens": length - 200, "depth": depth, "complexity": complexity, "prompt": "", "prompt_token_ids": [],
        "answer_prefix": "", "max_new_tokens": 64, "references": list(references), "metric": "synthetic",
        "meta": json.dumps(meta or {}), "seed": 42, "shard_index": 0, "index": index, "generator_version": "1",
        "tokenizer_id": "synthetic",
    }


def _ruler(model: str) -> list[tuple[dict, float, str]]:
    rows = []
    for task in RULER_TASKS:
        for length, fraction in zip(LENGTHS, RULER_FRACTIONS[model], strict=True):
            right = round(fraction * RULER_N)
            for i in range(RULER_N):
                error = "" if i < right else ("null" if i % 2 else "")
                rows.append((instance("ruler", task, length, i, complexity="k1-v1-q1"), float(i < right), error))
    return rows


def _sync(model: str) -> list[tuple[dict, float, str]]:
    rows = []
    kinds = ("no_answer", "invalid_path", "suboptimal_path")
    for t, task in enumerate(SYNC_TASKS):
        for length in SYNC_LENGTHS:
            right = SYNC_N - 1 - t - (length // 8192) - (model == "model-b")
            for i in range(SYNC_N):
                error = "" if i < right else (kinds[(i + t) % 3] if task != "connected_nodes" else "no_answer")
                nodes = "nodes=15" if i % 2 else "nodes=30"
                rows.append((instance("sync", task, length, i, complexity=nodes), float(i < right), error))
    return rows


def _michelangelo(model: str) -> list[tuple[dict, float, str]]:
    rows = []
    bonus = 0.1 if model == "model-b" else 0.0
    for task in MICHELANGELO_TASKS:
        for k, length in enumerate(LENGTHS):
            for i in range(4):
                if task == "mrcr":
                    score = round(min(1.0, max(0.0, 0.9 - 0.2 * k - 0.05 * i + bonus)), 4)  # a similarity ratio
                else:
                    score = float((i + k) % 3 != 0 or (bonus and i == 0))
                rows.append((instance("michelangelo", task, length, i, complexity=f"ops={i + 1}"), score, ""))
    return rows


def _longbench(model: str) -> list[tuple[dict, float, str]]:
    rows = []
    domains = ("Single-Document QA", "Multi-Document QA", "Code Repository Understanding")
    for i in range(LONGBENCH_N):
        meta = {"difficulty": "easy" if i % 3 else "hard", "length": ("short", "medium", "long")[i % 3],
                "domain": domains[i % len(domains)], "answer": "A"}
        right = (i % 4 != 0) if model == "model-b" else (i % 2 == 0)
        error = "" if right else ("invalid" if i % 5 == 0 else "wrong")
        rows.append((instance("longbench_v2", "longbench_v2", 16384, i, meta=meta), float(right), error))
    return rows


def _tail(model: str) -> list[tuple[dict, float, str]]:
    rows = []
    for k, length in enumerate(TAIL_LENGTHS):
        for d, depth in enumerate(TAIL_DEPTHS):
            for i in range(TAIL_N):
                index = (d * TAIL_N) + i
                right = (i + d + k + (model == "model-b")) % 3 != 0
                rows.append((instance("tail", "tail", length, index, depth=depth, meta={"depth": depth}),
                             float(right), "" if right else "wrong"))
    return rows


def build_run(path: str | Path, model: str, *, summarise: bool = True, max_model_len: int = 32768,
              prompt_tokens: int = 0) -> RunRoot:
    """Write config.yaml, instances, predictions and scores for `model` under `path` (a folder or s3:// URI),
    and its summaries with `pipeline.report` if `summarise`. `prompt_tokens`: give each instance a prompt of
    this many (pseudo-random, barely compressible) words and token ids, as generated shards have between their
    metadata columns, for tests that count what reading around them costs."""
    cfg = validate({"model": {"name": model, "path": "synthetic", "max_model_len": max_model_len},
                    "suite": {"name": "synthetic", "tasks": list(TASKS), "lengths": list(LENGTHS), "samples": 10}})
    rows = _ruler(model) + _sync(model) + _michelangelo(model) + _longbench(model) + _tail(model)
    return write_run(path, cfg, rows, summarise=summarise, prompt_tokens=prompt_tokens)


def write_run(path: Path | str, cfg, rows: list[tuple[dict, float, str]], *, summarise: bool = True,
              prompt_tokens: int = 0) -> RunRoot:
    """A run root of `cfg` holding `rows` (instance, score, error type), predicted and scored, and summarised
    if `summarise`."""
    model = cfg.model.name
    root = RunRoot(str(path))
    root.write_text("config.yaml", to_yaml(cfg))
    root.write_json("versions.json", {"tokenizer_fingerprint": "tok-1", "chat_template_fingerprint": "chat-1"})
    shards: dict[str, list[dict]] = {}
    for instance, _, _ in rows:
        if prompt_tokens:
            rng = random.Random(instance["instance_id"])
            instance["prompt_token_ids"] = [rng.randrange(50_000) for _ in range(prompt_tokens)]
            instance["prompt"] = " ".join(f"w{t}" for t in instance["prompt_token_ids"])
        name = f"{instance['family']}.{instance['task']}.L{instance['target_length']}.s42.00000"
        shards.setdefault(name, []).append(instance)
    for name, instances in shards.items():
        root.write_table("instances", name, pa.Table.from_pylist(instances, schema=INSTANCE_SCHEMA))
    preds = [{"instance_id": inst["instance_id"], "model_id": model, "output": HOSTILE_OUTPUT if err else "42",
              "output_tokens": 3, "finish_reason": "stop", "cached_prompt_tokens": 0, "latency_s": 0.01, "error": ""}
             for inst, _, err in rows]
    predictions = pa.Table.from_pylist(preds, schema=PREDICTION_SCHEMA)
    root.write_part("predictions", predictions)
    fingerprints = prediction_fingerprints(predictions).to_pylist()  # each score from its prediction
    scores = [{"instance_id": inst["instance_id"], "model_id": model, "family": inst["family"], "task": inst["task"],
               "target_length": inst["target_length"], "depth": inst["depth"], "metric": "synthetic", "score": score,
               "parsed_answer": HOSTILE_OUTPUT if err else "42", "error_type": err, "extra": "{}",
               "complexity": inst["complexity"], "prediction_fingerprint": fingerprint}
              for (inst, score, err), fingerprint in zip(rows, fingerprints, strict=True)]
    root.write_table("scores", "scores", pa.Table.from_pylist(scores, schema=SCORE_SCHEMA))
    if summarise:
        report(cfg, root)
    return root
