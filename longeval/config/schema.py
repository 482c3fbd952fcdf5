"""The run configuration's schema: Python dataclasses, with its values in YAML groups under conf/.

Hydra composes `conf/config.yaml` with the chosen groups and the user's overrides (`longeval.config.load`);
OmegaConf checks every key and type against this schema before any work starts (`longeval.config.validation`),
so a typo fails at once and names the key and its choices. Settings with a fixed set of values are `StrEnum`s,
so OmegaConf checks them too; a member equals its string (`cfg.model.engine == "openai"`) and config.yaml stores
the plain string.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING, OmegaConf

from longeval.errors import ConfigError

__all__ = [
    "ADAPTIVE_ALPHA_SPLITS",
    "ADAPTIVE_SHARD_SIZE",
    "ADAPTIVE_TARGETS",
    "GROUP_ALPHA_SPLIT",
    "GROUP_GROWTH",
    "GROUP_ROUND_MAX",
    "GROUP_SHARD_SIZE",
    "GROUP_STEP",
    "SCHEDULE_BEFORE",
    "SHARD_SIZE",
    "ApiConfig",
    "ApiMode",
    "ClusterConfig",
    "Config",
    "DataConfig",
    "Dispatch",
    "Engine",
    "ModelConfig",
    "StoreConfig",
    "SuiteConfig",
    "TrackingBackend",
    "TrackingConfig",
    "TrackingMode",
    "suite_hash",
]

# Members are named by their values: OmegaConf reads an enum setting by member name (`model.engine=openai`).


class Dispatch(StrEnum):
    """`cluster.dispatch`: how a pool's prompts reach its replicas (longeval/stages/infer/dispatch.py)."""

    dynamic = "dynamic"
    """One work queue per pool; each replica takes the next context whenever its engine has a free slot, so a
    slow or restarted replica leaves no other idle. Placement depends on timing."""
    static = "static"
    """Each replica gets a fixed list up front (costs balanced, contexts whole): the same rows always run
    on the same replica in the same order, for runs that need fixed placement."""


class Engine(StrEnum):
    """`model.engine`: how the model is run."""

    vllm = "vllm"
    """In-process vLLM engine actors."""
    openai = "openai"
    """An OpenAI-compatible server (see `model.api`)."""
    stand_in = "stand_in"
    """For scale work only, never a default: no model runs, each prompt gets a canned answer at once (its
    references for about half the instances, a wrong answer for the rest; `longeval.engines.stand_in`), so the
    data path can be measured at a full suite's size (`benchmarks/scale.py`). Scores are not a model's."""


class ApiMode(StrEnum):
    """`model.api.mode`: which endpoint of the OpenAI-compatible server is called."""

    chat = "chat"
    """/chat/completions with the task text as a message."""
    completions = "completions"
    """/completions with the rendered prompt."""


class TrackingBackend(StrEnum):
    """`tracking.backend`: where a job's results go besides its run root."""

    none = "none"
    wandb = "wandb"


class TrackingMode(StrEnum):
    """`tracking.mode`: W&B's mode."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass
class ApiConfig:
    """An OpenAI-compatible server (a remote `vllm serve` or a hosted model), for `model.engine=openai`."""

    base_url: str | None = None
    """e.g. http://127.0.0.1:8000/v1"""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the key; the key itself never enters the config."""
    model: str | None = None
    """The served model name; default: model.name."""
    mode: ApiMode = ApiMode.chat
    """`chat` (/chat/completions) or `completions` (/completions with the rendered prompt)."""
    concurrency: int = 8
    """Requests in flight per engine actor."""
    timeout_s: float = 600.0
    """Per request; long prompts take minutes to prefill."""
    continue_final_message: bool = True
    """Chat mode: send the answer prefix as a partial assistant turn (vLLM's continue_final_message); turn
    off for servers without that extension (the prefix is then dropped)."""
    max_retries: int = 5


@dataclass
class ModelConfig:
    """The evaluated model and its engine settings (vLLM keyword arguments where names match)."""

    name: str = MISSING
    path: str = MISSING
    """A local HF folder, or `packaged:smollm2` / `packaged:tiny-random` for the models built by setup."""
    chat_template: bool = True
    answer_prefix: bool = True
    system_prompt: str | None = None
    reasoning: bool = False
    prompt_format: str = "chat"
    """`chat`: the task text as a user turn of the model's own chat template (`chat_template=false`: the
    plain text), the default. `ruler`: RULER's per-model template `ruler_template` around the task text,
    answer prefix appended, as RULER's `prepare.py` does, for reproducing RULER's numbers."""
    ruler_template: str = "base"
    """With `prompt_format=ruler`: the name of RULER's template (scripts/data/template.py): base, meta-chat,
    vicuna-chat, lwm-chat, command-r-chat, chatglm-chat, RWKV, Phi3, meta-llama3, jamba, nemotron5-instruct."""
    max_model_len: int = 8192
    """The model's usable context. A suite length above it is refused at plan time (`suite.allow_too_long`
    records those instances as prompt_too_long instead); longer prompts are never sent."""
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = None
    """Sequences an engine runs at once. None: sized per pool from its KV cache and its prompts' lengths
    (`longeval.planning.capacity.size_for_throughput`); a number is passed to vLLM as given."""
    max_num_batched_tokens: int | None = None
    """Prefill tokens per engine step (chunked prefill). None: GPU planning's choice, else vLLM's default."""
    gpu_memory_utilization: float = 0.9
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra `vllm.LLM` arguments (e.g. hf_overrides for rope scaling)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for the engine process (e.g. VLLM_CPU_KVCACHE_SPACE, VLLM_ATTENTION_BACKEND)."""
    batch_invariant: bool = False
    """vLLM's batch-invariant kernels (`VLLM_BATCH_INVARIANT=1`): a prompt's greedy output then does not depend
    on which prompts share its batch, so outputs repeat with dynamic dispatch and several replicas. vLLM 0.32 has
    them on CUDA GPUs (Ampere such as A100/A40 through Triton matmuls, Hopper and Blackwell through cuBLAS
    settings), ROCm and XPU, at some cost in speed; vllm-cpu has none (docs/architecture.md, "Greedy outputs
    that repeat")."""
    architecture: dict[str, Any] = field(default_factory=dict)
    """The model's shapes for GPU planning (`longeval plan` with cluster.gpu), named as in its config.json:
    num_hidden_layers, num_key_value_heads, head_dim, max_position_embeddings, rope_scaling, rope_parameters,
    rope_theta (the base the rope check holds an hf_overrides rope dict to), model_type,
    dual_chunk_attention_config, num_attention_heads, hidden_size, intermediate_size, vocab_size,
    tie_word_embeddings, torch_dtype, plus num_parameters_b (billions; default: counted from the shapes).
    Wins key by key over `<model.path>/config.json`, so presets plan without the weights at hand."""
    engine: Engine = Engine.vllm
    """`vllm` (in-process engine actors) or `openai` (an OpenAI-compatible server, see `api`); `stand_in` is for
    scale work only (no model runs, see `Engine.stand_in`)."""
    api: ApiConfig = field(default_factory=lambda: ApiConfig())


@dataclass
class DataConfig:
    essay_dir: str | None = None
    """A folder of .txt essays for the essay haystack; default: the pinned CPython docs corpus."""
    squad_path: str | None = None
    """SQuAD v2.0 dev JSON for ruler/qa_1."""
    hotpotqa_path: str | None = None
    """HotpotQA dev (distractor) JSON for ruler/qa_2."""
    longbench_v2_path: str | None = None
    """LongBench v2 data.json (or JSONL / Parquet), local or s3://, for longbench_v2."""


SHARD_SIZE = 25
ADAPTIVE_SHARD_SIZE = 10
"""An adaptive run's default round: one shard of 10 per open cell (benchmarks/README.md, `adaptive.py`)."""
ADAPTIVE_TARGETS = ("tasks", "groups", "suite")
ADAPTIVE_ALPHA_SPLITS = ("equal", "length")
GROUP_SHARD_SIZE = 2
"""A group target's (`suite.adaptive_target=suite|groups`) default shard: small, so a round generates little it
does not infer yet (benchmarks/README.md, "Round schedule")."""
GROUP_STEP = 1
"""A group target's default round unit, the first round per member task: one column, inside shards of two (a
length far from the threshold decides on its pooled mean after 1 to 6 columns; benchmarks/README.md, "A first
round of one column")."""
GROUP_GROWTH = 1.25
GROUP_ROUND_MAX = 10
"""A group target's default round schedule: grow by a quarter, at most this many instances per member and round
(`suite.adaptive_round_max` is in shards: this divided by the shard size)."""
GROUP_ALPHA_SPLIT = "length"
SCHEDULE_BEFORE = {"adaptive_growth": 1.0, "adaptive_round_max": 0, "adaptive_alpha_split": "equal",
                   "adaptive_column_power": 1.0, "adaptive_step": None}
"""The schedule settings' values for every target before the group targets' defaults (and for `tasks` now): what a
run root whose config.yaml lacks them was sampled with (`adaptive_step` None: whole rounds of shards,
`shard_size * adaptive_round`)."""


@dataclass
class SuiteConfig:
    name: str = MISSING
    tasks: list[str] = MISSING
    lengths: list[int] = MISSING
    samples: int = 500
    """Instances per task and length (RULER uses 500)."""
    seed: int = 42
    shard_size: int | None = None
    """Instances per shard: the unit of parallel generation, of resume and of an adaptive round. Unset: 25, or
    `ADAPTIVE_SHARD_SIZE` in an adaptive run, `GROUP_SHARD_SIZE` with `adaptive_target=suite|groups` (small rounds
    stop a cell nearer to where its bounds decide, which matters most at the long, costly lengths:
    benchmarks/README.md)."""
    effective_threshold: float | None = None
    """Points a length's score must exceed to count toward the effective length, for every family of the run.
    Unset: each family's own (`Family.threshold`: RULER's 85.6, Llama-2-7B at 4K; the other families borrow it
    and say so in the report)."""
    adaptive: bool = False
    """Run in rounds and stop sampling a (task, length) cell once its anytime-valid interval lies wholly above or
    below `effective_threshold`, or at `samples` (docs/adaptive.md). Off: the full sweep."""
    adaptive_confidence: float = 0.95
    """Confidence that each task's effective length is the full sweep's: split over the task's lengths, it is
    the confidence of each cell's decision times the lengths (valid however often the bounds are checked;
    docs/adaptive.md)."""
    adaptive_round: int = 1
    """Shards (of `shard_size` instances) each undecided cell gets per adaptive round when `adaptive_step` is
    unset (`adaptive_target=tasks`)."""
    adaptive_step: int | None = None
    """Instances each undecided cell (a group's member task) gets in the first round, and the unit of later ones.
    Need not fill a shard: a round generates whole shards and runs only the instances it asks for; the others
    wait for a later round (`longeval.run.asked`). Unset: `GROUP_STEP` (1) for `adaptive_target=suite|groups`,
    `shard_size * adaptive_round` for `tasks`."""
    adaptive_growth: float | None = None
    """Round schedule: a cell (a group's length) at n instances gets the largest whole number of rounds not above
    (adaptive_growth - 1) * n next, at least one (`longeval.stats.adaptive.Settings.round_growth`). 1.0: constant
    rounds. With small shards (`shard_size=2`) and 1.25, rounds start small and grow for the lengths that stay
    open (docs/adaptive.md, "Round schedule"). Unset: 1.25 (`GROUP_GROWTH`) for `adaptive_target=suite|groups`,
    where it was measured to help, 1.0 for `tasks`."""
    adaptive_round_max: int | None = None
    """Most shards one cell gets in a round of the schedule (0: no limit). Unset: `GROUP_ROUND_MAX` instances'
    worth (at least one shard) for `adaptive_target=suite|groups`, 0 for `tasks`."""
    adaptive_near_stop: bool = False
    """Group targets (`groups`, `suite`): stop a length, undecided and flagged near the threshold, once its bounds
    lie within the full sweep's own noise band of the threshold, instead of sampling it to its cap
    (docs/adaptive.md). Off: such a length is decided by these instances and flagged."""
    adaptive_alpha_split: str | None = None
    """How `1 - adaptive_confidence` is split over a task's (a group's) lengths: `equal` shares, or `length`, in
    proportion to the length, so the dear long lengths decide sooner (docs/adaptive.md). Unset: `length` for
    `adaptive_target=suite|groups`, `equal` for `tasks`. A run root keeps the split (and schedule) it was sampled
    with: a rerun that would change them is refused (`longeval.run.provenance`)."""
    adaptive_column_power: float | None = None
    """The prior of a group's bettors (`longeval.stats.adaptive.column_fractions`): 1 is the uniform grid, higher packs
    the bets towards the largest (a column average of k tasks has about 1/k of one task's variance). Unset:
    `adaptive.COLUMN_POWER` (8, benchmarks/README.md, "A prior for the column averages") for
    `adaptive_target=suite|groups`, 1 for `tasks`; a run root keeps the one it was sampled with, and one from
    before this setting bet on the uniform grid (1)."""
    adaptive_target: str = "tasks"
    """What an adaptive run samples until decided (docs/adaptive.md): `tasks`, every (task, length) cell (each
    task's effective length); `groups`, each skill group's and the suite's effective length on the group's mean;
    `suite`, the suite's only (RULER's quoted number: the longest length whose mean over the tasks exceeds the
    threshold). Default `tasks`: per-task answers, as before; the other two spend far less for the group numbers
    but leave member cells undecided."""
    shuffle: bool | None = None
    """Lay each (task, length) cell's instances out in a seeded random order, so that a run of consecutive shards
    is a random sample of them (generators cycle some parameters through the index). Unset: on in an adaptive
    run, whose rounds take consecutive shards; off otherwise (a full sweep holds the same instances either way)."""

    data: DataConfig = field(default_factory=DataConfig)
    subsets: list[str] = field(default_factory=list)
    """Michelangelo's stratification (§3.2): stack the "up to" subsets (`32k`, `128k`, `1m`). Each spreads
    `samples` over the suite's lengths within its limit, counts add up per length, and the cumulative curves
    weight a length by 1 / (subsets containing it). Empty: `samples` at every length."""
    allow_too_long: bool = False
    """Plan lengths above model.max_model_len anyway: their instances are recorded as prompt_too_long (score 0)
    and never sent. Off, such a length is refused at plan time: a model that cannot read it scores 0 silently."""
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Task parameter overrides by family, task or family/task, e.g. `suite.params.sync.cot=false`, and
    `max_new_tokens` for the output budget; names are the fields of each task's params dataclass."""


@dataclass
class ClusterConfig:
    name: str = "local"
    address: str | None = None
    """The Ray cluster to join (`host:port`, or `auto` for the one `ray start` left on this machine). None:
    `RAY_ADDRESS` when set (inside `ray job submit`), else a private local Ray, even beside a running one."""
    num_cpus: int | None = None
    replicas: int = 1
    """Engine actors per pool."""
    gpus_per_replica: float = 0
    batch_size: int = 8
    """Prompts per request batch for models behind an API (`model.engine=openai`); vLLM engines are fed
    continuously instead (see `inflight`)."""
    inflight: int | None = None
    """Prompts kept inside each vLLM engine at once, so its scheduler always has the next ones to batch;
    None: the engine's max_num_seqs with dynamic dispatch (a replica takes no more than it can run), twice it
    with static dispatch."""
    commit_interval_s: float = 30.0
    """Longest a finished prediction waits in its replica before it is committed: a kill -9 loses at most this
    much finished work (plus the prompts in flight and one write). Each commit is one small file; the infer
    stage merges them into one file per instance shard when it ends or resumes. 0: commit at once."""
    dispatch: Dispatch = Dispatch.dynamic
    """dynamic: replicas take work from one queue as they have room; static: fixed lists, fixed placement."""
    keep_engines: bool = False
    """Keep the run's engine replicas running when it ends, for the next run in the same process (a notebook, a
    sweep of suites in one script): a pool with the same settings takes them over instead of starting engines
    again (minutes for a large model). They hold their GPUs or CPUs until a pool that needs the room stops them,
    `longeval.stages.infer.release_engines()` is called or the process ends. A command-line run ends with its
    process, so there it changes nothing."""
    engine_restarts: int = 2
    """How often a replica whose engine died is started again on its unfinished prompts; after that they are
    recorded as engine errors (a rerun retries them)."""
    metrics_export_port: int | None = None
    """The port a private local Ray's metrics agent serves Prometheus metrics on, to scrape a run's Ray; None: a
    free one Ray picks. One another process holds stops Ray's node from starting (the run's error names the holder).
    Not used when joining a cluster: its `ray start --metrics-export-port` sets that one's."""
    placement_timeout_s: float = 600.0
    """How long a pool none of whose replicas runs may wait for the cluster to place them (an autoscaler may be
    adding nodes); a replica that waits while others run (its node lost) holds nothing up."""
    generate_parallelism: int = 2
    """Generation tasks at once, at most. A run uses fewer where the work is small: no more than one a shard to
    generate and one per 10 CPU-seconds of generation as `longeval plan` estimates it
    (`stages.generate.generation_actors`: a worker's start costs more than a small suite's whole generation)."""
    scorer_timeout_s: float = 30.0
    """Seconds one scorer call may take; an output that takes longer scores 0 as `scorer_timeout` (a runaway
    regex on a pathological output must not stall the run)."""
    gpu: str | None = None
    """GPU type for planning (a100_40gb, a100_80gb, a40_48gb, h100_80gb). Set, each pool gets its own
    tensor_parallel_size, replicas, max_num_seqs and max_num_batched_tokens from the memory arithmetic
    (longeval/planning/capacity.py), overriding replicas and gpus_per_replica above. None: no GPU planning."""
    num_gpus: int = 0
    """GPUs in the whole cluster: a pool runs num_gpus // tensor_parallel_size replicas."""
    gpus_per_node: int = 8
    """The largest tensor_parallel_size planning considers: tensor parallelism stays within a node."""
    bucket_edges: list[int] = field(default_factory=list)
    """Split the lengths into contiguous engine pools: [16384] gives one pool for lengths <= 16384 (a short
    max_model_len, more sequences in the KV cache) and one for the longer ones. Empty: a single pool."""


@dataclass
class StoreConfig:
    name: str = "local"
    root: str = "runs"
    """Folder or s3://bucket/prefix under which each run gets its own run root."""
    cache_instances: bool = True
    """Reuse generated instance shards across runs and models that share a tokenizer (keyed by content)."""
    instance_cache: str | None = None
    """Where cached instance shards live (folder or s3://); None: <store.root>/_cache."""
    shared_filesystem: bool = False
    """The local `root` is on a filesystem every Ray node mounts at the same path (NFS, Lustre, ...). A run on a
    cluster of more than one node refuses a local root without it: each node would write to its own disk."""
    lease_heartbeat_s: float = 30.0
    """How often a run renews the heartbeat of its lease on the run root (`_lease/`, longeval/store/lease.py)."""
    lease_stale_s: float = 300.0
    """A lease whose heartbeat is older than this is stale: its holder is taken for dead and the next run takes
    it over. Keep it well above lease_heartbeat_s and above the clock skew between hosts."""
    take_over_lease: bool = False
    """Take the run root's lease even from a holder that still looks alive (one you know is dead, on a host
    that cannot be checked from here)."""


@dataclass
class TrackingConfig:
    """Where a job's results go besides its run root: nowhere (`none`) or one W&B run (`wandb`).

    Tracking never fails an evaluation: a W&B error is a warning and the run goes on (`longeval.tracking.wandb_run`).
    """

    name: str = "none"
    backend: TrackingBackend = TrackingBackend.none
    """`none` or `wandb`."""
    project: str = "longeval"
    entity: str | None = None
    """W&B user or team; None: the account's default entity."""
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: TrackingMode = TrackingMode.offline
    """W&B mode: offline (default on one machine; `wandb sync` later), online (needs WANDB_API_KEY or
    `wandb login`; without credentials the run is logged offline with a warning), disabled."""
    table_rows: int = 50
    """Instances per task logged as a W&B table (sampled with the suite seed, spread over the lengths)."""
    text_chars: int = 1000
    """Characters kept of each prompt (its tail, where the question is) and output in those tables."""
    dir: str | None = None
    """Folder for W&B's local files (offline runs to sync); None: $WANDB_DIR, else a local run root, else the
    working directory."""
    init_timeout: float = 60.0
    """Seconds `wandb.init` may take online before tracking gives up (and falls back to offline)."""
    finish_timeout: float = 120.0
    """Seconds the final upload may take online; what is left stays on disk for `wandb sync`."""

    def __post_init__(self) -> None:
        # Checked here, where the schema lives, so a typo fails before any work starts.
        if self.table_rows < 0 or self.text_chars < 0:
            raise ConfigError("tracking.table_rows and tracking.text_chars must be 0 or more")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    suite: SuiteConfig = field(default_factory=SuiteConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    run_name: str | None = None
    """The run root is <store.root>/<run_name>; default: <model>-<suite>-seed<seed>-<suite hash>, the hash of
    the suite's tasks, lengths, samples, seed and params (`suite_hash`)."""
    public_keys: list[str] = field(default_factory=list)
    """Keys whose values are not secret and are written in clear: `model.env` variables (every other value there
    is hidden, besides the engine settings in `longeval.config.redaction.PUBLIC_ENV`) and secret-looking names that are
    not credentials, e.g. public_keys=[VLLM_PLUGINS,SORT_KEY]."""
    plugins: list[str] = field(default_factory=list)
    """Modules imported before planning and scoring, on the driver and in the scoring processes: they may
    register families of tasks with their judges (`longeval.tasks.register`)."""

    @property
    def run_root(self) -> str:
        name = self.run_name or f"{self.model.name}-{self.suite.name}-seed{self.suite.seed}-{suite_hash(self.suite)}"
        return f"{self.store.root.rstrip('/')}/{name}"


def suite_hash(suite: SuiteConfig) -> str:
    """A short hash of what decides a suite's instances, so a different suite gets a different default run root
    (and reruns never mix two suites' rows)."""
    identity = {"tasks": list(suite.tasks), "lengths": list(suite.lengths), "samples": suite.samples,
                "seed": suite.seed, "shard_size": suite.shard_size, "subsets": list(suite.subsets),
                "params": OmegaConf.to_container(OmegaConf.create(dict(suite.params))) if suite.params else {}}
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]
