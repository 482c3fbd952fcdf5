"""A stand-in engine for scale work: no model runs, every prompt gets a canned answer at once.

No GPU model can read a 1M-token prompt on a CPU machine, yet the data path around the engine (dispatch, the
replicas' reads, the prediction writer, scoring, summaries, resume) must be measured at a full suite's size
(`benchmarks/scale.py`). `StandInEngine` sits behind the replica actor's engine interface (`info`, `stats`,
`stream`, `shutdown`, as `VllmEngine`) and answers from the instance itself: for about half the instances,
chosen by a hash of the instance id, all its references (what a perfect model would say, so RULER, SYNC and
Michelangelo's IDK and Latent List score 1 on them); for the rest `WRONG_ANSWER`, which scores 0. Scores are
then deterministic and neither all 0 nor all 1. MRCR scores 0 either way: its grader also wants the random
string from the instance's `meta`, which the engine does not get.

The references come with each request: the replica reads the `references` column beside the token ids when its
engine asks for them (`needs_references`), a small column of a file it reads anyway. (The alternative, the
engine looking them up in the run root by instance id, would add reads of its own to exactly the figures the
scale harness measures.)

It is selected only by `model.engine=stand_in`, never by default, and says what it is wherever it appears: its
log line, its engine record (`info["engine"]`), and the run's config.yaml. Its settings come from
`model.engine_kwargs` (`StandInSettings`), e.g. a pace that makes rows finish the way a busy engine's do.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

from longeval.config import ModelConfig
from longeval.engines.vllm_engine import IDLE_WAIT_S, EngineStats, GiveBack, Request, next_requests
from longeval.errors import ConfigError

log = logging.getLogger(__name__)

ENGINE_NAME = "stand_in"
WRONG_ANSWER = "stand-in engine: no answer"
"""What the stand-in says for the instances it gets wrong: matches no reference of any task."""
DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's own default, the in-flight window's base when the pool sets none."""


@dataclass(frozen=True)
class StandInSettings:
    """The stand-in's knobs, given as `model.engine_kwargs` (e.g. `+model.engine_kwargs.step_s=0.08`)."""

    right_fraction: float = 0.5
    """The share of instances answered with their references (by a hash of the instance id)."""
    step_s: float = 0.0
    """Seconds each engine step takes: 0 answers at once; a pace makes rows finish over time, as a real engine's do
    (the prediction writer commits what finished in each pause)."""
    rows_per_step: int = 0
    """Requests finished per step, oldest first; 0: every request in flight."""

    @classmethod
    def of(cls, model: ModelConfig) -> StandInSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(model.engine_kwargs) - known)
        if unknown:
            raise ConfigError(f"model.engine_kwargs has {', '.join(unknown)}, which the stand-in engine does not "
                              f"take; its settings: {', '.join(sorted(known))}")
        settings = cls(**{k: type(getattr(cls, k))(v) for k, v in model.engine_kwargs.items()})
        if not 0.0 <= settings.right_fraction <= 1.0 or settings.step_s < 0 or settings.rows_per_step < 0:
            raise ConfigError("stand-in engine: right_fraction must lie in [0, 1], step_s and rows_per_step must "
                              "be 0 or more")
        return settings


@dataclass
class StandInStats(EngineStats):
    """The engine's figures, plus what its replica process read and held (the scale harness reads them from the
    engine record)."""

    read_bytes: int = 0
    """Bytes the process read through read(2) while `stream` ran (/proc/self/io rchar), less the modules it
    imported meanwhile (`import_bytes`): on a local run root, what the replica read to feed the engine. S3 reads
    go over sockets and are not counted."""
    peak_rss_bytes: int = 0
    """The process's peak resident memory (VmHWM) when its last `stream` ended."""
    base_rss_bytes: int = 0
    """Its peak (VmHWM) when its first `stream` began, before any prompt: the replica's base (imports, Ray, the
    engine); `peak_rss_bytes` less this is what its prompts, reads and writes added."""

    def record(self) -> dict[str, float]:
        return {**super().record(), "read_bytes": self.read_bytes, "peak_rss_bytes": self.peak_rss_bytes,
                "base_rss_bytes": self.base_rss_bytes}


def proc_self(file: str, key: str) -> int:
    """A counter of this process from /proc/self/<file> (`io`: bytes; `status`: kB, returned in bytes); 0 where
    /proc is missing."""
    try:
        with open(f"/proc/self/{file}") as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name == key:
                    number = int(value.split()[0])
                    return number * 1024 if value.strip().endswith("kB") else number
    except OSError:
        pass
    return 0


def import_bytes() -> int:
    """Bytes Python read to import the modules loaded so far: each one's cached bytecode (or source), which the
    import system reads whole. Subtracted from rchar, what is left is what the process read as data."""
    total = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        path = getattr(spec, "cached", None) or getattr(spec, "origin", None)
        if path and path.endswith((".pyc", ".py")):
            with contextlib.suppress(OSError):
                total += os.path.getsize(path)
    return total


def answers_right(instance_id: str, fraction: float = 0.5) -> bool:
    """Whether the stand-in answers this instance with its references: a pure function of the id, so every run,
    replica and model name gets the same split."""
    digest = hashlib.sha256(instance_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def canned_output(request: Request, fraction: float = 0.5) -> str:
    """The stand-in's answer: the references, one a line, or `WRONG_ANSWER`."""
    if request.references and answers_right(request.instance_id, fraction):
        return "\n".join(request.references)
    return WRONG_ANSWER


class StandInEngine:
    """The replica's engine interface without a model (scale work only; see the module docstring)."""

    needs_references = True
    """The replica hands each request its references (`Request.references`)."""

    def __init__(self, model: ModelConfig, model_path: str, max_model_len: int) -> None:
        self.settings = StandInSettings.of(model)
        self.max_num_seqs = int(model.max_num_seqs or DEFAULT_MAX_NUM_SEQS)
        self.stats = StandInStats()
        self.give_back = GiveBack()
        self.info: dict[str, Any] = {
            "engine": ENGINE_NAME,
            "stand_in": "no model ran: canned answers for scale work (longeval.engines.stand_in), not a model's",
            "engine_start_s": 0.0, "host": socket.gethostname(), "pid": os.getpid(),
            "model_path": model_path, "max_model_len": max_model_len, "max_num_seqs": self.max_num_seqs,
            "settings": asdict(self.settings),
        }
        log.warning("STAND-IN ENGINE (model.engine=stand_in): no model runs; about %.0f%% of the prompts get their "
                    "references back, the rest a wrong answer. For scale work only.",
                    100 * self.settings.right_fraction)

    def check_rotary(self) -> None:
        """Nothing to check: no model runs, so no rotary embedding was built (`VllmEngine.check_rotary`)."""

    def stream(self, requests: Iterable[Request | None], *, inflight: int | None = None) -> Iterator[list[dict]]:
        """Run every request; after each step, yield the prediction rows that finished in it (as `VllmEngine`).

        `inflight` requests are held at once (default: twice `max_num_seqs`), so the replica reads ahead exactly
        as far as it does for vLLM.
        """
        window = max(1, inflight or 2 * self.max_num_seqs)
        per_step = self.settings.rows_per_step or window
        source = iter(requests)
        live: list[tuple[Request, float]] = []
        exhausted = False
        read_before = proc_self("io", "rchar") - import_bytes()
        self.stats.base_rss_bytes = self.stats.base_rss_bytes or proc_self("status", "VmHWM")
        while True:
            if due := set(self.give_back.due({req.instance_id for req, _ in live})):
                live = [(req, sent) for req, sent in live if req.instance_id not in due]
            new, exhausted = next_requests(source, window - len(live)) if not exhausted else ([], True)
            live += [(req, time.perf_counter()) for req in new]
            new = []  # `live` holds them now
            if not live and not exhausted:
                time.sleep(IDLE_WAIT_S)  # the source has nothing for now (dynamic dispatch holds it back)
                continue
            if not live:
                self.stats.read_bytes += proc_self("io", "rchar") - import_bytes() - read_before
                self.stats.peak_rss_bytes = proc_self("status", "VmHWM")
                return
            began = time.perf_counter()
            if self.settings.step_s:
                time.sleep(self.settings.step_s)
            now = time.perf_counter()
            self.stats.busy_s += now - began
            self.stats.steps += 1
            rows = [{**self._row(req, now - sent), "engine_step": self.stats.steps} for req, sent in live[:per_step]]
            live = live[per_step:]  # the finished requests' ids are let go before the next prompts are read
            yield rows

    def _row(self, req: Request, latency_s: float) -> dict:
        output = canned_output(req, self.settings.right_fraction)
        words = output.split()  # words stand in for tokens: the stand-in loads no tokenizer
        cut = len(words) > req.max_new_tokens
        if cut:  # the budget ends the answer, as it would a model's
            output, words = " ".join(words[:req.max_new_tokens]), words[:req.max_new_tokens]
        self.stats.requests += 1
        self.stats.output_tokens += len(words)
        self.stats.prompt_tokens += len(req.prompt_token_ids)
        return {"instance_id": req.instance_id, "output": output, "output_tokens": len(words),
                "finish_reason": "length" if cut else "stop", "cached_prompt_tokens": 0,
                "latency_s": round(latency_s, 4), "error": ""}

    def progress(self) -> dict[str, int]:
        """No request is part-way: the stand-in answers each whole in one step (`VllmEngine.progress`)."""
        return {}

    def reset(self) -> None:
        """Figures from zero for the next run (`VllmEngine.reset`)."""
        self.stats = StandInStats()
        self.give_back = GiveBack()

    def shutdown(self) -> None:
        """Nothing to free: no model, no engine process."""
