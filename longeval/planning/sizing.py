"""Sizing before running: the disk, host memory, generation CPU and GPU time a planned suite takes on a cluster.

Pure arithmetic on a `Plan`, like `longeval.planning.capacity`: no Ray, no engine, no data. `longeval plan` prints it.
Every figure is a measured quantity times a count the plan knows (instances, shards, in-flight prompts), so each
line of the output can be checked by hand:

* **disk**: instances at the bytes per instance measured for their task and length (`TaskFigures`, from
  `sizing_figures.json`); predictions at their full output budget; scores; the instance cache's copy.
* **host memory**: the driver holds the suite's metadata (ids, lengths, references) and its predictions, never
  prompts; a replica holds the prompts in its engine (its in-flight window) and one instance shard read ahead;
  a generation actor holds what its tasks loaded (corpora) and the shard it is building. These are the bounds
  issue #22 sets for the data path: they grow with the work in flight and the number of instances, never with
  the suite's tokens.
* **generation CPU**: CPU-seconds per instance measured for each task and length, plus each actor's first
  instance of a cell (the warm-up of its caches), over `cluster.generate_parallelism` actors.
* **GPU time and wall time**: `longeval.planning.cost`'s roofline estimate of every call on its pool's replica shape,
  spread over the pool's GPUs; pools run one after the other, after generation.

The per-task figures come from `benchmarks/sizing_figures.py` (real shards from the real generator, committed
through `RunRoot.write_table`) with SmolLM2's tokenizer and the default essay corpus. Two things move them: a
tokenizer with longer tokens (Llama 3's) stores a little more text per token, and the default corpus is only
about 104K tokens long, so longer essay haystacks repeat it and compress better; a corpus that does not repeat
(`longeval data fetch-essays`) stores about 2.6-2.8 B per token (one essay instance per shard at 64K-96K, where
the default corpus does not repeat either) instead of the 1.6 B measured at 1M. A task without measurements
(those that need data files, plugins) is sized at the largest figure measured for any task, and `longeval plan`
names them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from longeval.config import Config, Dispatch, Engine
from longeval.planning.capacity import GIB, MIB, ModelArch, find_model_arch, kv_cache_tokens
from longeval.planning.cost import DEFAULT_GPU, Cost, call_cost, replica_shape
from longeval.planning.plan import Plan, Pool, size_pool, suite_seq_tokens
from longeval.stages.instance_cache import cache_uri
from longeval.store.row_group_reads import prompt_group_bytes
from longeval.tasks import get_task
from longeval.tasks.base import output_budget
from longeval.text.render import prompt_format

# -- measured figures ---------------------------------------------------------------------------------------

FIGURES_FILE = "sizing_figures.json"
"""The per-task tables, written by `benchmarks/sizing_figures.py --write` with the run's provenance."""


@dataclass(frozen=True)
class TaskFigures:
    """One task's measured costs per instance at the lengths it was measured at; linear in the length between
    them, the last segment's slope beyond, and the shortest length's value below (the figures grow with length).

    Measured, not fitted, because they are not linear: a shard's instances share their haystack, so short ones
    compress together within a Parquet page (an essay NIAH instance: 0.45 B per token at 32K, 2.1 at 128K), and
    beyond the default essay corpus's 104K tokens an instance repeats it (1.6 B per token at 1M).
    """

    lengths: tuple[int, ...]
    disk_bytes: tuple[float, ...]
    """Bytes on disk per instance (zstd Parquet as `RunRoot.write_table` commits it, in 25-instance shards)."""
    cpu_s: tuple[float, ...]
    """Generation CPU-seconds per instance, steady state."""
    warmup_cpu_s: tuple[float, ...]
    """What an actor's first instance of a (task, length) cell costs beyond a steady one (distractor pools,
    numbering tables)."""
    build_bytes_per_token: float
    """A generation actor's peak RSS above what the task keeps (`resident_bytes`), per token of the largest shard
    it built: a shard's rows stay Python objects (text and int lists) until the shard is encoded and written."""
    metadata_bytes: float
    """Arrow bytes per instance of every column but the prompt and its ids: what the driver holds per instance."""
    resident_bytes: float = 0.0
    """What the task keeps in a generation actor once it has built a shard: its corpora and caches (the essay
    split, word lists), for the rest of the actor's life."""

    def disk(self, length: int) -> float:
        return _interpolate(self.lengths, self.disk_bytes, length)

    def cpu(self, length: int) -> float:
        return _interpolate(self.lengths, self.cpu_s, length)

    def warmup(self, length: int) -> float:
        return _interpolate(self.lengths, self.warmup_cpu_s, length)

    @classmethod
    def from_json(cls, entry: dict) -> TaskFigures:
        return cls(lengths=tuple(entry["lengths"]), disk_bytes=tuple(entry["disk_bytes"]),
                   cpu_s=tuple(entry["cpu_s"]), warmup_cpu_s=tuple(entry["warmup_cpu_s"]),
                   build_bytes_per_token=entry["build_bytes_per_token"], metadata_bytes=entry["metadata_bytes"],
                   resident_bytes=entry.get("resident_bytes", 0.0))


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], x: int) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
            return max(0.0, ys[i - 1] + slope * (x - xs[i - 1]))
    return ys[0] * x / xs[0]  # one measured length: proportional beyond it


@cache
def _measured() -> tuple[str, dict[str, TaskFigures], dict[str, float]]:
    data = json.loads(resources.files("longeval.planning").joinpath(FIGURES_FILE).read_text(encoding="utf-8"))
    return (data["measured"], {task: TaskFigures.from_json(entry) for task, entry in data["tasks"].items()},
            data.get("families", {}))


def measured_on() -> str:
    """Where and how the per-task figures were measured."""
    return _measured()[0]


def task_figures() -> dict[str, TaskFigures]:
    """The measured figures by registry key (read once from `FIGURES_FILE`)."""
    return _measured()[1]


def family_resident() -> dict[str, float]:
    """What one actor keeps once it has built every measured task of a family (tasks share corpora, so this is
    less than the sum of their own `resident_bytes`)."""
    return _measured()[2]


def actor_resident_bytes(tasks: set[str]) -> float:
    """What a generation actor keeps once it has built shards of all of `tasks` (it builds any task of the suite):
    per family, the sum of its tasks' own figures, at most the family's measured whole; a task without figures
    adds the largest any task keeps."""
    known, whole, kept = task_figures(), family_resident(), 0.0
    for family in sorted({task.split("/")[0] for task in tasks}):
        members = [task for task in tasks if task.split("/")[0] == family]
        own = sum(known[task].resident_bytes for task in members if task in known)
        kept += min(own, whole.get(family, own))
        kept += sum(figures_for(task).resident_bytes for task in members if task not in known)
    return kept


def figures_for(task: str) -> TaskFigures:
    """`task`'s measured figures; for a task without any (data-file tasks, plugins), the largest of each figure
    over the measured tasks at every measured length: an upper bound."""
    known = task_figures()
    if task in known:
        return known[task]
    lengths = tuple(sorted({n for f in known.values() for n in f.lengths}))
    return TaskFigures(
        lengths=lengths,
        disk_bytes=tuple(max(f.disk(n) for f in known.values()) for n in lengths),
        cpu_s=tuple(max(f.cpu(n) for f in known.values()) for n in lengths),
        warmup_cpu_s=tuple(max(f.warmup(n) for f in known.values()) for n in lengths),
        build_bytes_per_token=max(f.build_bytes_per_token for f in known.values()),
        metadata_bytes=max(f.metadata_bytes for f in known.values()),
        resident_bytes=max(f.resident_bytes for f in known.values()),
    )


# Scalar figures, printed by the same run of benchmarks/sizing_figures.py (benchmarks/README.md, `sizing_figures.py`).

PYLIST_BYTES_PER_TOKEN = 40.9
"""A prompt's token ids as a list of Python ints, as `Replica._requests` builds them: 8 B pointers and 32 B int
objects (measured 14.0-40.9 B by tracemalloc; the low end is the noise haystack, whose ids are small ints Python
shares; essays and most tasks are at the top)."""
IDS_ARROW_BYTES_PER_TOKEN = 4.0
"""The `prompt_token_ids` column in Arrow: int32 (measured 4.00-4.01 with its offsets)."""
ENGINE_BYTES_PER_TOKEN = PYLIST_BYTES_PER_TOKEN + 8 + 4
"""What a vLLM engine holds per prompt token besides the replica's own list (vLLM 0.32, read from its code, not
measured): the engine core's decoded copy of the ids (another Python int list; on GPUs the core is a process of
its own), `Request._all_token_ids`, a copy of that list (8 B pointers; v1/request.py), and the detokenizer's
`DecodeStream` (u32 ids; v1/engine/detokenizer.py)."""
INPUT_BATCH_BYTES_PER_SLOT_TOKEN = 5
"""Each model worker's `InputBatch` keeps `token_ids_cpu` (int32) and `is_token_ids` (bool) of max_num_seqs x
max_model_len, whatever the prompts (vLLM 0.32 v1/worker/gpu_input_batch.py)."""
READ_AHEAD_SHARDS = 1
"""Instance shards a replica holds beyond the prompts in its engine: the one it takes its next prompts from (its
file's bytes and its ids in Arrow). The bound issue #22 sets; today's `Replica._requests` caches up to 32 whole
shards as Python lists."""
GENERATION_ACTOR_START_BYTES = 290 * MIB
"""A generation actor's RSS once started, before any shard: a Ray Data actor holding `ShardGenerator` (Ray's
worker, the imports, SmolLM2's tokenizer; measured in a real actor). What its tasks load comes on top
(`TaskFigures.resident_bytes`)."""
DRIVER_IMPORT_BYTES = 187 * MIB
"""A fresh process after importing Ray, Ray Data and the pipeline: the driver before any data (measured)."""
RAY_HEAD_BYTES = 8 * GIB // 10
"""Ray's own processes on the head node (GCS, raylet, dashboard): about 0.8 GB idle (measured for the environment
notes, Ray 2.60)."""
PREDICTION_ROW_DISK = 245
"""Bytes on disk per prediction row besides its output: ids, model, replica, node (measured in 25-row parts; the
line through output budgets 32 and 2,048)."""
PREDICTION_DISK_PER_OUTPUT_TOKEN = 1.23
"""Bytes on disk per output token: natural text (distinct stretches of the essay corpus), zstd (measured)."""
PREDICTION_ROW_ARROW = 178
"""Arrow bytes per prediction row besides its output (measured)."""
PREDICTION_ARROW_PER_OUTPUT_TOKEN = 4.32
"""Arrow bytes per output token: the output's UTF-8 text (measured)."""
SCORE_ROW_DISK = 7.8
"""Bytes on disk per score row (measured: 2,000 rows in one table, as the scores stage writes them)."""
SCORE_ROW_ARROW = 146.6
"""Arrow bytes per score row (measured)."""
def instance_cache_copies(cache: str) -> float:
    """Extra copies of the instances stage the instance cache keeps: none on a local disk, where the cache and the
    run root hard-link one file (`Location.copy`; measured +0.24 %, its folders), a whole one on S3, where a
    server-side copy is a second object."""
    return 1.0 if cache.startswith("s3://") else 0.0


# -- the result ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolSizing:
    """One engine pool: its in-flight window and host memory per replica, its GPU time and wall time."""

    name: str
    lengths: tuple[int, ...]
    replicas: int
    """Replicas the GPU time is spread over: the plan's, or without cluster.gpu those of the estimate's GPUs."""
    tensor_parallel_size: int
    calls: int
    """Prompts sent (lengths above max_model_len are recorded, not sent), follow-up calls included."""
    longest: int
    """The longest sequence the pool sends: min(its longest length, max_model_len)."""
    window: int | None
    """Prompts in each replica's engine at once (cluster.inflight, else max_num_seqs, twice that with static
    dispatch); None: unknown."""
    max_num_seqs: int | None
    read_ahead_bytes: int
    row_group_bytes: int
    """The prompt reader's cache of decoded row groups: `store.prompt_group_bytes` of the pool's largest context,
    or the pool's ids if less."""
    replica_bytes: int | None
    """Host memory a replica's data path holds: window x longest x bytes per token, read-ahead, row-group cache,
    input batch."""
    bytes_per_token: float
    """Per in-flight prompt token: the replica's list, and vLLM's copies (none for the stand-in engine)."""
    replicas_per_node: int
    cost: Cost | None
    wall_s: float | None


@dataclass(frozen=True)
class Sizing:
    """What a planned suite takes on its cluster. None where a figure cannot be given; `unknown` says why."""

    instances: int
    calls: int
    tokens: int
    """Target-length tokens of every instance (an upper bound on the prompts' tokens)."""
    stored_tokens: int
    """The same over every instance stored, follow-ups included: what the instances' bytes are spread over."""
    shards: int
    nodes: int
    instances_bytes: int
    predictions_bytes: int
    scores_bytes: int
    cache_bytes: int
    driver_bytes: int
    driver_parts: dict[str, int]
    generation_actor_parts: dict[str, int]
    generation_actor_bytes: int
    generation_actors: int
    generation_cpu_s: float
    generation_wall_s: float
    pools: tuple[PoolSizing, ...]
    gpu: str | None
    """The GPU preset the GPU figures are for (cluster.gpu, else `cost.DEFAULT_GPU`); None without GPU figures."""
    gpus: int
    unmeasured: tuple[str, ...] = ()
    """Tasks without measured figures, sized at the largest of any task's (`figures_for`)."""
    followup_tasks: tuple[str, ...] = ()
    """Two-call tasks, counted with one second call per instance (an upper bound)."""
    unknown: tuple[str, ...] = ()
    """Figures that cannot be given, each with why."""

    @property
    def disk_bytes(self) -> int:
        return self.instances_bytes + self.predictions_bytes + self.scores_bytes + self.cache_bytes

    @property
    def gpu_cost(self) -> Cost | None:
        costs = [p.cost for p in self.pools]
        if not costs or any(c is None for c in costs):
            return None
        return sum(costs, Cost())

    @property
    def inference_wall_s(self) -> float | None:
        walls = [p.wall_s for p in self.pools]
        return None if not walls or any(w is None for w in walls) else sum(walls)

    @property
    def wall_s(self) -> float | None:
        """Generation, then the pools one after the other (engine start-up and scoring left out)."""
        inference = self.inference_wall_s
        return None if inference is None else self.generation_wall_s + inference

    @property
    def replica_node_bytes(self) -> int | None:
        """The most any node's replicas hold at once: pools run one after the other."""
        known = [p.replica_bytes * p.replicas_per_node for p in self.pools if p.replica_bytes is not None]
        return max(known) if known else None

    @property
    def generation_node_bytes(self) -> int:
        """Generation actors on one node when Ray spreads them evenly over the nodes."""
        return self.generation_actor_bytes * math.ceil(self.generation_actors / self.nodes)


# -- the arithmetic -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cell:
    task: str
    length: int
    instances: int
    shards: int
    budget: int
    followup_budget: int
    """The second call's output budget for a two-call task; 0 for one call."""
    figures: TaskFigures


def _cells(cfg: Config, plan: Plan) -> list[_Cell]:
    fmt = prompt_format(cfg.model)
    grouped: dict[tuple[str, int], list[int]] = {}
    for shard in plan.shards:
        grouped.setdefault((shard.task, shard.target_length), []).append(shard.stop - shard.start)
    cells = []
    for (task, length), sizes in grouped.items():
        spec = get_task(task, cfg.suite.params)
        cells.append(_Cell(task, length, sum(sizes), len(sizes), output_budget(spec, fmt, length),
                           spec.followup_budget if spec.followup is not None else 0, figures_for(task)))
    return cells


def _largest_context(cells: list[_Cell]) -> int:
    """Prompt tokens of the largest context of these cells: the tasks that share a context group share one
    context per length (SYNC's), each of the others is a context of its own."""
    sharing: dict[tuple[str, int], int] = {}
    for c in cells:
        key = (get_task(c.task).context_group or c.task, c.length)
        sharing[key] = sharing.get(key, 0) + c.length
    return max(sharing.values(), default=0)


def _calls(cell: _Cell) -> int:
    return cell.instances * (2 if cell.followup_budget else 1)


def size_suite(cfg: Config, plan: Plan) -> Sizing:
    """Disk, host memory, generation CPU, GPU time and wall time of `plan` on `cfg.cluster` (see the module doc)."""
    cells = _cells(cfg, plan)
    unknown: list[str] = []
    arch = find_model_arch(cfg.model) if cfg.model.engine in (Engine.vllm, Engine.stand_in) else None
    if cfg.model.engine == "vllm" and arch is None:
        unknown.append(
            f"GPU-hours, wall time and replica memory: the architecture of {cfg.model.name!r} is unknown "
            f"({cfg.model.path!r} has no config.json here and model.architecture is empty), so its replica shape, "
            "KV cache and max_num_seqs are unknown; set model.architecture (see conf/model/llama31_8b.yaml)")
    elif cfg.model.engine == "openai":
        unknown.append("GPU-hours, wall time and replica memory: model.engine=openai runs the model behind an API")

    # Disk. A follow-up is one more instance and one more prediction at the same length (an upper bound).
    instances_bytes = sum(_calls(c) * c.figures.disk(c.length) for c in cells)
    predictions_bytes = sum(c.instances * _prediction_disk(c.budget) + (_calls(c) - c.instances)
                            * _prediction_disk(c.followup_budget) for c in cells)
    calls = sum(_calls(c) for c in cells)
    scores_bytes = plan.instances * SCORE_ROW_DISK
    cache_at = cache_uri(cfg.store.root, cfg.store.instance_cache)
    cache_bytes = instances_bytes * instance_cache_copies(cache_at) if cfg.store.cache_instances else 0

    # The driver: its process and Ray's, the scoring join (metadata + latest prediction per row) and the scores;
    # two-call tasks build their second calls' instances on the driver.
    driver_parts = {
        "process": DRIVER_IMPORT_BYTES,
        "Ray head": RAY_HEAD_BYTES,
        "metadata": round(sum(_calls(c) * c.figures.metadata_bytes for c in cells)),
        "predictions": round(sum(c.instances * _prediction_arrow(c.budget) + (_calls(c) - c.instances)
                                 * _prediction_arrow(c.followup_budget) for c in cells)),
        "scores": round(plan.instances * SCORE_ROW_ARROW),
    }
    followups = [c for c in cells if c.followup_budget]
    if followups:
        driver_parts["follow-up instances"] = round(sum(c.instances * c.length * c.figures.build_bytes_per_token
                                                        for c in followups))

    # Generation: every instance, plus each actor's first instance of each cell it builds.
    actors = max(1, cfg.cluster.generate_parallelism)
    cpu_s = sum(c.instances * c.figures.cpu(c.length) + min(actors, c.shards) * c.figures.warmup(c.length)
                for c in cells)
    shard_size = max((s.stop - s.start for s in plan.shards), default=0)
    actor_parts = {
        "start (Ray's worker, imports, tokenizer)": GENERATION_ACTOR_START_BYTES,
        "what the suite's tasks keep (corpora, caches)": round(actor_resident_bytes({c.task for c in cells})),
        "the largest shard being built": round(max(
            (min(shard_size, c.instances) * c.length * c.figures.build_bytes_per_token for c in cells), default=0)),
    }

    gpu_name = (cfg.cluster.gpu or DEFAULT_GPU) if arch is not None else None
    gpus = cfg.cluster.num_gpus if cfg.cluster.gpu else cfg.cluster.gpus_per_node
    nodes = max(1, math.ceil(cfg.cluster.num_gpus / cfg.cluster.gpus_per_node)) if cfg.cluster.gpu else 1
    pools = tuple(_size_pool(cfg, pool, [c for c in cells if c.length in pool.lengths], arch, gpu_name, gpus,
                             shard_size) for pool in plan.pools)
    if any(p.window is None for p in pools) and not unknown:
        unknown.append("replica memory: max_num_seqs is unknown until the engine starts (no KV-cache size: set "
                       "VLLM_CPU_KVCACHE_SPACE on CPU, or cluster.inflight)")
    return Sizing(
        instances=plan.instances, calls=calls, tokens=sum(c.instances * c.length for c in cells),
        stored_tokens=sum(_calls(c) * c.length for c in cells),
        shards=len(plan.shards), nodes=nodes,
        instances_bytes=round(instances_bytes), predictions_bytes=round(predictions_bytes),
        scores_bytes=round(scores_bytes), cache_bytes=round(cache_bytes),
        driver_bytes=sum(driver_parts.values()), driver_parts=driver_parts,
        generation_actor_bytes=sum(actor_parts.values()), generation_actor_parts=actor_parts,
        generation_actors=actors,
        generation_cpu_s=cpu_s, generation_wall_s=cpu_s / actors,
        pools=pools, gpu=gpu_name, gpus=gpus,
        unmeasured=tuple(sorted({c.task for c in cells if c.task not in task_figures()})),
        followup_tasks=tuple(sorted({c.task for c in followups})),
        unknown=tuple(unknown),
    )


def _size_pool(cfg: Config, pool: Pool, cells: list[_Cell], arch: ModelArch | None, gpu: str | None, gpus: int,
               shard_size: int) -> PoolSizing:
    """One pool's in-flight window, host memory per replica, GPU time and wall time."""
    sent = [c for c in cells if c.length <= pool.max_model_len]
    calls = sum(_calls(c) for c in sent)
    longest = min(max(pool.lengths), pool.max_model_len)
    # The stand-in engine's pools are sized as vLLM's (the replica asks the same planner), but it keeps no copy of
    # the ids and no input batch: `longeval plan` then predicts what `benchmarks/scale.py` measures.
    local_engine = cfg.model.engine in (Engine.vllm, Engine.stand_in)
    vllm = cfg.model.engine == Engine.vllm
    sized = size_pool(cfg, pool, suite_seq_tokens(cfg, pool)) if local_engine and arch else pool
    # A replica's window (`infer.Replica`): max_num_seqs when it pulls work (dynamic dispatch), twice that when it
    # runs a list of its own (static), so its engine never waits on the next prompt.
    per_slot = 1 if cfg.cluster.dispatch == Dispatch.dynamic else 2
    window = cfg.cluster.inflight or (per_slot * sized.max_num_seqs if sized.max_num_seqs else None)
    if window is not None:
        window = max(1, min(window, calls))

    # GPU time: the pool's planned shape, or without cluster.gpu the shape it would get on `gpus` default GPUs.
    replicas, tp, cost, wall = pool.replicas, pool.tensor_parallel_size, None, None
    if vllm and arch is not None and gpu is not None:  # the stand-in runs no model: no GPU time
        if pool.placement is not None:
            kv = kv_cache_tokens(cfg.model, placement=pool.placement)
        else:
            tp, kv = replica_shape(arch, gpu, cfg.model, pool.max_model_len, num_gpus=gpus,
                                   gpus_per_node=cfg.cluster.gpus_per_node)
            replicas = max(1, gpus // tp)
        cost = Cost()
        for c in sent:
            for budget in (c.budget, c.followup_budget) if c.followup_budget else (c.budget,):
                one = call_cost(arch, gpu, prompt_tokens=max(1, c.length - budget), output_tokens=budget,
                                tensor_parallel_size=tp, kv_cache_tokens=kv)
                cost += Cost(one.prefill_s * c.instances, one.decode_s * c.instances)
        wall = cost.gpu_seconds / (replicas * tp)

    # Host memory of one replica: the prompts in its engine, the shard it reads next, vLLM's input batch.
    biggest = max(sent, key=lambda c: c.figures.disk(c.length), default=None)
    read_ahead = 0
    if biggest is not None:
        rows = min(shard_size, biggest.instances)
        read_ahead = round(READ_AHEAD_SHARDS * rows * (biggest.figures.disk(biggest.length)
                                                       + biggest.length * IDS_ARROW_BYTES_PER_TOKEN))
    # The prompt reader's decoded row groups beyond the one being read: up to its budget (room for a few of the
    # pool's largest contexts, as the driver gives it), never more than the pool's prompts hold (so that shards a
    # replica's list interleaves are read once, `infer.PromptReader`).
    pool_ids = sum(c.instances * c.length * IDS_ARROW_BYTES_PER_TOKEN for c in sent)
    row_groups = round(min(prompt_group_bytes(_largest_context(sent)), pool_ids))
    replica_bytes = None
    per_token = PYLIST_BYTES_PER_TOKEN + (ENGINE_BYTES_PER_TOKEN if vllm else 0.0)
    if window is not None:
        seqs = sized.max_num_seqs or window
        in_engine = window * longest * per_token
        input_batch = (pool.tensor_parallel_size * seqs * pool.max_model_len * INPUT_BATCH_BYTES_PER_SLOT_TOKEN
                       if vllm else 0)
        replica_bytes = round(in_engine + read_ahead + row_groups + input_batch)
    per_node = (max(1, min(pool.replicas, cfg.cluster.gpus_per_node // pool.tensor_parallel_size))
                if pool.placement is not None else pool.replicas)
    return PoolSizing(name=pool.name, lengths=pool.lengths, replicas=replicas, tensor_parallel_size=tp, calls=calls,
                      longest=longest, window=window, max_num_seqs=sized.max_num_seqs, read_ahead_bytes=read_ahead,
                      row_group_bytes=row_groups, replica_bytes=replica_bytes, bytes_per_token=per_token,
                      replicas_per_node=per_node, cost=cost,
                      wall_s=wall)


def _prediction_disk(budget: int) -> float:
    return PREDICTION_ROW_DISK + PREDICTION_DISK_PER_OUTPUT_TOKEN * budget


def _prediction_arrow(budget: int) -> float:
    return PREDICTION_ROW_ARROW + PREDICTION_ARROW_PER_OUTPUT_TOKEN * budget


__all__ = ["PoolSizing", "Sizing", "TaskFigures", "figures_for", "measured_on", "size_suite", "task_figures"]
