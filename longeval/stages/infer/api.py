"""Models behind an HTTP API: Ray Data over the instance shards, one API actor per replica, each with
`api.concurrency` requests open. Their actors only wait on the network, so they keep this path rather than the
replicas and drivers of the engines the stage runs itself."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from longeval.cluster import interrupt
from longeval.cluster.ray_runtime import map_pool
from longeval.config import Config
from longeval.engines.openai_compat import ApiPredictor
from longeval.planning.plan import Pool
from longeval.records import prediction_table
from longeval.stages.infer.replica import engine_redactor
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName

__all__ = ["ApiWriter", "infer_api"]


def infer_api(cfg: Config, pool: Pool, send: pa.Table, root: RunRoot, model_path: str, progress) -> int:
    """Ray Data over the instance shards: one API actor per replica, each with `api.concurrency` requests open."""
    import ray

    fs, paths = root.stage_files("instances")
    paths = [p for p in paths if ShardName.parse(p.rsplit("/", 1)[-1].removesuffix(".parquet")).target_length
             in pool.lengths]
    columns = ["instance_id", "prompt_token_ids", "max_new_tokens", "target_length"]
    if cfg.model.api.mode == "chat":  # chat requests send the text, not the token ids
        columns += ["prompt", "answer_prefix"]
    wanted = send["instance_id"].combine_chunks()
    batch = max(cfg.cluster.batch_size, cfg.model.api.concurrency)
    # Ray's Parquet reader packs small files into one block (and one block feeds one actor): repartition so
    # every replica gets rows.
    ds = ray.data.read_parquet(paths, filesystem=fs, columns=columns)
    ds = ds.map_batches(lambda t: t.filter(pc.is_in(t["instance_id"], value_set=wanted)), batch_format="pyarrow")
    ds = map_pool(
        ds.repartition(max(1, -(-send.num_rows // batch))), ApiWriter,
        fn_constructor_kwargs={"model": cfg.model, "model_path": model_path, "model_id": cfg.model.name,
                               "max_model_len": pool.max_model_len, "root_uri": root.uri,
                               "public_keys": tuple(cfg.public_keys)},
        batch_size=batch, compute=ray.data.ActorPoolStrategy(size=pool.replicas), num_cpus=0.25,
    )
    task_id = progress.add_task(f"infer {pool.name}", total=send.num_rows) if progress else None
    for out in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        interrupt.check()
        if progress:
            progress.advance(task_id, out.num_rows)
    return send.num_rows


class ApiWriter:
    """Ray Data callable for API models: the engine answers a batch, this commits its rows and the engine record
    (the engine itself never touches the store)."""

    def __init__(self, model, model_path: str, model_id: str, max_model_len: int, root_uri: str,
                 public_keys: tuple[str, ...] = ()) -> None:
        self.predictor = ApiPredictor(model, model_path, model_id, max_model_len)
        self.root = RunRoot(root_uri)
        self.redactor = engine_redactor(model, root_uri, public_keys)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        rows = self.predictor(batch)
        # a failed request's message may quote the server's URL, user info included
        rows["error"] = [self.redactor.text(e) if e else e for e in rows["error"]]
        self.root.write_part("predictions", prediction_table(rows))
        self.root.write_json(self.predictor.record_name, self.redactor.tree(self.predictor.record()))
        return rows
