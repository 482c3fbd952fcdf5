"""What `longeval plan` prints: the shards per task and length, each inference pool's shape (and on GPUs, the
memory arithmetic behind it), and the suite's sizing (disk, memory, generation CPU, GPU and wall time).

The command line hands in its console (`longeval.cli.cmd_plan`); the figures come from `longeval.planning.plan`,
`capacity`, `sizing` and `cost`, which print nothing.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from longeval.config import Config
from longeval.errors import ConfigError
from longeval.planning import sizing
from longeval.planning.capacity import find_model_arch, format_bytes, kv_cache_dtype_bytes, kv_cache_tokens
from longeval.planning.plan import Plan, check_config, make_plan, size_pool, suite_seq_tokens
from longeval.tasks import get_task

__all__ = ["print_plan"]


def print_plan(cfg: Config, console: Console) -> None:
    """The plan of the run `cfg` names, checked as a run would check it (`plan.check_config`), on `console`."""
    check_config(cfg)  # a length the model cannot read, or a model vLLM cannot load, is refused here as in a run
    try:
        make_plan(cfg)
    except ConfigError as exc:  # planning needs no data files; the run will, so say so and go on
        console.print(f"[yellow]before running:[/] {exc}")
    plan = make_plan(cfg, check_data=False)
    console.print(f"run root -> {cfg.run_root}", soft_wrap=True)
    table = Table(title=f"plan: {plan.instances} instances in {len(plan.shards)} shards")
    for col in ("task", "length", "shards", "instances", "output budget"):
        table.add_column(col)
    groups: dict[tuple[str, int], list] = {}
    for shard in plan.shards:
        groups.setdefault((shard.task, shard.target_length), []).append(shard)
    for (task, length), shards in groups.items():
        table.add_row(task, str(length), str(len(shards)), str(sum(s.stop - s.start for s in shards)),
                      str(get_task(task, cfg.suite.params).max_new_tokens))
    console.print(table)

    arch = find_model_arch(cfg.model)
    for pool in plan.pools:
        p = pool.placement
        # Sized from the suite's lengths here; a run sizes each pool again from its prompts' real lengths.
        sized = size_pool(cfg, pool, suite_seq_tokens(cfg, pool))
        if cfg.model.max_num_seqs:
            seqs_note = f"{cfg.model.max_num_seqs} (model.max_num_seqs)"
        elif sized.max_num_seqs is not None:
            seqs_note = f"{sized.max_num_seqs} (sized from the suite lengths; at run time from the prompts)"
        else:
            seqs_note = "vLLM's default (KV cache unknown until the engine starts: set VLLM_CPU_KVCACHE_SPACE)"
        if p is None:
            console.print(f"pool {pool.name}: lengths {list(pool.lengths)}, max_model_len {pool.max_model_len}, "
                          f"{pool.replicas} replica(s) x TP {pool.tensor_parallel_size}, "
                          f"{pool.gpus_per_replica} GPU(s) per replica")
            if arch is not None:
                kv = arch.kv_bytes_per_token(kv_cache_dtype_bytes(cfg.model, arch))
                console.print(f"  KV cache {kv:,} bytes/token ({format_bytes(kv)}), "
                              f"{format_bytes(kv * pool.max_model_len)} per sequence of {pool.max_model_len:,} tokens")
            if cfg.model.engine == "vllm":
                capacity = kv_cache_tokens(cfg.model, arch)
                room = f"KV cache {capacity:,} tokens per replica, " if capacity is not None else ""
                console.print(f"  {room}max_num_seqs {seqs_note}")
        else:
            gpus = p.tensor_parallel_size * p.replicas
            rows = [
                ("lengths", ", ".join(map(str, pool.lengths))),
                ("tensor_parallel_size", str(p.tensor_parallel_size)),
                ("replicas", f"{p.replicas} ({gpus} of {cfg.cluster.num_gpus} GPUs)"),
                ("max_model_len", f"{p.max_model_len:,}"),
                ("max_num_seqs", seqs_note),
                ("max_num_batched_tokens", f"{sized.max_num_batched_tokens or p.max_num_batched_tokens:,}"),
                ("KV cache per token", f"{p.kv_bytes_per_token:,} B ({format_bytes(p.kv_bytes_per_token)})"),
                ("KV cache per sequence", format_bytes(p.kv_bytes_per_sequence)),
                ("memory per replica", f"{p.tensor_parallel_size} x {format_bytes(p.budget_bytes_per_gpu)} = "
                                       f"{format_bytes(p.tensor_parallel_size * p.budget_bytes_per_gpu)}"),
                ("weights per GPU", format_bytes(p.weight_bytes_per_gpu)),
                ("activations + overhead per GPU", format_bytes(p.reserve_bytes_per_gpu)),
                ("KV memory per replica",
                 f"{format_bytes(p.kv_bytes_per_replica)} ({p.kv_tokens_per_replica:,} tokens)"),
                ("full-length sequences that fit", str(p.sequences_fit)),
            ]
            pool_table = Table(title=f"{pool.name} on {p.gpu.label} (gpu_memory_utilization "
                                     f"{cfg.model.gpu_memory_utilization:g})")
            pool_table.add_column("setting")
            pool_table.add_column("value")
            for row in rows:
                pool_table.add_row(*row)
            console.print(pool_table)
            for warning in p.warnings:
                console.print(Text(f"  warning: {warning}", style="yellow"))
        over = [n for n in pool.lengths if n > pool.max_model_len]
        if over:
            console.print(f"  lengths {over} exceed the model's max_model_len: recorded as prompt_too_long "
                          f"(suite.allow_too_long)")
    _print_sizing(cfg, plan, console)


def _print_sizing(cfg: Config, plan: Plan, console: Console) -> None:
    """The sizing block (`longeval.planning.sizing`): disk, host memory per node, generation CPU, GPU time and wall
    time, each with the arithmetic behind it, and the figures it cannot give with why."""
    size = format_bytes

    s = sizing.size_suite(cfg, plan)
    shape = (f"{cfg.cluster.num_gpus} x {cfg.cluster.gpu} on {s.nodes} node(s)" if cfg.cluster.gpu
             else f"cluster {cfg.cluster.name} (no cluster.gpu)")
    table = Table(title=f"sizing: {s.instances:,} instances, {s.tokens:,} tokens, {s.shards:,} shards, {shape}")
    for col in ("figure", "value", "arithmetic"):
        table.add_column(col, overflow="fold")
    table.add_row("disk: instances", size(s.instances_bytes),
                  f"{s.calls:,} instances x bytes per instance, measured per task and length (longeval/"
                  f"{sizing.FIGURES_FILE}): {s.instances_bytes / max(1, s.stored_tokens):.2f} B per token on average")
    table.add_row("disk: predictions", size(s.predictions_bytes),
                  f"{s.calls:,} rows x ({sizing.PREDICTION_ROW_DISK} B + {sizing.PREDICTION_DISK_PER_OUTPUT_TOKEN} B "
                  "per token of their full output budget)")
    table.add_row("disk: scores", size(s.scores_bytes), f"{s.instances:,} rows x {sizing.SCORE_ROW_DISK} B")
    table.add_row("disk: instance cache", size(s.cache_bytes),
                  "a second copy of the instances (store.cache_instances on S3: server-side copies)" if s.cache_bytes
                  else "hard links to the run root's files (local disk), or store.cache_instances=false")
    table.add_row("disk: total", size(s.disk_bytes), "")
    table.add_row("memory: driver", size(s.driver_bytes),
                  " + ".join(f"{name} {size(n)}" for name, n in s.driver_parts.items())
                  + f" ({s.calls:,} rows of metadata, predictions and scores; never prompts)")
    for p in s.pools:
        label = f"memory: replica, {p.name} (<= {p.longest:,} tokens)"
        if p.replica_bytes is None:
            table.add_row(label, "unknown", "max_num_seqs unknown (below)")
            continue
        per_slot = "" if cfg.cluster.dispatch == "dynamic" else "2 x "
        seqs = f" ({per_slot}max_num_seqs {p.max_num_seqs})" if p.max_num_seqs and not cfg.cluster.inflight else ""
        copies, batch = (("the replica's and vLLM's copies of the ids", " + vLLM's input batch")
                         if cfg.model.engine == "vllm" else ("the replica's copy of the ids", ""))
        table.add_row(label, size(p.replica_bytes),
                      f"{p.window} prompts in flight{seqs} x {p.longest:,} tokens x {p.bytes_per_token:.1f} B "
                      f"({copies}) + one shard read ahead {size(p.read_ahead_bytes)} + decoded row groups "
                      f"{size(p.row_group_bytes)}{batch}; {p.replicas_per_node} per node")
    table.add_row("memory: generation actor", size(s.generation_actor_bytes),
                  " + ".join(f"{name} {size(n)}" for name, n in s.generation_actor_parts.items())
                  + f"; {s.generation_actors} actors (cluster.generate_parallelism)")
    replicas = s.replica_node_bytes
    busiest = max(replicas or 0, s.generation_node_bytes)
    phases = (f"replicas {size(replicas) if replicas is not None else 'unknown'} or generation actors "
              f"{size(s.generation_node_bytes)}, never at once; engine processes' own memory (CUDA, torch) not counted")
    table.add_row("memory: head node, at most", size(busiest + s.driver_bytes), f"the driver + {phases}")
    if s.nodes > 1:
        table.add_row("memory: other nodes, at most", size(busiest), phases)
    table.add_row("generation", _hours(s.generation_cpu_s, "CPU-h"),
                  f"CPU-seconds per instance measured per task and length, + each actor's warm-up per cell; "
                  f"{_hours(s.generation_wall_s, 'h')} on {s.generation_actors} actors")
    for p in s.pools:
        if p.cost is not None and p.wall_s is not None:
            table.add_row(f"GPU: {p.name} ({', '.join(f'{n:,}' for n in p.lengths)})", _hours(p.cost.gpu_seconds,
                          "GPU-h"), f"{p.calls:,} calls on {p.replicas} replica(s) x TP {p.tensor_parallel_size}: "
                          f"{_hours(p.wall_s, 'h')} wall")
    cost, wall = s.gpu_cost, s.wall_s
    if cost is not None and wall is not None:
        table.add_row(f"GPU: total on {s.gpu}", _hours(cost.gpu_seconds, "GPU-h"),
                      f"prefill {_hours(cost.prefill_s, 'GPU-h')} + decode {_hours(cost.decode_s, 'GPU-h')} "
                      "(longeval.planning.cost, every call at its length and full output budget)")
        table.add_row("wall time", _hours(wall, "h"),
                      f"generation {_hours(s.generation_wall_s, 'h')} + the pools one after the other "
                      f"{_hours(wall - s.generation_wall_s, 'h')} (engine start-up and scoring not counted)")
    console.print(table)
    for why in s.unknown:
        console.print(Text(f"  cannot size: {why}", style="yellow"))
    if s.unmeasured:
        console.print(f"  no measured figures for {', '.join(s.unmeasured)}: sized at the largest figure measured for "
                      "any task (an upper bound)")
    if s.followup_tasks:
        console.print(f"  two-call tasks ({', '.join(s.followup_tasks)}): every instance counted with its second call "
                      "at the same length (an upper bound)")
    if cfg.suite.adaptive:
        console.print("  suite.adaptive: a cell stops once its interval decides, so these are the run's upper bounds")
    if cfg.cluster.gpu is None and cost is not None:
        console.print(f"  GPU figures as if on {s.gpus} x {s.gpu} (cluster.gpu is unset; cluster=<GPU preset> sizes "
                      "the real shape)")
    console.print(f"  measured: {sizing.measured_on()}; the arithmetic: longeval/planning/sizing.py, "
                  "docs/operations.md (Sizing)")
    if cost is not None:
        console.print(f"estimated GPU time on {s.gpu}: {cost.gpu_hours:,.2f} GPU-hours ({cost.prefill_s / 3600:,.2f} "
                      f"prefill, {cost.decode_s / 3600:,.2f} decode), every prompt at its length and full output "
                      "budget (longeval.planning.cost: a roofline estimate, good to about 1.5x)")


def _hours(seconds: float, unit: str) -> str:
    """Hours with two decimals, and minutes or seconds beside them when under an hour: `0.13 CPU-h (8 min)`."""
    if seconds >= 3600:
        return f"{seconds / 3600:,.2f} {unit}"
    return f"{seconds / 3600:.2f} {unit} ({seconds / 60:.0f} min)" if seconds >= 60 else \
        f"{seconds / 3600:.2f} {unit} ({seconds:.0f} s)"
