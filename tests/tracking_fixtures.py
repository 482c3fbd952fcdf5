"""A finished run root written without an engine: instance, prediction and score shards through `RunRoot` and
the record schemas, then `pipeline.report`. Shared by the tracking and dashboard tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pyarrow as pa

from longeval.config import Config, to_yaml
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, SCORE_SCHEMA, Instance, Prediction, Score, content_id
from longeval.run import pipeline
from longeval.store.run_root import RunRoot


def depth_of(family: str, task: str, index: int) -> float:
    """RULER's vt and LongBench v2 have no depth here; TAIL three depths; the rest spread over 0-100 %."""
    if task == "vt" or family == "longbench_v2":
        return -1.0
    return [10.0, 50.0, 90.0][index % 3] if family == "tail" else index * 17.0


def _meta(family: str, index: int) -> str:
    if family != "longbench_v2":
        return "{}"
    from longeval.tasks.longbench_v2.data import DIFFICULTIES, DOMAINS, LENGTHS

    return json.dumps({"difficulty": DIFFICULTIES[index % 2], "length": LENGTHS[index % 3],
                       "domain": DOMAINS[index % len(DOMAINS)]})


def build_root(cfg: Config, tasks: Mapping[str, str], lengths: Sequence[int], samples: int) -> RunRoot:
    """Write `samples` instances per task (name -> family) and length, half of them answered right."""
    root = RunRoot(cfg.run_root)
    shards: dict[str, list[dict]] = {}
    preds, scores = [], []
    for task, family in tasks.items():
        for length in lengths:
            for i in range(samples):
                iid = content_id(family, task, length, i)
                shard = i // 3
                prompt = f"{'haystack ' * 300}[{iid}] What is the answer {i}?"
                depth = depth_of(family, task, i)
                shards.setdefault(f"{family}.{task}.L{length}.s42.{shard:05d}", []).append(Instance(
                    instance_id=iid, family=family, task=task, context_id=iid, target_length=length,
                    input_tokens=length - 100, depth=depth, complexity=f"k{i % 2}", prompt=prompt,
                    prompt_token_ids=[1, 2, 3], answer_prefix="", max_new_tokens=32, references=[f"ans{i}"],
                    metric="string_match_all", meta=_meta(family, i), seed=42, shard_index=shard, index=i,
                    generator_version="1", tokenizer_id="t").to_row())
                right = (i + length // 1024) % 2 == 0
                output = f"The answer is ans{i}" if right else ""
                preds.append(Prediction(iid, cfg.model.name, output, 5, "stop", 0, 0.1).to_row())
                scores.append(Score(iid, cfg.model.name, family, task, length, depth, "string_match_all",
                                    1.0 if right else 0.0, output, "" if right else "null").to_row())
    for name, rows in shards.items():
        root.write_table("instances", name, pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA))
    root.write_part("predictions", pa.Table.from_pylist(preds, schema=PREDICTION_SCHEMA))
    root.write_table("scores", "scores", pa.Table.from_pylist(scores, schema=SCORE_SCHEMA))
    root.write_text("config.yaml", to_yaml(cfg))
    root.write_json("versions.json", {"longeval": "test", "tokenizer_fingerprint": "abc123"})
    pipeline.report(cfg, root)
    return root
