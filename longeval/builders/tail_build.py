"""`longeval tail build`: a TAIL benchmark from the user's documents, with longeval's own engine (§3, Algorithm 1).

Every (domain, depth) is a slot of Algorithm 1 (`tasks.tail.qa`): ask for a question about the gold paragraph,
check that the generator answers it from that paragraph alone, check that it cannot answer it from the five
most similar other segments (all-MiniLM-L6-v2), up to five attempts per paragraph, then the preceding one. A
round sends the next call of every unfinished slot as one batch; the slots are saved after each round, so a
rerun with the same output folder resumes where the last finished round left off.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from longeval import __version__
from longeval.builders.complete import Completer, Request
from longeval.builders.embed import Embedder
from longeval.config import Config
from longeval.errors import ConfigError
from longeval.records import content_id
from longeval.store.run_root import RunRoot
from longeval.tasks.tail import (
    DEFAULT_DEPTHS,
    Stage,
    accepted_question,
    check_depths,
    initial_segments,
    load_domains,
    make_manifest,
    next_step,
    prompt_for,
    retrieval_query,
    retrieve,
    shuffle_options,
    start,
    write_tail_dataset,
)

STATE = "build/slots.pkl"
STATE_VERSION = 1


@dataclass(frozen=True)
class BuildResult:
    questions: int
    exhausted: int
    rounds: int
    reasons: dict[str, int]


def build_tail(cfg: Config, model_path: str, docs: str, out: str, *, depths: tuple[float, ...] = DEFAULT_DEPTHS,
               seed: int = 0, max_attempts: int = 5, question_tokens: int = 512, check_tokens: int = 64,
               progress=None) -> BuildResult:
    """Build (or resume building) the benchmark under `out`; returns what was made and why attempts failed."""
    depths = check_depths(depths, key="--depths")
    domains = {d.name: d for d in load_domains(docs, key="the documents folder")}
    root = RunRoot(out)
    slots = _resume(root, docs, depths, seed) if root.exists(STATE) else [
        start(name, depth, segment)
        for name, domain in domains.items()
        for depth, segment in zip(depths, initial_segments(domain.word_counts, depths, domain=name), strict=True)
    ]
    embedder = Embedder()
    vectors = {name: embedder.encode(domain.segments) for name, domain in domains.items()}
    completer = Completer(cfg, model_path) if any(not slot.done for slot in slots) else None
    try:
        rounds = _rounds(completer, slots, domains, vectors, embedder, max_attempts, question_tokens, check_tokens,
                         progress, save=lambda: _save(root, slots, docs, depths, seed))
    finally:
        if completer is not None:
            completer.close()
    return _write(cfg, root, out, slots, domains, seed, rounds)


def _rounds(completer, slots: list, domains: dict, vectors: dict, embedder, max_attempts: int, question_tokens: int,
            check_tokens: int, progress, save) -> int:
    """Algorithm 1, one batch of calls per round, until every slot is accepted or exhausted."""
    rounds = 0
    while any(not slot.done for slot in slots):
        rounds += 1
        active = [i for i, slot in enumerate(slots) if not slot.done]
        shown: dict[int, tuple[int, ...]] = {}
        requests = []
        for i in active:
            slot = slots[i]
            if slot.stage is Stage.RAG:
                query = embedder.encode([retrieval_query(slot.candidate)])[0]
                shown[i] = tuple(retrieve(query, vectors[slot.domain], exclude={slot.segment}))
            tokens = question_tokens if slot.stage is Stage.GENERATE else check_tokens
            text = prompt_for(slot, domains[slot.domain].segments, retrieved=shown.get(i, ()))
            requests.append(Request(content_id(i, rounds, slot.stage.value, slot.segment, slot.attempt), text, tokens))
        stages = Counter(slots[i].stage.value for i in active)
        label = f"round {rounds}: " + ", ".join(f"{n} {s}" for s, n in sorted(stages.items()))
        outputs = completer(requests, progress=progress, label=label)
        for i, req in zip(active, requests, strict=True):
            taken = {s.segment for j, s in enumerate(slots) if j != i and s.domain == slots[i].domain}
            slots[i] = next_step(slots[i], outputs[req.request_id], retrieved=shown.get(i, ()), taken=taken,
                                 max_attempts=max_attempts)
        save()
    return rounds


def _write(cfg: Config, root: RunRoot, out: str, slots: list, domains: dict, seed: int, rounds: int) -> BuildResult:
    rng = np.random.default_rng([seed, 0x5441494C])
    questions = [accepted_question(slot, domains[slot.domain], generator_model=cfg.model.name,
                                   question=shuffle_options(slot.question, rng))  # balanced answer letters
                 for slot in slots if slot.stage is Stage.ACCEPTED]
    manifest = make_manifest(generator_model=cfg.model.name, seed=seed, domains=list(domains.values()),
                             longeval=__version__, depths=sorted({s.depth for s in slots}))
    write_tail_dataset(out, questions, {name: d.segments for name, d in domains.items()}, manifest)
    attempts = [{"domain": s.domain, "depth": s.depth, "segment": a.segment, "attempt": a.number, "stage": a.stage,
                 "reason": a.reason, "outcome": s.stage.value} for s in slots for a in s.history]
    schema = pa.schema([("domain", pa.string()), ("depth", pa.float64()), ("segment", pa.int64()),
                        ("attempt", pa.int64()), ("stage", pa.string()), ("reason", pa.string()),
                        ("outcome", pa.string())])
    root.write_table("build", "attempts", pa.Table.from_pylist(attempts, schema=schema))
    reasons = Counter(a["reason"] or "accepted" for a in attempts)
    return BuildResult(len(questions), sum(s.stage is Stage.EXHAUSTED for s in slots), rounds, dict(reasons))


def _save(root: RunRoot, slots: list, docs: str, depths: tuple[float, ...], seed: int) -> None:
    """The slots after a round (pickled: our own frozen records, never model-written code)."""
    blob = pickle.dumps({"version": STATE_VERSION, "docs": docs, "depths": depths, "seed": seed, "slots": slots})
    root.write_bytes(STATE, blob)


def _resume(root: RunRoot, docs: str, depths: tuple[float, ...], seed: int) -> list:
    state = pickle.loads(root.read_bytes(STATE))
    if state.get("version") != STATE_VERSION or (state["docs"], tuple(state["depths"]), state["seed"]) != (
            docs, tuple(depths), seed):
        raise ConfigError(
            f"{root.path(STATE)} belongs to another build ({json.dumps({k: state.get(k) for k in ('docs', 'seed')})}, "
            f"depths {list(state.get('depths', []))}); use another output folder or delete it to start over"
        )
    return list(state["slots"])
