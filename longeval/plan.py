"""Expand a config into shard specs and inference pools, without running anything.

A shard is `(task, target_length, seed, shard_index)` covering instance indices [start, stop): the unit
of parallel generation and of resume. A pool is a contiguous bucket of lengths served by engine
replicas with one `max_model_len`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from longeval.capacity import Placement, get_gpu, model_arch, plan_bucket
from longeval.config import Config, ModelConfig
from longeval.errors import ConfigError
from longeval.tasks import get_task


@dataclass(frozen=True)
class ShardSpec:
    task: str  # registry key, family/name
    target_length: int
    seed: int
    shard_index: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        family, task = self.task.split("/")
        return f"{family}.{task}.L{self.target_length}.s{self.seed}.{self.shard_index:05d}"

    def to_row(self) -> dict:
        return asdict(self)


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
    """Chosen by GPU planning (cluster.gpu); None: model.max_num_seqs."""
    max_num_batched_tokens: int | None = None
    """Chosen by GPU planning (cluster.gpu); None: model.max_num_batched_tokens."""
    placement: Placement | None = None
    """GPU planning's memory arithmetic and warnings; None without cluster.gpu."""

    def kv_cache_gib(self, kv_bytes_per_token: int | None) -> float | None:
        """KV memory one full-length sequence needs (layers x kv_heads x head_dim x 2 x 2 bytes per token)."""
        return None if kv_bytes_per_token is None else kv_bytes_per_token * self.max_model_len / 2**30

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
    """The run's shards and pools; `check_data=False` skips the data-file checks (reading a finished run)."""
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
                shards.append(ShardSpec(spec.key, length, suite.seed, shard_index, start, stop))
    return Plan(shards=tuple(shards), pools=tuple(make_pools(cfg)))


def samples_per_length(cfg: Config) -> dict[int, int]:
    """`suite.samples` at every length, or the stacked subsets' counts (Michelangelo §3.2)."""
    lengths = sorted(set(cfg.suite.lengths))
    if not cfg.suite.subsets:
        return {n: cfg.suite.samples for n in lengths}
    from longeval.tasks.michelangelo.stratify import stacked_counts

    return dict(sorted(stacked_counts(lengths, cfg.suite.subsets, cfg.suite.samples).items()))


def make_pools(cfg: Config) -> list[Pool]:
    """Contiguous length buckets, each served by its own engine replicas with a fitting max_model_len.

    With `cluster.gpu` set (and an engine that runs on our GPUs), each bucket's tensor_parallel_size,
    replicas, max_num_seqs and max_num_batched_tokens come from the memory arithmetic in
    `longeval.capacity`; without it, every pool takes them from the model and cluster config.
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


def _length_buckets(cfg: Config) -> list[list[int]]:
    """The suite's lengths split at cluster.bucket_edges (a length equal to an edge goes below it)."""
    lengths = sorted(set(cfg.suite.lengths))
    edges = sorted(set(cfg.cluster.bucket_edges))
    buckets: list[list[int]] = [[] for _ in range(len(edges) + 1)]
    for length in lengths:
        buckets[sum(length > e for e in edges)].append(length)
    return [b for b in buckets if b]
