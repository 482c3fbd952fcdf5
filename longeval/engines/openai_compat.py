"""A model behind an OpenAI-compatible HTTP API: a remote `vllm serve`, or a hosted model.

Same contract as `VllmPredictor`: a Ray Data callable that takes instance rows and returns (and writes)
prediction rows, greedy decoding. Two request shapes:

- `completions` (default for `vllm serve`): the instance's prompt token ids go to `/completions` as they are,
  so the server sees exactly the tokens the generator counted, as the in-process engine does.
- `chat`: for hosted chat models whose template we do not control. The instance must be rendered without a
  chat template (`model.chat_template=false`); its text goes as the user turn. The answer prefix goes as a
  partial assistant turn when the server can continue one (`api.continue_final_message`, a vLLM extension),
  and is dropped otherwise.

Every request is retried with exponential backoff on connection errors, timeouts, rate limits (honouring
Retry-After) and 5xx; a request that still fails becomes a prediction with `error="engine_error: api ..."`,
which is counted in the results and retried on the next run, never dropped.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from longeval.config import ApiConfig, ModelConfig, check_api
from longeval.records import PREDICTION_SCHEMA, ErrorKind

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 429}
_BACKOFF = wait_exponential(multiplier=0.5, max=30.0)
MAX_RETRY_AFTER_S = 120.0


@dataclass
class Usage:
    """What the API was asked for and billed, per engine actor (written to `engines/` in the run root)."""

    requests: int = 0
    failed: int = 0
    retries: int = 0
    rate_limited: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        with self._lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def record(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


@dataclass(frozen=True)
class Reply:
    output: str
    output_tokens: int
    finish_reason: str
    cached_prompt_tokens: int
    latency_s: float
    error: str = ""


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def is_retryable(exc: BaseException) -> bool:
    """Connection trouble, timeouts, rate limits and server errors are worth another try; a 400 is not."""
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    status = _status(exc)
    return status is not None and (status in RETRY_STATUS or status >= 500)


def retry_after_s(exc: BaseException | None) -> float | None:
    """The server's Retry-After (seconds) on a rate-limit or unavailable response, if it gave one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    for key in ("retry-after-ms", "retry-after"):
        value = headers.get(key)
        if value is None:
            continue
        try:
            seconds = float(value) / (1000.0 if key.endswith("-ms") else 1.0)
        except ValueError:
            continue
        if math.isnan(seconds):
            continue
        return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)
    return None


def wait_for(state: RetryCallState) -> float:
    """Retry-After when the server says how long, else exponential backoff."""
    exc = state.outcome.exception() if state.outcome else None
    after = retry_after_s(exc)
    return after if after is not None else _BACKOFF(state)


class ApiPredictor:
    """A Ray Data `map_batches` callable that sends each row as one request, `api.concurrency` at a time."""

    def __init__(self, model: ModelConfig, model_path: str, model_id: str, max_model_len: int) -> None:
        import openai

        check_api(model)
        self.api: ApiConfig = model.api
        self.model_id = model_id
        self.served_name = model.api.model or model.name
        self.usage = Usage()
        # The key is read from the environment here and handed to the client only: never stored in the config,
        # the run root or a log line.
        self.client = openai.OpenAI(
            base_url=self.api.base_url,
            api_key=os.environ.get(self.api.api_key_env) or "EMPTY",
            timeout=self.api.timeout_s,
            max_retries=0,  # tenacity decides, so retries are counted and Retry-After is honoured once
        )
        self.pool = ThreadPoolExecutor(max_workers=self.api.concurrency, thread_name_prefix="longeval-api")
        self.record_name = f"engines/api-{socket.gethostname()}-{os.getpid()}-{int(time.time())}.json"
        self.replica = f"api/{socket.gethostname()}-{os.getpid()}"
        self.node = _node_id()

    def predict(self, batch: dict[str, Any]) -> dict[str, list]:
        """The same as calling the predictor: the name a plain Ray actor exposes (builders use one)."""
        return self(batch)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        n = len(batch["instance_id"])
        column = batch.get
        jobs = [
            self.pool.submit(
                self.request,
                [int(t) for t in batch["prompt_token_ids"][i]],
                str(column("prompt")[i]) if column("prompt") is not None else "",
                str(column("answer_prefix")[i]) if column("answer_prefix") is not None else "",
                int(batch["max_new_tokens"][i]),
            )
            for i in range(n)
        ]
        replies = [job.result() for job in jobs]
        # `attempt` is stamped when the rows are written (`records.prediction_table`)
        rows: dict[str, list] = {name: [] for name in PREDICTION_SCHEMA.names if name != "attempt"}
        for instance_id, reply in zip(batch["instance_id"], replies, strict=True):
            rows["instance_id"].append(str(instance_id))
            rows["model_id"].append(self.model_id)
            for key in ("output", "output_tokens", "finish_reason", "cached_prompt_tokens", "latency_s", "error"):
                rows[key].append(getattr(reply, key))
            rows["replica"].append(self.replica)
            rows["node"].append(self.node)
            rows["engine_step"].append(None)  # a server's batches are not ours to see
        return rows

    def record(self) -> dict[str, Any]:
        """The engine record (`engines/<record_name>` in the run root): settings and usage so far (the writer
        redacts it)."""
        return {
            "engine": "openai", "base_url": self.api.base_url, "mode": self.api.mode, "model": self.served_name,
            "concurrency": self.api.concurrency, "host": socket.gethostname(), "pid": os.getpid(),
            "usage": self.usage.record()}

    def request(self, ids: list[int], prompt: str, answer_prefix: str, max_new_tokens: int) -> Reply:
        """One instance, retried on transient failures; a final failure comes back as a Reply with an error."""
        began = time.perf_counter()
        attempts = {"n": 0}

        def send() -> Any:
            attempts["n"] += 1
            return self._send(ids, prompt, answer_prefix, max_new_tokens)

        retrying = Retrying(stop=stop_after_attempt(self.api.max_retries + 1), wait=wait_for,
                            retry=retry_if_exception(is_retryable), before_sleep=self._note_retry, reraise=True)
        try:
            response = retrying(send)
        except Exception as exc:  # per-request failures become data (counted, retried on the next run)
            self.usage.add(requests=attempts["n"], failed=1, seconds=time.perf_counter() - began)
            status = _status(exc)
            detail = f"{type(exc).__name__}{f' {status}' if status else ''}: {str(exc)[:300]}"
            log.warning("request failed after %d attempt(s): %s", attempts["n"], detail)
            return Reply("", 0, "error", 0, time.perf_counter() - began,
                         error=ErrorKind.ENGINE_ERROR.format(f"api {detail} (after {attempts['n']} attempts)"))
        choice = response.choices[0]
        text = choice.message.content if self.api.mode == "chat" else choice.text
        usage = response.usage
        cached = 0
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        if details is not None:
            cached = int(getattr(details, "cached_tokens", 0) or 0)
        completion_tokens = int(usage.completion_tokens) if usage and usage.completion_tokens is not None else 0
        self.usage.add(requests=attempts["n"], prompt_tokens=int(usage.prompt_tokens) if usage else 0,
                       completion_tokens=completion_tokens, cached_prompt_tokens=cached,
                       seconds=time.perf_counter() - began)
        return Reply(text or "", completion_tokens, str(choice.finish_reason or ""), cached,
                     time.perf_counter() - began)

    def _note_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        self.usage.add(retries=1, rate_limited=int(_status(exc) == 429))
        log.info("retrying after %s (attempt %d)", type(exc).__name__, state.attempt_number)

    def _send(self, ids: list[int], prompt: str, answer_prefix: str, max_new_tokens: int) -> Any:
        common = {"model": self.served_name, "max_tokens": max_new_tokens, "temperature": 0.0, "seed": 0}
        if self.api.mode == "completions":
            return self.client.completions.create(prompt=ids, **common)
        return self.client.chat.completions.create(messages=chat_messages(prompt, answer_prefix, self.api),
                                                   **common, **chat_extra(answer_prefix, self.api))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def _node_id() -> str:
    """The Ray node this actor runs on ("" outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def chat_messages(prompt: str, answer_prefix: str, api: ApiConfig) -> list[dict[str, str]]:
    """The user turn (the prompt without its answer prefix), and the prefix as a partial assistant turn."""
    text = prompt[: len(prompt) - len(answer_prefix)] if answer_prefix and prompt.endswith(answer_prefix) else prompt
    messages = [{"role": "user", "content": text}]
    if answer_prefix and api.continue_final_message:
        messages.append({"role": "assistant", "content": answer_prefix})
    return messages


def chat_extra(answer_prefix: str, api: ApiConfig) -> dict[str, Any]:
    """vLLM's request fields that make the model continue the assistant turn instead of opening a new one."""
    if answer_prefix and api.continue_final_message:
        return {"extra_body": {"continue_final_message": True, "add_generation_prompt": False}}
    return {}


__all__ = ["ApiPredictor", "Usage", "check_api", "chat_messages", "is_retryable", "retry_after_s"]
