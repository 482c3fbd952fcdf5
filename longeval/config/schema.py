"""The run configuration: schema in Python dataclasses, values in YAML groups under conf/.

Hydra composes `conf/config.yaml` with the chosen groups and the user's overrides; OmegaConf checks
every key and type against this schema before any work starts, so a typo fails at once and names the
key and its choices. Settings with a fixed set of values are `StrEnum`s, so OmegaConf checks them too; a member
equals its string (`cfg.model.engine == "openai"`) and config.yaml stores the plain string.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ConfigTypeError, OmegaConfBaseException, ValidationError

from longeval.config.redaction import PUBLIC_ENV, Redactor, is_secret_name
from longeval.errors import ConfigError
from longeval.scoring.deadline import import_plugins
from longeval.stats.adaptive import COLUMN_POWER
from longeval.tasks import check_overrides, get_task, sampling, selected_overrides
from longeval.text.render import prompt_format

log = logging.getLogger(__name__)

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
    effective_threshold: float = 85.6
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
    engine_restarts: int = 2
    """How often a replica whose engine died is started again on its unfinished prompts; after that they are
    recorded as engine errors (a rerun retries them)."""
    metrics_export_port: int | None = None
    """The port a private local Ray's metrics agent serves Prometheus metrics on, to scrape a run's Ray; None: a
    free one Ray picks. One another process holds stops Ray's node from starting (the run's error names the holder).
    Not used when joining a cluster: its `ray start --metrics-export-port` sets that one's."""
    placement_timeout_s: float = 600.0
    """How long a pool may wait for the cluster to place its replicas (an autoscaler may be adding nodes)."""
    generate_parallelism: int = 2
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
    import hashlib
    import json

    identity = {"tasks": list(suite.tasks), "lengths": list(suite.lengths), "samples": suite.samples,
                "seed": suite.seed, "shard_size": suite.shard_size, "subsets": list(suite.subsets),
                "params": OmegaConf.to_container(OmegaConf.create(dict(suite.params))) if suite.params else {}}
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:8]


PACKAGED_CONF = Path(__file__).resolve().parents[2] / "conf"


def conf_dir() -> Path:
    """The config tree: $LONGEVAL_CONF, else conf/ beside the package. A LONGEVAL_CONF without a config.yaml is
    refused by name: Hydra would call it a bad override, "Primary config directory not found"."""
    given = os.environ.get("LONGEVAL_CONF")
    if not given:
        return PACKAGED_CONF
    folder = Path(given).expanduser()
    if not (folder / "config.yaml").is_file():
        what = ("no such folder" if not folder.exists() else "not a folder" if not folder.is_dir()
                else "a folder without config.yaml")
        raise ConfigError(f"LONGEVAL_CONF={given}: {what} ({folder.resolve()}); point it at a config tree like "
                          f"conf/ (config.yaml with model/, suite/, cluster/ ...), or unset it for the packaged "
                          f"one ({PACKAGED_CONF})")
    return folder


def group_choices(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def load_config(overrides: list[str] | None = None) -> Config:
    """Compose conf/ with Hydra-style overrides and validate against the schema."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, OverrideParseException

    overrides = list(overrides or [])
    for item in overrides:
        group = item.split("=", 1)[0].lstrip("+~")
        if "=" in item and "." not in group and (conf_dir() / group).is_dir():
            choice = item.split("=", 1)[1]
            if choice not in group_choices(group):
                raise ConfigError(f"unknown {group} {choice!r}; choices: {', '.join(group_choices(group))}")
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="longeval_schema", node=Config)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            raw = compose(config_name="config", overrides=overrides)
    except OverrideParseException as exc:
        raise ConfigError(_explain_parse(exc.override, overrides)) from exc
    except HydraException as exc:
        raise ConfigError(_explain_type(exc, overrides) or _explain_override(str(exc))) from exc
    except yaml.YAMLError as exc:  # Hydra lets a config file's syntax error through as the parser's own
        raise ConfigError(_explain_yaml(exc)) from exc
    finally:
        GlobalHydra.instance().clear()
    return validate(raw, preset_scopes=_preset_scopes(raw, overrides))


def _preset_scopes(raw: DictConfig, overrides: list[str]) -> frozenset[str]:
    """The `suite.params` scopes that come from config files, not from the user's overrides."""
    scopes = set(OmegaConf.select(raw, "suite.params") or {})
    for item in overrides:
        key = item.lstrip("+~").split("=", 1)[0]
        if key == "suite.params":  # the whole map replaced: every scope is the user's
            return frozenset()
        if key.startswith("suite.params."):
            scopes.discard(key.split(".")[2])
    return frozenset(scopes)


def _explain_yaml(exc: yaml.YAMLError) -> str:
    """A YAML syntax error as the file, the line and column (1-based, as editors count) and the parser's problem."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"a config file is not valid YAML: {problem}; fix its syntax"
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    since = f" ({context} that starts at line {start.line + 1}, column {start.column + 1})" if context and start else ""
    return f"{where}: {problem}{since}; fix the YAML syntax there"


def _explain_parse(override: str, overrides: list[str]) -> str:
    """An override Hydra cannot parse, with the quoting rule: words split by the shell, or characters outside
    Hydra's unquoted values (spaces, non-ASCII letters), need quotes for Hydra inside quotes for the shell."""
    index = overrides.index(override) if override in overrides else -1
    if "=" not in override:
        # `run_name=my run` reaches us as two arguments: find the override this word was split from.
        start, stop = index, index + 1
        while start > 0 and "=" not in overrides[start]:
            start -= 1
        while stop < len(overrides) and "=" not in overrides[stop]:
            stop += 1
        if start >= 0 and "=" in overrides[start]:
            words = overrides[start:stop]
            key, _, value = words[0].partition("=")
            whole = " ".join([value, *words[1:]])
            return (f"{override!r} is not an override (KEY=VALUE); if it belongs to {words[0]!r}, quote the whole "
                    f"value for Hydra and the override for the shell: {_quoted(key, whole)}{_run_name_rule(key)}")
        return f"{override!r} is not an override: write KEY=VALUE, e.g. suite=ruler or suite.samples=10"
    key, _, value = override.partition("=")
    if value.isascii() and not any(c.isspace() for c in value):  # not a quoting matter: brackets or quotes
        return (f"cannot parse the override {override!r}: check its brackets and quotes (a list is [a,b], a mapping "
                f"{{k:v}}); to pass the text as it is, quote it for Hydra and the shell: {_quoted(key, value)}")
    return (f"cannot parse the override {override!r}: an unquoted value is ASCII letters, digits and _-./:+@ "
            f"without spaces; quote the value for Hydra and the override for the shell: {_quoted(key, value)}"
            f"{_run_name_rule(key)}")


def _quoted(key: str, value: str) -> str:
    """`key="value"` in double quotes for Hydra, the whole in single quotes for a POSIX shell."""
    inner = value.replace("\\", "\\\\").replace('"', '\\"')
    return "'" + f'{key}="{inner}"'.replace("'", "'\\''") + "'"


def _run_name_rule(key: str) -> str:
    """A run name must also be one folder name, which quoting does not change."""
    if key.lstrip("+~") != "run_name":
        return ""
    return " (a run name itself takes only ASCII letters, digits and . _ = + -, e.g. run_name=my-run)"


_CONVERT = re.compile(r"Value '(.*)' (?:of type '\w+' could not be converted to (\w+)|is not a valid (\w+))")
_NOT_A_CHOICE = re.compile(r"Invalid value '(.*)', expected one of \[(.*)\]")
_IN_FILE = re.compile(r"^In '([^']+)': ")
EXAMPLES = {"suite.lengths": "[4096,8192]", "suite.tasks": "[niah_single_1,vt]", "cluster.bucket_edges": "[16384]",
            "suite.params": "{vt:{num_hops:2}}"}
"""Examples for keys whose schema default shows nothing (MISSING or empty)."""


def _schema_type(key: str) -> Any:
    """The schema's type of a dotted key (`suite.lengths`, `suite.lengths[1]`), or None off the schema."""
    import typing

    node: Any = Config
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        if part.startswith("["):
            args = typing.get_args(node)
            node = args[0] if typing.get_origin(node) is list and args else None
        elif dataclasses.is_dataclass(node):
            node = typing.get_type_hints(node).get(part)
        elif typing.get_origin(node) is dict:
            node = typing.get_args(node)[1]
        else:
            return None
        if node is None:
            return None
        node = _optional(node)
    return node


def _optional(tp: Any) -> Any:
    """`X | None` as X."""
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


def _describe(tp: Any, *, plural: bool = False) -> str:
    """A schema type in words: `a list of integers`, `true or false`, `one of vllm, openai, stand_in`."""
    import typing

    origin = typing.get_origin(tp)
    if origin is list:
        args = typing.get_args(tp)
        return "a list of " + (_describe(args[0], plural=True) if args else "values")
    if origin is dict or tp is dict:
        return "mappings" if plural else "a mapping (key: value)"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(m.value for m in tp)
    if dataclasses.is_dataclass(tp):
        return f"a group of settings ({', '.join(f.name for f in dataclasses.fields(tp))})"
    names = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
             str: ("a string", "strings")}
    return names.get(tp, ("a value", "values"))[plural]


def _example(key: str, tp: Any, given: str | None) -> str:
    """A value of the right type for `key`: the given value in brackets when that is all it lacks (`[4096]`),
    a known example, the schema's default, or one by type."""
    import typing

    base = re.sub(r"\[\d+\]$", "", key)
    if typing.get_origin(tp) is list and given and not given.startswith("[") and "," not in given:
        element = typing.get_args(tp)[0] if typing.get_args(tp) else str
        if element is not int or given.lstrip("-").isdigit():
            return f"[{given}]"
    if base in EXAMPLES and base == key:
        return EXAMPLES[base]
    schema = OmegaConf.structured(Config)
    if not OmegaConf.is_missing(schema, key):
        default = OmegaConf.select(schema, key)
        if default not in (None, [], {}) and not isinstance(default, DictConfig):
            if isinstance(default, bool):
                return str(default).lower()
            return "[" + ",".join(map(str, default)) + "]" if OmegaConf.is_list(default) else str(default)
    by_type = {int: "1", float: "1.0", bool: "true", str: "text", dict: "{key:value}"}
    if typing.get_origin(tp) is dict:
        return "{key:value}"
    if typing.get_origin(tp) is list:
        element = typing.get_args(tp)[0] if typing.get_args(tp) else str
        return f"[{by_type.get(element, 'a')}]"
    return by_type.get(tp, "...")


def _given(key: str, overrides: list[str], message: str, source: str | None) -> str | None:
    """The value the user gave for `key`: the last override of it, the value in OmegaConf's message, or the
    value in the config file the error came from."""
    base = re.sub(r"\[\d+\]$", "", key)
    match = _CONVERT.search(message)
    if match and base != key:  # one element of a list: the element, not the whole list given
        return match.group(1)
    for item in reversed(overrides):
        name, eq, value = item.partition("=")
        if eq and name.lstrip("+~") in (key, base):
            return value
    match = _CONVERT.search(message)
    if match:
        return match.group(1)
    if source is not None:
        group, _, _ = source.partition("/")
        path = conf_dir() / f"{source}.yaml"
        try:
            loaded = OmegaConf.load(path)
            inner = key[len(group) + 1:] if key.startswith(group + ".") else key
            value = OmegaConf.select(loaded, inner, throw_on_missing=False)
        except Exception:  # the value only decorates the message; the message stands without it
            return None
        if value is not None:
            return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
    return None


def _explain_type(exc: BaseException, overrides: list[str] | None = None) -> str | None:
    """A value of the wrong type, or a key the schema lacks, from an override or a config file: the full dotted
    key, the type expected, the value given and a value that would do."""
    source_match = _IN_FILE.match(str(exc))
    source = source_match.group(1) if source_match else None
    where = f"{conf_dir() / f'{source}.yaml'}: " if source else ""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__  # Hydra re-raises a config file's error as the context
    if cause is None:
        return None
    key = getattr(cause, "full_key", None) or ""
    if not key:
        return None
    first = str(cause).splitlines()[0]
    if isinstance(cause, ConfigKeyError) and "not in" in first:
        parent, _, name = key.rpartition(".")
        tp = _schema_type(parent) if parent else Config
        known = ", ".join(sorted(f.name for f in dataclasses.fields(tp))) if dataclasses.is_dataclass(tp) else ""
        return (f"{where}unknown config key {key!r}" + (f"; keys under {parent or 'the top level'}: {known}"
                                                         if known else ""))
    choice = _NOT_A_CHOICE.search(str(cause))
    if choice:
        return f"{where}{key}={choice.group(1)!r}; choices: {choice.group(2)}"
    if isinstance(cause, ConfigTypeError) and "does not support deletion" in first and _schema_type(key):
        return (f"~{key} removes a setting the schema requires; give it a value instead, e.g. "
                f"{key}={_example(key, _schema_type(key), None)}")
    if not isinstance(cause, ValidationError):
        return None
    tp = _schema_type(key)
    if tp is None:
        return None
    given = _given(key, overrides or [], str(cause), source)
    got = f", got {given!r}" if given is not None else ""
    base = re.sub(r"\[\d+\]$", "", key)  # the fix of one element of a list is the whole list
    if dataclasses.is_dataclass(tp):
        fix = f"set its keys one by one, e.g. {key}.{dataclasses.fields(tp)[0].name}=..."
    elif source:  # the fix goes in the file, as YAML
        fix = f"write {base.split('.')[-1]}: {_example(base, _schema_type(base), None if base != key else given)}"
    else:
        fix = f"write {base}={_example(base, _schema_type(base), None if base != key else given)}"
    return f"{where}{key} must be {_describe(tp)}{got}; {fix}"


def _explain_override(message: str) -> str:
    """Turn Hydra's 'Could not override' into the unknown key and the keys that exist there."""
    first = message.splitlines()[0]
    if first.startswith("Could not override"):
        key = first.split("'")[1]
        parent, _, _ = key.rpartition(".")
        node: Any = OmegaConf.structured(Config)
        for part in parent.split(".") if parent else []:
            node = node.get(part) if isinstance(node, DictConfig) else None
        known = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else ""
        if key.startswith("suite.params."):  # a free-form map: the suite lists some parameters, not all
            return (f"{key!r} is not set by this suite; add it with a leading '+': +{key}=... "
                    "(parameter names are in the task family's docs)")
        return f"unknown config key {key!r}" + (f"; keys under {parent or 'the top level'}: {known}" if known else "")
    if first.startswith("Could not append to config. An item is already at"):
        key = first.split("'")[1]
        return f"{key!r} is already set by the suite; override it without the leading '+': {key}=..."
    return f"bad override: {first}"


def _refuse_unknown_keys(node: Any, schema: Any, prefix: str) -> None:
    """A key the schema lacks, which an override with '+' (`+suite.foo=1`) gets past Hydra and OmegaConf's merge:
    refused like a typo, since it would change nothing but the run root's name."""
    if not isinstance(node, DictConfig | dict) or not dataclasses.is_dataclass(schema):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = _hints(schema)
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key {full!r}; keys under {prefix.rstrip('.') or 'the top level'}: "
                              f"{known}")
        _refuse_unknown_keys(node[key], _optional(hints.get(key)), f"{full}.")


def _hints(schema: Any) -> dict[str, Any]:
    import typing

    return typing.get_type_hints(schema)


def validate(raw: DictConfig | dict, *, preset_scopes: frozenset[str] = frozenset()) -> Config:
    """The config checked against the schema and its rules. `preset_scopes`: the `suite.params` scopes a config
    file set, not an override (those of tasks the suite does not run are dropped; the user's are checked)."""
    cfg = conform(raw)
    _resolve_defaults(cfg.suite)
    _check(cfg, preset_scopes)
    return cfg


def conform(raw: DictConfig | dict) -> Config:
    """The config checked against the schema alone (known keys, types, mandatory values), without the run rules
    of `validate`: what a stored config.yaml must pass to be whole, however old (`provenance.stored_config`)."""
    schema = OmegaConf.structured(Config)
    _refuse_unknown_keys(raw, Config, "")
    try:
        merged = OmegaConf.merge(schema, raw)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        first = str(exc).splitlines()[0]
        raise ConfigError(_explain_type(exc) or f"config error at {key!r}: {first}") from exc


def _resolve_defaults(suite: SuiteConfig) -> None:
    """Fill the settings left unset with their defaults, which depend on the run: adaptive or not, and the target.

    Why per target: the round schedule and the alpha split by length (benchmarks/README.md, "Round schedule and
    alpha split") cut a group target's tokens (11.3 -> 10.1 % on the replay curves) with the same decisions; for
    `tasks` they were not measured, so it keeps constant rounds of 10 and the equal split. The resolved values
    are what config.yaml records, so a run root is resumed with the settings it was sampled with."""
    group = suite.adaptive and suite.adaptive_target in ("suite", "groups")
    if suite.shard_size is None:
        suite.shard_size = GROUP_SHARD_SIZE if group else ADAPTIVE_SHARD_SIZE if suite.adaptive else SHARD_SIZE
    if suite.shuffle is None:
        suite.shuffle = suite.adaptive
    if suite.adaptive_growth is None:
        suite.adaptive_growth = GROUP_GROWTH if group else SCHEDULE_BEFORE["adaptive_growth"]
    if suite.adaptive_round_max is None:
        suite.adaptive_round_max = (max(1, GROUP_ROUND_MAX // max(1, suite.shard_size)) if group
                                    else SCHEDULE_BEFORE["adaptive_round_max"])
    if suite.adaptive_column_power is None:
        suite.adaptive_column_power = COLUMN_POWER if group else SCHEDULE_BEFORE["adaptive_column_power"]
    if suite.adaptive_alpha_split is None:
        suite.adaptive_alpha_split = GROUP_ALPHA_SPLIT if group else SCHEDULE_BEFORE["adaptive_alpha_split"]
    if suite.adaptive_step is None:
        suite.adaptive_step = GROUP_STEP if group else suite.shard_size * suite.adaptive_round


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
"""A run name is one folder name under store.root: no separators, no '..', nothing absolute."""


def _check(cfg: Config, preset_scopes: frozenset[str] = frozenset()) -> None:
    if cfg.run_name is not None and (not RUN_NAME.fullmatch(cfg.run_name) or ".." in cfg.run_name):
        raise ConfigError(
            f"run_name={cfg.run_name!r} would not be a folder inside store.root ({cfg.store.root}); expected one name "
            "of letters, digits and . _ = + - (no '/', '\\', '..' or absolute path), e.g. run_name=llama-ruler-v2; "
            "to write elsewhere, change store.root")
    _check_public_keys(cfg)
    import_plugins(cfg.plugins)
    if not cfg.suite.tasks:
        raise ConfigError("suite.tasks is empty; give at least one task, e.g. suite.tasks=[niah_single_1] "
                          "(`longeval plan` lists a suite's tasks)")
    for name in cfg.suite.tasks:
        get_task(name)
    if preset_scopes:  # a preset's params for tasks the user's suite.tasks left out change nothing: drop them
        preset = {k: v for k, v in cfg.suite.params.items() if k in preset_scopes}
        kept = selected_overrides(preset, cfg.suite.tasks)
        cfg.suite.params = {k: v for k, v in cfg.suite.params.items() if k not in preset or k in kept}
    check_overrides(cfg.suite.params, cfg.suite.tasks)
    if not cfg.suite.lengths:
        raise ConfigError("suite.lengths is empty; give at least one length, e.g. suite.lengths=[4096]")
    for length in cfg.suite.lengths:
        if length < 256:
            raise ConfigError(f"suite.lengths has {length}; lengths are in tokens and must be at least 256")
    if cfg.suite.subsets:
        choices = sampling().choices if sampling() else ()
        unknown = [s for s in cfg.suite.subsets if s.lower() not in choices]
        if unknown:
            raise ConfigError(f"suite.subsets has {', '.join(map(repr, unknown))}; choices: {', '.join(choices)}")
    prompt_format(cfg.model)  # names a wrong prompt_format, ruler_template or a system prompt RULER cannot hold
    if cfg.model.engine == Engine.openai:
        check_api(cfg.model)
    if cfg.model.engine == Engine.stand_in:
        log.warning("model.engine=stand_in: the STAND-IN engine answers instead of %s (canned answers, no model "
                    "runs); for scale work only, the scores are not a model's", cfg.model.name)
    if cfg.suite.samples < 1 or cfg.suite.shard_size < 1:
        raise ConfigError("suite.samples and suite.shard_size must be at least 1")
    _check_size(cfg.suite)
    if cfg.suite.adaptive and not (0 < cfg.suite.adaptive_confidence < 1 and cfg.suite.adaptive_round >= 1
                                   and cfg.suite.adaptive_step >= 1):
        raise ConfigError("suite.adaptive_confidence must lie strictly between 0 and 1 (e.g. 0.95), and "
                          "suite.adaptive_round and suite.adaptive_step must be at least 1")
    if cfg.suite.adaptive and (cfg.suite.adaptive_growth < 1 or cfg.suite.adaptive_round_max < 0):
        raise ConfigError(f"suite.adaptive_growth={cfg.suite.adaptive_growth} must be at least 1 (1: constant"
                          f" rounds; e.g. 1.25) and suite.adaptive_round_max={cfg.suite.adaptive_round_max} at"
                          " least 0 (0: no limit)")
    if cfg.suite.adaptive_alpha_split not in ADAPTIVE_ALPHA_SPLITS:
        raise ConfigError(f"suite.adaptive_alpha_split={cfg.suite.adaptive_alpha_split!r}; choices: "
                          f"{', '.join(ADAPTIVE_ALPHA_SPLITS)} (e.g. suite.adaptive_alpha_split=length)")
    if cfg.suite.adaptive_target not in ADAPTIVE_TARGETS:
        raise ConfigError(f"suite.adaptive_target={cfg.suite.adaptive_target!r}; choices: "
                          f"{', '.join(ADAPTIVE_TARGETS)} (e.g. suite.adaptive_target=suite)")
    for key in ("replicas", "batch_size", "inflight"):
        value = getattr(cfg.cluster, key)
        if value is not None and value < 1:
            raise ConfigError(f"cluster.{key}={value}: expected an integer of at least 1; e.g. cluster.{key}="
                              f"{getattr(ClusterConfig, key) or 1}")
    if cfg.cluster.commit_interval_s < 0:
        raise ConfigError(f"cluster.commit_interval_s={cfg.cluster.commit_interval_s}: expected seconds >= 0, "
                          "e.g. cluster.commit_interval_s=30 (0 commits every prediction at once)")
    if not 0 < 2 * cfg.store.lease_heartbeat_s <= cfg.store.lease_stale_s:
        raise ConfigError(f"store.lease_heartbeat_s={cfg.store.lease_heartbeat_s} and store.lease_stale_s="
                          f"{cfg.store.lease_stale_s}: expected a heartbeat > 0 at most half the stale limit, e.g. "
                          "store.lease_heartbeat_s=30 store.lease_stale_s=300")
    port = cfg.cluster.metrics_export_port
    if port is not None and not 1024 <= port <= 65535:
        raise ConfigError(f"cluster.metrics_export_port={port}: expected a port from 1024 to 65535, or null (a free "
                          "one Ray picks)")
    if cfg.cluster.scorer_timeout_s <= 0:
        raise ConfigError(f"cluster.scorer_timeout_s={cfg.cluster.scorer_timeout_s}: expected seconds > 0, "
                          "e.g. cluster.scorer_timeout_s=30")


MAX_SHARDS = 100_000
"""The most shards a plan lists. A plan is one spec per shard, so `plan` and `run` take time in proportion to
their number (about 3 s per 100,000 here): far beyond any real suite (RULER's full sweep is 1,560 shards), a size
is refused at once rather than after minutes of silence."""


def _check_size(suite: SuiteConfig) -> None:
    """Refuse a suite whose shard count (closed form: ceil(samples / shard_size) per task and length) is absurd."""
    lengths = sorted(set(suite.lengths))
    scheme = sampling() if suite.subsets else None
    counts = scheme.counts(lengths, suite.subsets, suite.samples) if scheme else dict.fromkeys(lengths, suite.samples)
    shards = len(suite.tasks) * sum(-(-n // suite.shard_size) for n in counts.values())
    if shards > MAX_SHARDS:
        most = MAX_SHARDS * suite.shard_size // max(1, len(suite.tasks) * len(lengths))
        raise ConfigError(
            f"suite.samples={suite.samples:,} makes {shards:,} shards ({len(suite.tasks)} tasks x {len(lengths)} "
            f"lengths, suite.shard_size={suite.shard_size}); a plan holds at most {MAX_SHARDS:,}: use suite.samples "
            f"<= {most:,} or a larger suite.shard_size")


def _check_public_keys(cfg: Config) -> None:
    """A public key that is neither a model.env variable nor a secret-looking name would change nothing: most
    likely a typo of the variable meant, which would then stay hidden."""
    for key in cfg.public_keys:
        if key not in cfg.model.env and key not in PUBLIC_ENV and not is_secret_name(key):
            env = ", ".join(sorted(cfg.model.env)) or "none"
            raise ConfigError(f"public_keys has {key!r}, which is no model.env variable (those set: {env}) and no "
                              "secret-looking name, so it is written in clear already; list model.env variables or "
                              "secret-looking names, e.g. public_keys=[VLLM_PLUGINS]")


def check_api(model: ModelConfig) -> None:
    """Fail before any work when the API settings cannot work, naming the fix (the OpenAI engine checks again)."""
    api = model.api
    if not api.base_url:
        raise ConfigError("model.engine=openai needs model.api.base_url, e.g. model.api.base_url=http://host:8000/v1")
    if api.mode == ApiMode.chat and model.chat_template:
        raise ConfigError(
            "model.api.mode=chat sends the task text as a chat message and the server applies its own template; "
            "render instances without ours: set model.chat_template=false (or use model.api.mode=completions, "
            "which sends the exact token ids)"
        )
    if api.concurrency < 1:
        raise ConfigError("model.api.concurrency must be at least 1")


def redactor(cfg: Config, environ: Mapping[str, str] | None = None) -> Redactor:
    """What this run must hide wherever it writes (`longeval.config.redaction`): the secrets of its config and of the
    environment (`environ`, default: this process's), less `public_keys`."""
    return Redactor.of(_container(cfg), environ=environ)


def to_yaml(cfg: Config, environ: Mapping[str, str] | None = None) -> str:
    """The resolved config as YAML, for the run root: every secret of the config or the environment hidden
    (`redactor`)."""
    everything = _container(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(Redactor.of(everything, environ=environ).tree(everything)))


def _container(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)  # type: ignore[return-value]
