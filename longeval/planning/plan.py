"""Expand a config into shard specs and inference pools, without running anything.

A shard is `(task, target_length, seed, shard_index)` covering positions [start, stop) of its cell's
instances: the unit of parallel generation and of resume. Positions are instance indices, or with
`suite.shuffle` (adaptive runs) places in the cell's seeded random order (`cell_order`), so that any run of
consecutive shards is a simple random sample of the cell's instances. A pool is a contiguous bucket of lengths
served by engine replicas with one `max_model_len`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from longeval.config import Config, ModelConfig
from longeval.errors import ConfigError
from longeval.planning.capacity import (
    VLLM_MIN_DEFAULT_BATCHED_TOKENS,
    Placement,
    check_runnable,
    engine_block_size,
    get_gpu,
    kv_cache_tokens,
    model_arch,
    plan_bucket,
    size_for_throughput,
)
from longeval.stats.aggregate import EFFECTIVE_LENGTH_THRESHOLD
from longeval.store.location import Location
from longeval.store.shards import ShardName
from longeval.tasks import effective_thresholds, get_task, sampling


@dataclass(frozen=True)
class ShardSpec:
    task: str  # registry key, family/name
    target_length: int
    seed: int
    shard_index: int
    start: int
    stop: int
    shuffled: bool = False
    """[start, stop) are positions in `cell_order` (of `population` instances), not instance indices."""
    population: int = 0

    def indices(self) -> list[int]:
        """The instance indices this shard holds, in position order."""
        if not self.shuffled:
            return list(range(self.start, self.stop))
        group = get_task(self.task).context_group or self.task
        return cell_order(self.seed, group, self.target_length, self.population)[self.start:self.stop].tolist()

    @property
    def name(self) -> str:
        family, task = self.task.split("/")
        return ShardName(family, task, self.target_length, self.seed, self.shard_index).text

    def to_row(self) -> dict:
        return asdict(self)


@lru_cache(maxsize=256)
def cell_order(seed: int, group: str, target_length: int, population: int) -> np.ndarray:
    """A cell's instance indices 0..population-1 in a seeded random order (read-only).

    Generators cycle some parameters through the index (RULER's needle depth over 40 depths, SYNC's graph size,
    ...), so consecutive indices are not a random sample; an adaptive run's rounds take consecutive positions of
    this order instead. Tasks sharing contexts (`context_group`) share the order, so their rounds take the same
    contexts."""
    group_hash = int.from_bytes(hashlib.sha256(f"order:{group}".encode()).digest()[:8], "little")
    order = np.random.default_rng([seed, group_hash, target_length, population]).permutation(population)
    order.flags.writeable = False
    return order


@dataclass(frozen=True)
class Pool:
    """Engine replicas for a bucket of lengths."""

    name: str
    lengths: tuple[int, ...]
    max_model_len: int
    tensor_parallel_size: int
    replicas: int
    gpus_per_replica: float
    max_num_seqs: int | None = None
    """model.max_num_seqs when set; else sized by `size_pool` from the pool's prompts (GPU planning's worst case
    until then); None: vLLM's default."""
    max_num_batched_tokens: int | None = None
    """Chosen by GPU planning (cluster.gpu) or `size_pool`; None: model.max_num_batched_tokens."""
    placement: Placement | None = None
    """GPU planning's memory arithmetic and warnings; None without cluster.gpu."""

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.placement.warnings if self.placement is not None else ()

    def engine_overrides(self, model: ModelConfig) -> dict[str, int]:
        """The vLLM arguments this pool sets differently from `model`: merge them over the model's settings.

        Without GPU planning only max_model_len can differ (a pool of short lengths gets a short one).
        """
        chosen = {
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        return {k: v for k, v in chosen.items() if v is not None and v != getattr(model, k)}


@dataclass(frozen=True)
class Plan:
    shards: tuple[ShardSpec, ...]
    pools: tuple[Pool, ...]

    @property
    def instances(self) -> int:
        return sum(s.stop - s.start for s in self.shards)

    def check_fits(self) -> None:
        """Raise when GPU planning found a pool whose full-length sequence fits on no tensor-parallel size."""
        problems = [f"{p.name}: {p.warnings[0]}" for p in self.pools if p.placement and not p.placement.fits]
        if problems:
            raise ConfigError("; ".join(problems))


def make_plan(cfg: Config, *, check_data: bool = True) -> Plan:
    """The run's shards and pools.

    `check_data=False` skips the checks of data files and of the config (reading a finished run); before a run
    they refuse a missing data file and whatever `check_config` refuses.
    """
    if check_data:
        check_config(cfg)
    suite = cfg.suite
    data = suite.data
    shards: list[ShardSpec] = []
    for name in suite.tasks:
        spec = get_task(name, suite.params)
        for need in spec.needs:
            if check_data and not getattr(data, need):
                raise ConfigError(
                    f"task {spec.key} needs suite.data.{need}; give the file path, e.g. "
                    f"suite.data.{need}=/data/file.json, or drop the task from suite.tasks"
                )
        for length, samples in samples_per_length(cfg).items():
            for shard_index, start in enumerate(range(0, samples, suite.shard_size)):
                stop = min(samples, start + suite.shard_size)
                shards.append(ShardSpec(spec.key, length, suite.seed, shard_index, start, stop,
                                        shuffled=bool(suite.shuffle), population=samples if suite.shuffle else 0))
    return Plan(shards=tuple(shards), pools=tuple(make_pools(cfg)))


def check_config(cfg: Config) -> None:
    """Every check of a loaded config that needs no data file, no run root and no Ray: the run folder's name, the
    lengths against model.max_model_len and a model vLLM cannot load (rotary overrides included). `longeval check`,
    `plan` and `run` (through `make_plan`) all call this one list, so `check` passes nothing `run` refuses for
    the config alone."""
    check_run_name(cfg)
    check_lengths(cfg)
    if cfg.suite.adaptive:
        adaptive_threshold(cfg)
    if cfg.model.engine == "vllm":
        check_runnable(cfg.model)


def adaptive_threshold(cfg: Config) -> float:
    """The one threshold (points) an adaptive run decides its cells against: the suite's `effective_threshold`,
    or the one its families declare. Families declaring different ones need the suite to choose: a decision
    against one bar says nothing about another."""
    if cfg.suite.effective_threshold is not None:
        return float(cfg.suite.effective_threshold)
    own = effective_thresholds()
    bars = {get_task(name).family: own[get_task(name).family] for name in cfg.suite.tasks}
    if len(set(bars.values())) > 1:
        named = ", ".join(f"{family} {bar:g}" for family, bar in sorted(bars.items()))
        raise ConfigError(f"an adaptive run decides every cell against one effective-length threshold, and this "
                          f"suite's families declare several ({named}); set suite.effective_threshold=... or run "
                          "the families as separate suites")
    return next(iter(bars.values()), EFFECTIVE_LENGTH_THRESHOLD)


NAME_MAX = 255
"""Bytes per file name on common filesystems (ext4, XFS, btrfs, APFS), when the filesystem does not say."""


def check_run_name(cfg: Config) -> None:
    """Refuse a run folder name longer than the filesystem under store.root allows per name: else the first write
    fails with an `Errno 36` line that never names run_name. S3 has no such limit per name."""
    location = Location(cfg.run_root)
    if location.kind != "local":
        return
    folder = Path(location.base)
    size, limit = len(folder.name.encode("utf-8")), name_max(folder.parent)
    if size <= limit:
        return
    if cfg.run_name is not None:
        raise ConfigError(f"run_name is {len(cfg.run_name)} characters; the filesystem allows {limit} bytes per name "
                          f"(store.root {folder.parent}); shorten run_name")
    raise ConfigError(f"the default run name (model.name, suite, seed and suite hash) is {size} bytes; the filesystem "
                      f"allows {limit} bytes per name (store.root {folder.parent}); set a shorter run_name=...")


def name_max(path: Path) -> int:
    """The longest file name in bytes the filesystem holding `path` (or its nearest existing parent) allows."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return int(os.pathconf(folder, "PC_NAME_MAX"))
            except (OSError, ValueError):
                return NAME_MAX
    return NAME_MAX


def check_lengths(cfg: Config) -> None:
    """Refuse suite lengths the model cannot read, unless `suite.allow_too_long` asks to record them.

    A length counts input and output tokens (`input_tokens + max_new_tokens <= length`), so a length up to
    model.max_model_len always fits; above it, every instance would be a prompt_too_long scoring 0.
    """
    limit = cfg.model.max_model_len
    over = sorted(n for n in set(cfg.suite.lengths) if n > limit)
    if over and not cfg.suite.allow_too_long:
        raise ConfigError(
            f"suite.lengths has {over[-1]:,} tokens but {cfg.model.name}'s model.max_model_len is {limit:,}: "
            f"every instance at {', '.join(f'{n:,}' for n in over)} would be prompt_too_long and score 0. Use a "
            f"model that reads {over[-1]:,} tokens, drop those lengths from suite.lengths, or set "
            f"suite.allow_too_long=true to record them as prompt_too_long"
        )


def samples_per_length(cfg: Config) -> dict[int, int]:
    """`suite.samples` at every length, or the counts of the family that defines `suite.subsets`
    (Michelangelo's stacked subsets, §3.2)."""
    lengths = sorted(set(cfg.suite.lengths))
    scheme = sampling()
    if not cfg.suite.subsets or scheme is None:
        return {n: cfg.suite.samples for n in lengths}
    return dict(sorted(scheme.counts(lengths, cfg.suite.subsets, cfg.suite.samples).items()))


def make_pools(cfg: Config) -> list[Pool]:
    """Contiguous length buckets, each served by its own engine replicas with a fitting max_model_len.

    With `cluster.gpu` set (and an engine that runs on our GPUs), each bucket's tensor_parallel_size,
    replicas, max_num_seqs and max_num_batched_tokens come from the memory arithmetic in
    `longeval.planning.capacity`; without it, every pool takes them from the model and cluster config.
    """
    buckets = _length_buckets(cfg)
    if cfg.cluster.gpu is None or cfg.model.engine == "openai":
        return [
            Pool(
                name=f"pool{i}",
                lengths=tuple(bucket),
                max_model_len=min(cfg.model.max_model_len, max(bucket)),
                tensor_parallel_size=cfg.model.tensor_parallel_size,
                replicas=cfg.cluster.replicas,
                gpus_per_replica=cfg.cluster.gpus_per_replica,
            )
            for i, bucket in enumerate(buckets)
        ]
    gpu = get_gpu(cfg.cluster.gpu)
    arch = model_arch(cfg.model)
    pools = []
    for i, bucket in enumerate(buckets):
        placement = plan_bucket(arch, gpu, model=cfg.model, max_model_len=min(cfg.model.max_model_len, max(bucket)),
                                num_gpus=cfg.cluster.num_gpus, gpus_per_node=cfg.cluster.gpus_per_node)
        pools.append(Pool(
            name=f"pool{i}",
            lengths=tuple(bucket),
            max_model_len=placement.max_model_len,
            tensor_parallel_size=placement.tensor_parallel_size,
            replicas=placement.replicas,
            gpus_per_replica=float(placement.tensor_parallel_size),
            max_num_seqs=placement.max_num_seqs,
            max_num_batched_tokens=placement.max_num_batched_tokens,
            placement=placement,
        ))
    return pools


def size_pool(cfg: Config, pool: Pool, seq_tokens: Sequence[int]) -> Pool:
    """The pool with max_num_seqs and max_num_batched_tokens sized for its real sequences (`size_for_throughput`).

    `seq_tokens` are input_tokens + max_new_tokens of the instances the pool will run; those above its
    max_model_len are never sent and do not count. An explicit model.max_num_seqs wins. The pool comes back
    unchanged for an API engine, without sequences, or when the KV capacity is unknown (CPU without
    VLLM_CPU_KVCACHE_SPACE, or no config.json): vLLM then uses its own defaults.
    """
    model = cfg.model
    sent = [n for n in seq_tokens if n <= pool.max_model_len]
    if model.engine == "openai" or not sent:
        return pool
    capacity = kv_cache_tokens(model, placement=pool.placement)
    if capacity is None:
        return pool
    batched = pool.max_num_batched_tokens if pool.max_num_batched_tokens is not None else model.max_num_batched_tokens
    sized = size_for_throughput(capacity, sent, max_model_len=pool.max_model_len, batched_tokens=batched,
                                block_size=engine_block_size(model, on_gpu=pool.placement is not None))
    seqs = model.max_num_seqs or sized.max_num_seqs
    batched = sized.max_num_batched_tokens
    if seqs > (batched or VLLM_MIN_DEFAULT_BATCHED_TOKENS):  # vLLM refuses a prefill budget below max_num_seqs
        batched = seqs
    return replace(pool, max_num_seqs=seqs, max_num_batched_tokens=batched)


def suite_seq_tokens(cfg: Config, pool: Pool) -> list[int]:
    """The pool's sequences as the suite plans them, before any prompt exists: one per planned instance, at
    its target length (generators fill prompts to within a few tokens of it, output budget included)."""
    counts = samples_per_length(cfg)
    return [n for n in pool.lengths for _ in range(counts[n] * len(cfg.suite.tasks))]


def _length_buckets(cfg: Config) -> list[list[int]]:
    """The suite's lengths split at cluster.bucket_edges (a length equal to an edge goes below it)."""
    lengths = sorted(set(cfg.suite.lengths))
    edges = sorted(set(cfg.cluster.bucket_edges))
    buckets: list[list[int]] = [[] for _ in range(len(edges) + 1)]
    for length in lengths:
        buckets[sum(length > e for e in edges)].append(length)
    return [b for b in buckets if b]


PlanKey = tuple[str, int, int, int]
"""An instance's place in a plan: family/task, target length, seed, index."""


def planned_keys(cfg: Config) -> set[PlanKey]:
    """Every instance the current config plans, by its place (`in_plan`'s test, kept by callers that filter
    many tables)."""
    plan = make_plan(cfg, check_data=False)
    return {(s.task, s.target_length, s.seed, i) for s in plan.shards for i in s.indices()}


def in_plan(cfg: Config, instances: pa.Table, keys: set[PlanKey] | None = None) -> pa.Table:
    """Only the instances the current config plans: a run root reused with fewer tasks, lengths or samples keeps
    the other rows on disk, but they never reach the scores or the summaries."""
    keys = planned_keys(cfg) if keys is None else keys
    family_task = [f"{f}/{t}" for f, t in zip(instances["family"].to_pylist(), instances["task"].to_pylist(),
                                               strict=True)]
    mask = [(ft, length, seed, index) in keys for ft, length, seed, index in zip(
        family_task, instances["target_length"].to_pylist(), instances["seed"].to_pylist(),
        instances["index"].to_pylist(), strict=True)]
    return instances.filter(pa.array(mask, pa.bool_()))
