"""`longeval mrcr build-pool`: an MRCR writings pool written by a model through longeval's own engine.

Michelangelo's MRCR needs many writings per (format, topic) that differ substantially; the default pool is
procedural. This job asks a model instead: for every format and topic, `per_key` requests "Write a poem about
penguins." made distinct by a seeded detail to include (greedy decoding would repeat an identical request),
and stores the answers as a Parquet pool with the model and seed, which `suite.params.mrcr.pool_path` reads.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longeval import __version__
from longeval.builders.complete import Request, complete
from longeval.config import Config
from longeval.errors import ConfigError
from longeval.records import content_id
from longeval.store.location import write_uri
from longeval.tasks.michelangelo import prompts
from longeval.tasks.michelangelo.writings import FORMATS, TOPICS

POOL_SCHEMA = pa.schema([("format", pa.string()), ("topic", pa.string()), ("text", pa.string()),
                         ("request", pa.string()), ("model_id", pa.string()), ("seed", pa.int64())])


def pool_requests(*, per_key: int, seed: int, topics: int | None = None, max_new_tokens: int = 256
                  ) -> list[tuple[str, str, Request]]:
    """(format, topic, request) triples, deterministic in the seed: the requests of one format and topic
    differ in the detail they ask to include (drawn without replacement), so greedy decoding gives each its
    own writing."""
    rng = np.random.default_rng([seed, 0x4D524352])
    out = []
    for topic in TOPICS[:topics] if topics else TOPICS:
        details = [f"Mention a {adjective} {noun} and {place}." for adjective in topic.adjectives
                   for noun in topic.nouns for place in topic.places]
        if per_key > len(details):
            raise ConfigError(f"--per-key {per_key} is more than the {len(details)} distinct requests a topic has")
        for fmt in FORMATS:
            ask = prompts.MRCR_REQUEST.format(article=prompts.article(fmt), format=fmt, topic=topic.name)
            for j, pick in enumerate(rng.choice(len(details), size=per_key, replace=False)):
                text = f"{ask} {details[int(pick)]} Reply with the {fmt} only."
                out.append((fmt, topic.name, Request(content_id(fmt, topic.name, j, seed), text, max_new_tokens)))
    return out


def build_pool(cfg: Config, model_path: str, out: str, *, per_key: int = 8, seed: int = 0,
               topics: int | None = None, max_new_tokens: int = 256, progress=None) -> int:
    """Write the pool to `out` (a .parquet path, local or s3://); returns how many writings it holds."""
    requests = pool_requests(per_key=per_key, seed=seed, topics=topics, max_new_tokens=max_new_tokens)
    texts = complete(cfg, model_path, [req for _, _, req in requests], progress=progress, label="mrcr writings")
    rows = []
    for fmt, topic, req in requests:
        text = texts[req.request_id].strip()
        if text:  # an empty answer is no writing; the pool records what the model wrote, nothing else
            rows.append({"format": fmt, "topic": topic, "text": text, "request": req.text,
                         "model_id": cfg.model.name, "seed": seed})
    table = pa.Table.from_pylist(rows, schema=POOL_SCHEMA).replace_schema_metadata(
        {"longeval_pool": json.dumps({"model_id": cfg.model.name, "seed": seed, "per_key": per_key,
                                      "longeval": __version__, "max_new_tokens": max_new_tokens})})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    write_uri(out, sink.getvalue())
    return table.num_rows
