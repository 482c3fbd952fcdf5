"""Send a batch of chat requests through the run's engine and get the texts back.

The same engines as the pipeline's infer stage (`VllmPredictor`, a batch interface on `VllmEngine`, or
`ApiPredictor` for a model behind an OpenAI-compatible server; greedy decoding), as Ray actors that live across a
builder's rounds (an engine start costs a minute or more), so a builder runs wherever a run would: on this
machine's CPU or on a GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from longeval.cluster.ray_runtime import init_ray
from longeval.config import Config
from longeval.engines import predictor_class
from longeval.errors import LengthError, LongevalError
from longeval.text.tokenizer import load_encoder


@dataclass(frozen=True)
class Request:
    """One user message to complete."""

    request_id: str
    text: str
    max_new_tokens: int


def render_requests(cfg: Config, model_path: str, requests: list[Request]) -> pa.Table:
    """The requests as token ids, with the model's chat template (or plain text for base models)."""
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
        rows.append({"instance_id": req.request_id, "prompt_token_ids": ids, "max_new_tokens": req.max_new_tokens,
                     "prompt": req.text, "answer_prefix": ""})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("instance_id", pa.string()), ("prompt_token_ids", pa.list_(pa.int32())), ("max_new_tokens", pa.int64()),
        ("prompt", pa.large_string()), ("answer_prefix", pa.string())]))


class Completer:
    """Engine actors kept alive across calls (a builder's rounds), spread over `cluster.replicas` replicas."""

    def __init__(self, cfg: Config, model_path: str) -> None:
        import ray

        init_ray(cfg)
        api = cfg.model.engine == "openai"
        actor = ray.remote(num_cpus=0.25 if api else 1,
                           num_gpus=0 if api else (cfg.cluster.gpus_per_replica or 0))(predictor_class(cfg.model))
        self.cfg, self.model_path = cfg, model_path
        self.actors = [actor.remote(cfg.model, model_path, cfg.model.name, cfg.model.max_model_len)
                       for _ in range(max(1, cfg.cluster.replicas))]

    def __call__(self, requests: list[Request], *, progress=None, label: str = "complete") -> dict[str, str]:
        """Each request's output text, by request id (an engine error fails the build with its message)."""
        import ray

        if not requests:
            return {}
        table = render_requests(self.cfg, self.model_path, requests)
        # vLLM engines batch continuously within a call: give each a few large calls (progress after each), not
        # many small ones; API actors keep `batch_size` requests per call.
        api = self.cfg.model.engine == "openai"
        size = self.cfg.cluster.batch_size if api else max(self.cfg.cluster.batch_size,
                                                             -(-table.num_rows // (4 * len(self.actors))))
        pending = []
        for k, start in enumerate(range(0, table.num_rows, size)):
            batch = table.slice(start, size).to_pydict()
            pending.append(self.actors[k % len(self.actors)].predict.remote(batch))
        task_id = progress.add_task(label, total=len(requests)) if progress else None
        out: dict[str, str] = {}
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rows = ray.get(done[0])
            for rid, text, error in zip(rows["instance_id"], rows["output"], rows["error"], strict=True):
                if error:
                    raise LongevalError(f"the engine failed on request {rid}: {error}; rerun to retry")
                out[rid] = text
            if progress:
                progress.advance(task_id, len(rows["instance_id"]))
        return out

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def complete(cfg: Config, model_path: str, requests: list[Request], *, progress=None, label: str = "complete"
             ) -> dict[str, str]:
    """One batch of requests on fresh engine actors (a builder with one round)."""
    completer = Completer(cfg, model_path)
    try:
        return completer(requests, progress=progress, label=label)
    finally:
        completer.close()
