"""Send a batch of chat requests through the run's engine and get the texts back.

The same engine actor as the pipeline's infer stage (`VllmPredictor`, greedy decoding, token-id prompts), in
a Ray Data actor pool, so a builder runs wherever a run would: on this machine's CPU or on a GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from longeval.config import Config
from longeval.errors import LengthError


@dataclass(frozen=True)
class Request:
    """One user message to complete."""

    request_id: str
    text: str
    max_new_tokens: int


def render_requests(cfg: Config, model_path: str, requests: list[Request]) -> pa.Table:
    """The requests as token ids, with the model's chat template (or plain text for base models)."""
    from longeval.text.tokenizer import load_encoder

    encoder = load_encoder(model_path)
    tokenizer = encoder.tokenizer
    rows = []
    for req in requests:
        if cfg.model.chat_template and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": req.text}]
            if cfg.model.system_prompt:
                messages.insert(0, {"role": "system", "content": cfg.model.system_prompt})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
        else:
            ids = [*encoder.special_prefix(), *(int(t) for t in encoder.encode(req.text))]
        if len(ids) + req.max_new_tokens > cfg.model.max_model_len:
            raise LengthError(
                f"request {req.request_id} needs {len(ids)} + {req.max_new_tokens} tokens, more than "
                f"model.max_model_len={cfg.model.max_model_len}; shorten it or raise model.max_model_len"
            )
        rows.append({"instance_id": req.request_id, "prompt_token_ids": ids, "max_new_tokens": req.max_new_tokens})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("instance_id", pa.string()), ("prompt_token_ids", pa.list_(pa.int32())), ("max_new_tokens", pa.int64())]))


def complete(cfg: Config, model_path: str, requests: list[Request], *, progress=None, label: str = "complete"
             ) -> dict[str, str]:
    """Each request's output text, by request id (an engine error fails the build with its message)."""
    import ray

    from longeval.engines.vllm_engine import VllmPredictor
    from longeval.errors import LongevalError
    from longeval.pipeline import init_ray

    if not requests:
        return {}
    init_ray(cfg)
    table = render_requests(cfg, model_path, requests)
    longest = max(len(ids) + n for ids, n in zip(table["prompt_token_ids"].to_pylist(),
                                                  table["max_new_tokens"].to_pylist(), strict=True))
    ds = ray.data.from_arrow(table).map_batches(
        VllmPredictor,
        fn_constructor_kwargs={"model": cfg.model, "model_path": model_path, "model_id": cfg.model.name,
                               "max_model_len": min(cfg.model.max_model_len, max(longest, 256))},
        batch_size=cfg.cluster.batch_size,
        compute=ray.data.ActorPoolStrategy(size=cfg.cluster.replicas),
        num_gpus=cfg.cluster.gpus_per_replica or None,
        num_cpus=1,
    )
    task_id = progress.add_task(label, total=len(requests)) if progress else None
    out: dict[str, str] = {}
    for batch in ds.iter_batches(batch_size=cfg.cluster.batch_size, batch_format="pyarrow"):
        for rid, text, error in zip(batch["instance_id"].to_pylist(), batch["output"].to_pylist(),
                                    batch["error"].to_pylist(), strict=True):
            if error:
                raise LongevalError(f"the engine failed on request {rid}: {error}; rerun to retry")
            out[rid] = text
        if progress:
            progress.advance(task_id, batch.num_rows)
    return out
