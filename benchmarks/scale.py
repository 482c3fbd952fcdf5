"""Scale harness (issue #22): the real pipeline end to end at a full suite's shape, with the stand-in engine.

Every stage runs as its own `longeval` command on one run root, as a user runs them: `plan`, `generate`, `infer`
(the real replica actors, dispatch and prediction writer, with `model.engine=stand_in` answering instead of a
model), `score`, `report` (the summaries), `html` (the HTML report of the run root), then `resume`, the same
`longeval run` again on the same root. Each command is a fresh driver process, so its figures are its own:

- wall time;
- driver peak RSS (the driver's own VmHWM, written by an exit hook) and bytes read (its rchar);
- peak RSS per actor kind (generate actors, replicas, scorers, other Ray workers): a thread samples every process
  under the driver with psutil (VmHWM, so a peak between two samples is not lost) and names it by its Ray title;
- files written under the store (data files, commit records, instance cache), from a listing before and after;
- on a local root, bytes read by Ray workers (rchar, which includes module imports) and, from the stand-in's
  engine records, what each replica read while it fed its engine;
- on SeaweedFS, started by the harness with `-v=2` and `-metricsPort`: every S3 request (method, key, status and
  each listing's prefix, from the server's own request log) and the bytes it sent and received (its Prometheus
  counters), attributed to the stage by time; the harness's own listings fall between stages.

Shape: RULER's 13 tasks (QA on synthetic SQuAD/HotpotQA files big enough for 1M), SYNC's 6 and Michelangelo's 3,
at 4K ... 1M, `--samples` per task x length at 1x and ten times that at 10x; three engine pools (edges 32K and
256K) of two replicas each. The stand-in finishes `--rows-per-step` rows every `--step-s` seconds per replica, so
rows reach the prediction writer over time as a real engine's do.

A stage that holds more than `--memory-limit-gb` (all its processes together) is killed and recorded as aborted;
the run's later stages are then skipped. Results print as tables (rich) with the issue's targets next to the
figures; `--json` writes every figure.

    .venv/bin/python benchmarks/scale.py                               # 1x and 10x, local root and SeaweedFS
    .venv/bin/python benchmarks/scale.py --scale 1 --store local       # the quick one
    .venv/bin/python benchmarks/scale.py --lengths 4096 8192 --samples 2 --tasks ruler/niah_single_1 ruler/vt
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `tests.s3server` and `tests.qa_fixtures`, run from anywhere

RULER_TASKS = [f"ruler/{t}" for t in (
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
    "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")]
SYNC_TASKS = [f"sync/{t}" for t in ("connected_nodes", "shortest_path", "longest_path", "single_hop_translation",
                                     "multi_hop_translation", "letter_coverage")]
MICHELANGELO_TASKS = ["michelangelo/latent_list", "michelangelo/mrcr", "michelangelo/idk"]
LENGTHS = [4096 * 2**i for i in range(9)]  # 4K ... 1M
STAGES = ("plan", "generate", "infer", "score", "report", "html", "resume")
KINDS = ("generate", "replica", "scorer", "ray (other)")
GIB = 1024**3
MIB = 1024**2
DRIVER_STATS_ENV = "LONGEVAL_SCALE_DRIVER_STATS"
SHARD_SIZE = 25
MACHINE_RESERVE = int(1.5 * 1024**3)
"""A stage is stopped when the machine's available memory falls below this, whatever its own limit."""


# -- the driver: a `longeval` command that reports its own peak memory and reads --------------------------------


def _proc(pid: int | str, file: str, key: str) -> int:
    """A counter from /proc/<pid>/<file> in bytes (`status` values are in kB); 0 when gone."""
    try:
        with open(f"/proc/{pid}/{file}") as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name == key:
                    number = int(value.split()[0])
                    return number * 1024 if value.strip().endswith("kB") else number
    except (OSError, ValueError, IndexError):
        pass
    return 0


def import_bytes() -> int:
    """Bytes Python read to import the modules loaded so far (each one's bytecode or source, read whole; as
    `longeval.engines.stand_in.import_bytes`, not imported here so the driver loads only what its command does)."""
    total = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        path = getattr(spec, "cached", None) or getattr(spec, "origin", None)
        if path and path.endswith((".pyc", ".py")):
            with contextlib.suppress(OSError):
                total += os.path.getsize(path)
    return total


def serve_fonts_from_memory() -> None:
    """Have matplotlib's FreeType read each font file from a copy in memory, read once.

    It otherwise reads a font through the file on every glyph and kerning lookup: a report of the full shape read
    DejaVuSans.ttf 229 MiB over (strace: of the `html` driver's 280 MiB of reads), which is not the store
    and would hide the driver's store reads in the figure. The report's bytes are the same either way.

    The font list is loaded first: on a machine without matplotlib's cache it is built now, from the files (built
    through the copies, its entries would name a BytesIO and its JSON could not be written)."""
    from matplotlib import font_manager, ft2font

    font_manager.fontManager  # noqa: B018 (loads or builds the cached font list)

    load, copies = ft2font.FT2Font, {}

    def from_memory(font: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(font, (str, os.PathLike)):
            path = os.fspath(font)
            if path not in copies:
                copies[path] = Path(path).read_bytes()
            font = io.BytesIO(copies[path])
            font.name = path
        return load(font, *args, **kwargs)

    ft2font.FT2Font = from_memory


def driver_main(argv: list[str]) -> int:
    """`longeval <argv>` in this process; at exit (after Ray's own shutdown hook) its VmHWM and rchar go to the
    file named by `LONGEVAL_SCALE_DRIVER_STATS`."""
    out = Path(os.environ[DRIVER_STATS_ENV])

    def dump() -> None:
        out.write_text(json.dumps({"peak_rss": _proc("self", "status", "VmHWM"), "rchar": _proc("self", "io", "rchar"),
                                   "imports": import_bytes(), "wchar": _proc("self", "io", "wchar")}))

    atexit.register(dump)  # registered before ray.init registers its own, so it runs after Ray has shut down
    if "-o" in argv:  # the HTML report (importing matplotlib elsewhere would add to those drivers' peaks)
        serve_fonts_from_memory()
    from longeval.cli import main

    return main(argv)


# -- sampling the driver's process tree -------------------------------------------------------------------------


def kind_of(title: str) -> str | None:
    """A worker's kind from its Ray process title: an actor's (`ray::Replica.run`) or, while it runs one, a
    stage task's (`ray::MapBatches(generate_shards)`, `ray::MapBatches(score_units)`)."""
    if not title.startswith("ray::"):
        return None
    for needles, kind in ((("generate_shards", "ShardGenerator"), "generate"), (("Replica",), "replica"),
                          (("score_units", "Scorer"), "scorer")):
        if any(needle in title for needle in needles):
            return kind
    return "ray (other)"


@dataclass
class ProcRecord:
    pid: int
    kind: str
    title: str
    peak_rss: int = 0
    rchar: int = 0


class Sampler(threading.Thread):
    """Samples every process under `pid` (the driver) until stopped: per process its VmHWM and rchar, the kind of
    actor it is, and the tree's total RSS; kills the tree when that passes `limit` bytes."""

    def __init__(self, pid: int, *, interval: float, limit: int) -> None:
        super().__init__(name="scale-sampler", daemon=True)
        self.pid, self.interval, self.limit = pid, interval, limit
        self.records: dict[tuple[int, float], ProcRecord] = {}
        self.total_peak = 0
        self.aborted = ""
        self.stopped = threading.Event()
        self.pids: set[int] = set()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.interval)

    def stop(self) -> None:
        self.stopped.set()
        self.join()

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        kinds: dict[int, str] = {}
        total = 0
        for proc in tree:  # parents come before their children in psutil's walk
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    cmd = proc.cmdline()
                    title = (cmd[0] if cmd and cmd[0].startswith("ray::") else " ".join(cmd))[:120]
                    rss = proc.memory_info().rss
                    rchar = proc.io_counters().read_chars
                    parent = proc.ppid()
            except psutil.Error:
                continue
            total += rss
            self.pids.add(proc.pid)
            record = self.records.get(key)
            kind = "driver" if proc.pid == self.pid else kind_of(title)
            if kind in (None, "ray (other)") and kinds.get(parent) in ("generate", "replica", "scorer"):
                kind = kinds[parent]  # a scorer's deadline subprocess counts as the scorer
            if record is None:
                record = self.records[key] = ProcRecord(proc.pid, kind or "ray system", title)
            elif kind and record.kind in ("ray (other)", "ray system") and kind != record.kind:
                record.kind, record.title = kind, title  # an idle worker became an actor
            kinds[proc.pid] = record.kind
            record.peak_rss = max(record.peak_rss, _proc(proc.pid, "status", "VmHWM"), rss)
            record.rchar = max(record.rchar, rchar)
        self.total_peak = max(self.total_peak, total)
        if self.aborted:
            return
        available = psutil.virtual_memory().available
        if total > self.limit:
            self.aborted = f"aborted: held {total / GIB:.1f} GiB > limit {self.limit / GIB:g}"
        elif available < MACHINE_RESERVE:  # other jobs share the machine: never let it run out
            self.aborted = f"aborted: held {total / GIB:.1f} GiB, machine low ({available / GIB:.1f} GiB left)"
        if self.aborted:
            kill_tree(tree)

    def by_kind(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for record in self.records.values():
            figures = out.setdefault(record.kind, {"processes": 0, "peak_rss_max": 0, "peak_rss_sum": 0, "rchar": 0})
            figures["processes"] += 1
            figures["peak_rss_max"] = max(figures["peak_rss_max"], record.peak_rss)
            figures["peak_rss_sum"] += record.peak_rss
            figures["rchar"] += record.rchar
        return out


def kill_tree(tree: list) -> None:
    """SIGKILL the driver's process tree (processes this harness started), children first."""
    import psutil

    for proc in reversed(tree):
        with contextlib.suppress(psutil.Error):
            proc.kill()


# -- the store: files before and after a stage ------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    size: int
    version: str
    """mtime and inode locally, the ETag on S3: a rewrite shows."""
    inode: int = 0
    links: int = 1


class Store:
    """The store root of one run: a local folder or an S3 prefix on the harness's SeaweedFS."""

    def __init__(self, root: str, server: Any = None) -> None:
        self.root, self.server = root, server

    @property
    def is_s3(self) -> bool:
        return self.root.startswith("s3://")

    def listing(self) -> dict[str, Entry]:
        """Every file under the store root, by its path below it."""
        if not self.is_s3:
            base = Path(self.root)
            out = {}
            for path in base.rglob("*") if base.exists() else ():
                if path.is_file():
                    st = path.stat()
                    out[str(path.relative_to(base))] = Entry(st.st_size, f"{st.st_mtime_ns}:{st.st_ino}",
                                                            st.st_ino, st.st_nlink)
            return out
        bucket, _, prefix = self.root.removeprefix("s3://").partition("/")
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        return {obj["Key"][len(prefix) + 1:]: Entry(obj["Size"], obj["ETag"])
                for page in pages for obj in page.get("Contents", [])}

    def read_json(self, rel: str) -> Any:
        if not self.is_s3:
            return json.loads(Path(self.root, rel).read_text())
        bucket, _, prefix = self.root.removeprefix("s3://").partition("/")
        return json.loads(self.server.client().get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read())


def area(rel: str, run_name: str) -> str:
    """Where a file sits: the run root's stage folder (`instances`, `predictions`, `_manifest`, ...), or `_cache`."""
    parts = rel.split("/")
    if parts[0] != run_name:
        return parts[0]  # _cache (the instance cache) or anything else beside the run root
    return parts[1] if len(parts) > 2 else "(root files)"


# -- S3: SeaweedFS's own request log and counters ---------------------------------------------------------------

_STATS_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) stats\.go:\d+ "[^"]*" (\w+) "([^"]*)" (\d{3})')
_LIST_LINE = re.compile(r"^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) \S+ ListObjects\w*Handler bucket=(\S+) prefix=(\S*) "
                        r"marker=(\S*)")


def _glog_time(mmdd: str, clock: str) -> float:
    now = datetime.now()
    stamp = datetime.strptime(f"{now.year}{mmdd} {clock}", "%Y%m%d %H:%M:%S.%f")
    if stamp.timestamp() > time.time() + 86400:  # a log line from last December, read in January
        stamp = stamp.replace(year=now.year - 1)
    return stamp.timestamp()


@dataclass
class S3Request:
    t: float
    method: str
    path: str
    code: int


@dataclass
class S3Listing:
    t: float
    prefix: str
    first_page: bool


class S3Meter:
    """Reads SeaweedFS's request log (`-v=2`: one line per request) and Prometheus counters (bytes sent and
    received per bucket) and attributes them to stages by time."""

    def __init__(self, server: Any, metrics_port: int) -> None:
        self.server, self.metrics_port = server, metrics_port
        self.offset = 0
        self.requests: list[S3Request] = []
        self.listings: list[S3Listing] = []

    def counters(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        out = {"sent": 0.0, "received": 0.0}
        for line in text.splitlines():
            for key, name in (("sent", "SeaweedFS_s3_bucket_traffic_sent_bytes_total"),
                              ("received", "SeaweedFS_s3_bucket_traffic_received_bytes_total")):
                if line.startswith(name + "{") and f'bucket="{self.server.bucket}"' in line:
                    out[key] += float(line.rsplit(" ", 1)[1])
        return out

    def read_log(self) -> None:
        with open(self.server.log_path, "rb") as log:
            log.seek(self.offset)
            data = log.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for raw in data[:end].decode("utf-8", "replace").splitlines():
            if (m := _STATS_LINE.match(raw)) is not None:
                self.requests.append(S3Request(_glog_time(m[1], m[2]), m[3], m[4], int(m[5])))
            elif (m := _LIST_LINE.match(raw)) is not None:
                self.listings.append(S3Listing(_glog_time(m[1], m[2]), m[4], m[5] in ("", '""')))

    def stage(self, began: float, ended: float, prefix: str) -> dict[str, Any]:
        """The requests of one stage: counts by method, distinct objects, the objects written (paths below
        `prefix`, the store root's key prefix), listings, errors."""
        time.sleep(0.5)  # the log line follows the response
        self.read_log()
        mine = [r for r in self.requests if began <= r.t <= ended]
        bucket = f"/{self.server.bucket}"
        objects = [r for r in mine if r.path.startswith(bucket + "/")]
        below = f"{bucket}/{prefix}/"
        written = sorted({r.path.removeprefix(below) for r in objects
                          if r.method == "PUT" and r.code < 300 and r.path.startswith(below)})
        listings = [item for item in self.listings if began <= item.t <= ended]
        first = Counter(item.prefix for item in listings if item.first_page)
        return {
            "requests": len(mine),
            "by_method": dict(Counter(r.method for r in mine)),
            "files_touched": len({r.path for r in objects}),
            "written": written,
            "list_requests": len(listings),
            "full_listings": sum(first.values()),
            "most_listings_of_one_prefix": max(first.values(), default=0),
            "most_listed_prefix": first.most_common(1)[0][0] if first else "",
            "client_errors": sum(1 for r in mine if 400 <= r.code < 500),
            "server_errors": sum(1 for r in mine if r.code >= 500),
        }


# -- one run: the stages of one shape on one store --------------------------------------------------------------


@dataclass
class StageFigures:
    stage: str
    command: str
    status: str = "ok"
    wall_s: float = 0.0
    driver_peak_rss: int = 0
    driver_rchar: int = 0
    """What the driver read as data (rchar less its module imports): store, data files, tokenizer, configs."""
    driver_store_read: int = 0
    """`driver_rchar` less the same command's on the baseline run (the data files, tokenizer and configs every run
    reads): on a local root, what the driver read from the store. On S3, see `s3`."""
    tree_rss_peak: int = 0
    kinds: dict[str, dict[str, float]] = field(default_factory=dict)
    files_written: dict[str, int] = field(default_factory=dict)
    bytes_written: int = 0
    data_files_written: int = 0
    """Data files (Parquet under instances/, predictions/, scores/) the stage wrote and left: still there at its
    end. On S3 `files_written` also counts the parts it put and merged away."""
    s3: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunFigures:
    scale: int
    store: str
    samples: int
    tasks: int
    lengths: list[int]
    run_root: str
    stages: list[StageFigures] = field(default_factory=list)
    instances: int = 0
    instance_shards: int = 0
    instance_bytes: int = 0
    prediction_files: int = 0
    cache_bytes_added: int = 0
    replicas: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    planned_replica_bytes: dict[str, int] = field(default_factory=dict)
    """`longeval plan`'s host memory of one replica of each pool (`longeval.planning.sizing`): its in-flight window of
    prompts, a shard read ahead and the prompt reader's row groups; what a replica may add above its base."""

    def stage(self, name: str) -> StageFigures | None:
        return next((s for s in self.stages if s.stage == name), None)

    @property
    def aborted(self) -> str:
        return next((f"{s.stage}: {s.status}" for s in self.stages if s.status != "ok"), "")


@dataclass
class Shape:
    """What a run evaluates and how the stand-in paces itself."""

    tasks: list[str]
    lengths: list[int]
    samples: int
    replicas: int
    bucket_edges: list[int]
    step_s: float
    rows_per_step: int
    squad: Path
    hotpotqa: Path
    extra: list[str] = field(default_factory=list)
    """More overrides, last (`--extra`): e.g. suite (c)'s stacked subsets."""

    def overrides(self, store_root: str, run_name: str) -> list[str]:
        return [
            "model=tiny_random", "model.engine=stand_in", "model.name=stand-in",
            f"model.max_model_len={max(self.lengths)}",
            f"+model.engine_kwargs.step_s={self.step_s}", f"+model.engine_kwargs.rows_per_step={self.rows_per_step}",
            "suite=ruler", "suite.name=scale", f"suite.tasks=[{','.join(self.tasks)}]",
            f"suite.lengths=[{','.join(map(str, self.lengths))}]", f"suite.samples={self.samples}",
            f"suite.shard_size={SHARD_SIZE}", f"suite.data.squad_path={self.squad}",
            f"suite.data.hotpotqa_path={self.hotpotqa}",
            f"cluster.replicas={self.replicas}", "cluster.num_cpus=4",
            f"cluster.bucket_edges=[{','.join(map(str, self.bucket_edges))}]",
            f"store.root={store_root}", f"run_name={run_name}", "tracking=none", *self.extra,
        ]


def planned_replica_bytes(overrides: list[str]) -> dict[str, int]:
    """Per pool, the host memory `longeval plan` gives one replica of this run (the stand-in's sizing)."""
    from longeval.config import load_config
    from longeval.planning.plan import make_plan
    from longeval.planning.sizing import size_suite

    cfg = load_config(overrides)
    return {p.name: p.replica_bytes for p in size_suite(cfg, make_plan(cfg, check_data=False)).pools
            if p.replica_bytes is not None}


def window_bound(run: RunFigures) -> float:
    """The most any replica of the run rose above its base, as a share of its pool's planned figure (<= 1: within
    its in-flight window); inf when a replica has no base or its pool no plan."""
    shares = []
    for replica in run.replicas:
        planned = run.planned_replica_bytes.get(str(replica.get("replica", "")).split("/")[0])
        base = replica.get("base_rss", 0)
        shares.append((replica["peak_rss"] - base) / planned if planned and base else float("inf"))
    return max(shares, default=float("inf"))


class Harness:
    """Runs the stages of each (scale, store) and keeps the figures."""

    def __init__(self, args: argparse.Namespace, workdir: Path, console: Any) -> None:
        self.args, self.workdir, self.console = args, workdir, console
        self.scratch = Path(tempfile.mkdtemp(prefix="lev-scale-", dir="/tmp"))  # short: Ray's socket paths
        self.server: Any = None
        self.meter: S3Meter | None = None
        self.runs: list[RunFigures] = []
        self.baseline: dict[str, int] = {}
        """Per stage, the driver's non-import reads on the baseline run (one instance per task at the shortest
        length): what every run reads besides the store."""

    # -- setup -------------------------------------------------------------------------------------------

    def data_files(self) -> tuple[Path, Path]:
        """Synthetic SQuAD v2 and HotpotQA files in the upstream formats, big enough to fill 1M tokens."""
        from tests.qa_fixtures import write_hotpotqa, write_squad

        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        squad, hotpot = data / "squad-dev-v2.0.json", data / "hotpot_dev_distractor_v1.json"
        if not squad.exists():
            write_squad(squad, n_articles=1000, paragraphs=8)
        if not hotpot.exists():
            write_hotpotqa(hotpot, n_items=900)
        return squad, hotpot

    def start_s3(self) -> None:
        from tests.s3server import free_loopback_ports, start_seaweedfs

        (port,) = free_loopback_ports(1)
        shutil.rmtree(self.workdir / "seaweedfs", ignore_errors=True)  # a fresh server: its log is counted from 0
        self.server = start_seaweedfs(self.workdir / "seaweedfs", bucket="longeval-scale",
                                      extra_args=[f"-metricsPort={port}"], verbosity=2)
        self.meter = S3Meter(self.server, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            if not self.args.keep:
                shutil.rmtree(self.workdir / "seaweedfs" / "data", ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def env(self, store: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("LONGEVAL_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3",
                                                                 "AWS_ENDPOINT_URL", "AWS_PROFILE")}
        env.update({"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                    "RAY_DEDUP_LOGS": "0", "TMPDIR": str(self.scratch), "COLUMNS": "200"})
        env.setdefault("LONGEVAL_CACHE", str(REPO / ".cache"))
        if store == "s3":
            env.update(self.server.env())
        return env

    # -- one run -------------------------------------------------------------------------------------------

    def run(self, shape: Shape, scale: int, store: str) -> RunFigures:
        """All the stages of one shape on one store; scale 0 is the baseline run."""
        run_name = f"scale-{scale}x" if scale else "scale-baseline"
        if store == "s3":
            store_root = f"s3://{self.server.bucket}/{run_name}-{int(time.time())}"
        else:
            store_root = str(self.workdir / "local" / run_name)
            shutil.rmtree(store_root, ignore_errors=True)
        target = Store(store_root, self.server)
        overrides = shape.overrides(store_root, run_name)
        figures = RunFigures(scale, store, shape.samples, len(shape.tasks), shape.lengths, f"{store_root}/{run_name}",
                             planned_replica_bytes=planned_replica_bytes(overrides))
        began = time.perf_counter()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.console.print(f"[bold]{f'{scale}x' if scale else 'baseline'} on {store}[/]: {len(shape.tasks)} tasks x "
                           f"{len(shape.lengths)} lengths x {shape.samples} samples -> {figures.run_root}",
                           soft_wrap=True)
        for stage in STAGES:
            if figures.aborted:
                figures.stages.append(StageFigures(stage, "", status=f"skipped ({figures.aborted})"))
                continue
            if stage == "html":
                argv = ["report", figures.run_root, "-o", str(self.workdir / f"report-{scale}x-{store}.html")]
            else:
                argv = [{"resume": "run"}.get(stage, stage), *overrides]
            result = self.stage(stage, argv, target, store, run_name, log=self.workdir / "logs" / f"{run_name}-"
                                f"{store}-{stage}.log")
            result.driver_store_read = max(0, result.driver_rchar - self.baseline.get(stage, 0))
            figures.stages.append(result)
            self.console.print(f"  {stage:<9} {result.status:<4} {result.wall_s:8.1f} s  driver "
                               f"{result.driver_peak_rss / MIB:8.0f} MiB  files {sum(result.files_written.values()):6d}"
                               + (f"  S3 requests {result.s3.get('requests', 0)}" if result.s3 else ""))
            if stage == "infer" and result.status == "ok":
                figures.replicas = self.replica_records(target, run_name)
        figures.wall_s = time.perf_counter() - began
        self.summarise_store(figures, target, run_name)
        if not self.args.keep and store == "local":
            shutil.rmtree(store_root, ignore_errors=True)
        self.runs.append(figures)
        return figures

    def stage(self, stage: str, argv: list[str], target: Store, store: str, run_name: str, *,
              log: Path) -> StageFigures:
        """One `longeval` command with everything measured around it."""
        figures = StageFigures(stage, "longeval " + " ".join(argv[:1]))
        before = target.listing()
        counters = self.meter.counters() if store == "s3" and self.meter else None
        stats_file = self.scratch / f"driver-{stage}.json"
        stats_file.unlink(missing_ok=True)
        env = {**self.env(store), DRIVER_STATS_ENV: str(stats_file)}
        limit = int(self.args.memory_limit_gb * GIB)
        began_wall, began = time.time(), time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_driver", *argv], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)
            sampler = Sampler(proc.pid, interval=self.args.sample_s, limit=limit)
            sampler.start()
            try:
                code = proc.wait(timeout=self.args.stage_timeout_s)
            except subprocess.TimeoutExpired:
                sampler.aborted = f"aborted: over {self.args.stage_timeout_s:g} s"
                import psutil

                kill_tree([psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)])
                code = proc.wait()
            except BaseException:
                import psutil

                kill_tree([psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)])
                raise
            finally:
                self._wait_gone(sampler.pids)
                sampler.stop()
        figures.wall_s = time.perf_counter() - began
        ended_wall = time.time()
        if sampler.aborted:
            figures.status = sampler.aborted
        elif code != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            figures.status = f"failed (exit {code}): {' | '.join(tail)[:300]}"
        driver = json.loads(stats_file.read_text()) if stats_file.exists() else {}
        kinds = sampler.by_kind()
        figures.driver_peak_rss = int(driver.get("peak_rss") or kinds.get("driver", {}).get("peak_rss_max", 0))
        # rchar less the module imports (`import_bytes`): what the driver read as data, tokenizer and configs
        figures.driver_rchar = int(driver["rchar"] - driver["imports"] if driver
                                   else kinds.get("driver", {}).get("rchar", 0))
        figures.tree_rss_peak = sampler.total_peak
        figures.kinds = {k: v for k, v in kinds.items() if k != "driver"}
        after = target.listing()
        if store == "s3" and self.meter is not None:
            figures.s3 = self.meter.stage(began_wall, ended_wall, target.root.removeprefix("s3://").partition("/")[2])
            after_counters = self.meter.counters()
            figures.s3["bytes_sent"] = int(after_counters["sent"] - counters["sent"])
            figures.s3["bytes_received"] = int(after_counters["received"] - counters["received"])
            written = figures.s3.pop("written")  # every object the stage put, rewrites of the same bytes included
        else:
            written = [rel for rel, entry in after.items() if before.get(rel) != entry]
        figures.files_written = dict(Counter(area(rel, run_name) for rel in written))
        figures.bytes_written = sum(after[rel].size for rel in written if rel in after)
        # The bound is on what a stage leaves: parts merged away before it ended count in `files` only.
        figures.data_files_written = sum(1 for rel in written if rel in after and rel.endswith(".parquet")
                                         and area(rel, run_name) in ("instances", "predictions", "scores"))
        return figures

    @staticmethod
    def _wait_gone(pids: set[int], timeout_s: float = 20.0) -> None:
        """Wait until the driver's Ray processes have exited, so the next stage starts on a quiet machine and no
        late request of this one lands in its window."""
        import psutil

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
            time.sleep(0.2)

    def replica_records(self, target: Store, run_name: str) -> list[dict[str, Any]]:
        """What each stand-in replica recorded: rows, bytes read while feeding its engine, peak memory."""
        out = []
        for rel in sorted(target.listing()):
            if rel.startswith(f"{run_name}/engines/") and rel.endswith(".json"):
                record = target.read_json(rel)
                stats = record.get("stats", {})
                out.append({"replica": record.get("replica"), "engine": record.get("engine"),
                            "requests": stats.get("requests", 0), "read_bytes": stats.get("read_bytes", 0),
                            "peak_rss": stats.get("peak_rss_bytes", 0), "base_rss": stats.get("base_rss_bytes", 0),
                            "max_num_seqs": record.get("max_num_seqs")})
        return out

    def summarise_store(self, figures: RunFigures, target: Store, run_name: str) -> None:
        listing = target.listing()
        instances = {rel: e for rel, e in listing.items() if area(rel, run_name) == "instances"
                     and rel.endswith(".parquet")}
        figures.instance_shards = len(instances)
        figures.instance_bytes = sum(e.size for e in instances.values())
        figures.prediction_files = sum(1 for rel in listing if area(rel, run_name) == "predictions"
                                       and rel.endswith(".parquet"))
        run_inodes = {e.inode for rel, e in listing.items() if not rel.startswith("_cache/")}
        figures.cache_bytes_added = sum(e.size for rel, e in listing.items() if rel.startswith("_cache/")
                                        and not (e.inode and e.inode in run_inodes))
        figures.instances = sum(int(target.read_json(rel).get("rows", 0)) for rel in listing
                                if rel.startswith(f"{run_name}/_manifest/instances/"))


# -- targets ---------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    target: str
    store: str
    measured: dict[str, str]
    met: bool | None
    """None: not measurable in this invocation (e.g. one scale only)."""


def _growth(small: float, big: float) -> float:
    return (big / small - 1.0) if small else float("inf")


def stage_max(run: RunFigures, fn: Callable[[StageFigures], float], stages: tuple[str, ...] = STAGES) -> float:
    """The largest figure over a run's stages that ran (an aborted stage's figures are those until it was killed)."""
    return max((fn(s) for s in run.stages if s.stage in stages and not s.status.startswith("skipped")),
               default=0.0)


def per_run(name: str, store: str, runs: list[RunFigures], value: Callable[[RunFigures], float], limit: float,
            shown: Callable[[float], str]) -> Verdict:
    """A target judged on each run alone: met when every run's figure is within `limit` (an aborted run misses)."""
    measured, met = {}, True
    for run in runs:
        figure = value(run)
        measured[f"{run.scale}x"] = shown(figure)
        met = met and figure <= limit
        if run.aborted:  # the figures of what ran; the run itself misses
            measured[f"{run.scale}x"] += f" ({run.aborted})"
            met = False
    return Verdict(name, store, measured, met)


def growth(name: str, store: str, small: RunFigures, big: RunFigures, fn: Callable[[StageFigures], float]) -> Verdict:
    """A figure's growth from the smallest to the largest scale, at most 10 %."""
    a, b = stage_max(small, fn), stage_max(big, fn)
    measured = {f"{small.scale}x": f"{a / MIB:.0f} MiB", f"{big.scale}x": f"{b / MIB:.0f} MiB",
                "growth": f"{100 * _growth(a, b):+.0f} %"}
    if big.aborted or small.aborted:  # a figure of an aborted stage is where it was killed: at least that
        measured["growth"] += f" or more ({big.aborted or small.aborted})"
        return Verdict(name, store, measured, False)
    return Verdict(name, store, measured, _growth(a, b) <= 0.10)


METADATA_STAGES = ("plan", "score", "report", "html", "resume")
"""Stages whose store reads should be metadata only (on a finished root `resume` has nothing left to run)."""


def judge_store(store: str, runs: list[RunFigures]) -> list[Verdict]:
    """The issue's targets on one store; the growth targets need two scales."""
    runs = sorted(runs, key=lambda r: r.scale)
    out = [per_run("driver peak RSS <= 2 GB (any stage)", store, runs,
                   lambda r: stage_max(r, lambda s: s.driver_peak_rss), 2 * GIB, lambda v: f"{v / GIB:.2f} GB")]
    if len(runs) >= 2:
        small, big = runs[0], runs[-1]
        out.append(growth(f"driver peak RSS grows <= 10 % from {small.scale}x to {big.scale}x", store, small, big,
                          lambda s: s.driver_peak_rss))
        out.append(growth(f"replica peak RSS grows <= 10 % from {small.scale}x to {big.scale}x (bounded by the "
                          "in-flight window)", store, small, big,
                          lambda s: s.kinds.get("replica", {}).get("peak_rss_max", 0)))
    out.append(per_run("replica holds its in-flight window: peak above its base <= `longeval plan`'s replica figure "
                       "for its pool (most of any replica)", store, runs, window_bound, 1.0,
                       lambda v: f"{v:.2f} of the plan" if v != float("inf") else "no base recorded"))
    out.append(per_run("data files per stage <= 1 per instance shard (max over stages)", store, runs,
                       lambda r: stage_max(r, lambda s: s.data_files_written) / max(1, r.instance_shards), 1.0,
                       lambda v: f"{v:.2f} per shard"))
    out.append(per_run("prediction files at the end <= 1 per instance shard", store, runs,
                       lambda r: r.prediction_files / max(1, r.instance_shards), 1.0, lambda v: f"{v:.2f} per shard"))
    if store == "local":
        out.append(per_run("driver reads only metadata: its store reads <= 10 % of instance bytes (any stage but "
                           "generate; less the baseline run's reads)", store, runs,
                           lambda r: stage_max(r, lambda s: s.driver_store_read, METADATA_STAGES + ("infer",))
                           / max(1, r.instance_bytes), 0.10, lambda v: f"{100 * v:.0f} %"))
        out.append(per_run("replicas read only their rows: their bytes read <= 1.0 x instance bytes", store, runs,
                           lambda r: sum(x["read_bytes"] for x in r.replicas) / max(1, r.instance_bytes), 1.0,
                           lambda v: f"{v:.2f} x"))
        out.append(per_run("instance cache adds <= 10 % disk (hits as links)", store, runs,
                           lambda r: r.cache_bytes_added / max(1, r.instance_bytes), 0.10,
                           lambda v: f"{100 * v:.0f} %"))
        return out
    out.append(per_run("metadata stages read only metadata: S3 bytes sent <= 10 % of instance bytes (plan, score, "
                       "report, html, resume)", store, runs,
                       lambda r: stage_max(r, lambda s: s.s3.get("bytes_sent", 0), METADATA_STAGES)
                       / max(1, r.instance_bytes), 0.10, lambda v: f"{100 * v:.0f} %"))
    out.append(per_run("infer reads each row once: S3 bytes sent in infer <= 1.0 x instance bytes", store, runs,
                       lambda r: stage_max(r, lambda s: s.s3.get("bytes_sent", 0), ("infer",))
                       / max(1, r.instance_bytes), 1.0, lambda v: f"{v:.2f} x"))
    out.append(per_run("S3 requests per stage <= 3 per file touched (max over stages)", store, runs,
                       lambda r: stage_max(r, lambda s: s.s3.get("requests", 0) / max(1, s.s3.get("files_touched", 0))),
                       3.0, lambda v: f"{v:.1f} per file"))
    out.append(per_run("no repeated full listings: a prefix listed at most once per stage (one round)", store, runs,
                       lambda r: stage_max(r, lambda s: s.s3.get("most_listings_of_one_prefix", 0)), 1.0,
                       lambda v: f"{v:.0f} listings"))
    return out


def judge(runs: list[RunFigures]) -> list[Verdict]:
    """The issue's targets, met or not, for every store measured."""
    runs = [r for r in runs if r.scale]  # not the baseline
    return [v for store in dict.fromkeys(r.store for r in runs)
            for v in judge_store(store, [r for r in runs if r.store == store])]


# -- output ----------------------------------------------------------------------------------------------------


def _size(value: float) -> str:
    if value >= GIB:
        return f"{value / GIB:.2f} G"
    if value >= MIB:
        return f"{value / MIB:.0f} M"
    return f"{value / 1024:.0f} K" if value else "0"


def stage_rows(run: RunFigures) -> tuple[str, list[str], list[list[str]]]:
    """A run's title, columns and one row per stage (for the terminal and for Markdown)."""
    label = f"{run.scale}x" if run.scale else "baseline"
    title = (f"{label} on {run.store}: {run.tasks} tasks x {len(run.lengths)} lengths x {run.samples} samples "
             f"= {run.instances:,} instances in {run.instance_shards:,} shards ({_size(run.instance_bytes)}B); "
             f"{run.wall_s:.0f} s")
    columns = ["stage", "status", "wall s", "driver peak", "gen peak", "replica peak", "scorer peak", "ray other",
               "files", "data files"]
    columns += (["S3 req", "files touched", "req/file", "LIST (max/prefix)", "S3 sent"] if run.store == "s3"
                else ["driver store read", "workers read"])
    rows = []
    for s in run.stages:
        if s.status.startswith("skipped"):
            rows.append([s.stage, "skipped", *[""] * (len(columns) - 2)])
            continue

        def peak(kind: str, s: StageFigures = s) -> str:
            k = s.kinds.get(kind)
            return f"{_size(k['peak_rss_max'])} x{int(k['processes'])}" if k else ""

        row = [s.stage, s.status[:60], f"{s.wall_s:.1f}", _size(s.driver_peak_rss),
               peak("generate"), peak("replica"), peak("scorer"), peak("ray (other)"),
               str(sum(s.files_written.values())), str(s.data_files_written)]
        if run.store == "s3":
            q = s.s3
            row += [str(q.get("requests", "")), str(q.get("files_touched", "")),
                    f"{q['requests'] / max(1, q['files_touched']):.1f}" if q else "",
                    f"{q.get('list_requests', '')} ({q.get('most_listings_of_one_prefix', '')})",
                    _size(q.get("bytes_sent", 0))]
        else:
            row += [_size(s.driver_store_read), _size(sum(k["rchar"] for k in s.kinds.values()))]
        rows.append(row)
    return title, columns, rows


def stage_table(run: RunFigures) -> Any:
    from rich.table import Table

    title, columns, rows = stage_rows(run)
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, justify="left" if col in ("stage", "status") else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _markdown(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows])


def markdown(runs: list[RunFigures], verdicts: list[Verdict]) -> str:
    """The same tables as the terminal's, as Markdown (for benchmarks/README.md)."""
    parts = []
    for run in runs:
        title, columns, rows = stage_rows(run)
        parts += [f"**{title}**", "", _markdown(columns, rows), ""]
    parts += ["**targets**", "", _markdown(["store", "target", "measured", "met"], [
        [v.store, v.target, ", ".join(f"{k}: {x}" for k, x in v.measured.items()),
         "met" if v.met else ("not met" if v.met is False else "n/a")] for v in verdicts])]
    return "\n".join(parts) + "\n"


def load_runs(path: Path) -> list[RunFigures]:
    """The runs of a `--json` file, as figures again (`longeval plan`'s replica figures added to older files)."""
    data = json.loads(path.read_text())
    args, runs = data.get("args", {}), []
    for raw in data["runs"]:
        stages = [StageFigures(**stage) for stage in raw.pop("stages")]
        run = RunFigures(**raw, stages=stages)
        if not run.planned_replica_bytes and run.scale and args.get("tasks"):
            shape = Shape(args["tasks"], run.lengths, run.samples, args["replicas"], args["bucket_edges"],
                          args["step_s"], args["rows_per_step"], Path("squad.json"), Path("hotpotqa.json"))
            run.planned_replica_bytes = planned_replica_bytes(shape.overrides("/tmp/unused", "planned"))
        runs.append(run)
    return runs


def verdict_table(verdicts: list[Verdict]) -> Any:
    from rich.table import Table

    table = Table(title="targets (issue #22)", title_justify="left")
    for col in ("store", "target", "measured", "met"):
        table.add_column(col)
    for v in verdicts:
        measured = ", ".join(f"{k}: {x}" for k, x in v.measured.items())
        met = "[green]met[/]" if v.met else ("[red]not met[/]" if v.met is False else "n/a")
        table.add_row(v.store, v.target, measured, met)
    return table


# -- main ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 10], help="multiples of --samples (1x, 10x)")
    parser.add_argument("--store", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--samples", type=int, default=10, help="instances per task x length at 1x")
    parser.add_argument("--tasks", nargs="+", default=RULER_TASKS + SYNC_TASKS + MICHELANGELO_TASKS)
    parser.add_argument("--replicas", type=int, default=2, help="replicas per engine pool")
    parser.add_argument("--bucket-edges", type=int, nargs="*", default=[32768, 262144],
                        help="engine pools: lengths up to each edge (cluster.bucket_edges)")
    parser.add_argument("--step-s", type=float, default=0.08, help="the stand-in's seconds per engine step")
    parser.add_argument("--rows-per-step", type=int, default=4, help="rows the stand-in finishes per step")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="kill a stage whose processes hold more than this together (default: 80 %% of the memory "
                             "available at the start)")
    parser.add_argument("--extra", nargs="*", default=[], metavar="OVERRIDE",
                        help="more overrides for every run, e.g. suite (c)'s 'suite.subsets=[32k,128k,1m]'")
    parser.add_argument("--stage-timeout-s", type=float, default=3600.0)
    parser.add_argument("--sample-s", type=float, default=0.2, help="process sampling interval")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new folder under /tmp")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baseline run (one instance per task), whose driver reads are subtracted")
    parser.add_argument("--keep", action="store_true", help="keep local run roots (S3 data goes with the server)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables as Markdown")
    parser.add_argument("--render", type=Path, default=None,
                        help="run nothing: print (and --markdown) the tables of an earlier --json file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_driver"]:
        return driver_main(argv[1:])
    args = parse_args(argv)
    if args.render:
        return render(args)
    if args.memory_limit_gb is None:
        import psutil

        args.memory_limit_gb = round(0.8 * psutil.virtual_memory().available / GIB, 1)
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 240)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="longeval-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LONGEVAL_CACHE", str(REPO / ".cache"))
    from longeval.engines.models import build_tiny_model

    build_tiny_model()  # the tokenizer every run generates with (idempotent)
    harness = Harness(args, workdir, console)
    console.print(f"scale harness: workdir {workdir}, load average {os.getloadavg()[0]:.1f}, "
                  f"memory limit {args.memory_limit_gb:g} GiB per stage")
    try:
        squad, hotpot = harness.data_files()
        if "s3" in args.store:
            harness.start_s3()
        if "local" in args.store and not args.no_baseline:
            base = Shape(args.tasks, [min(args.lengths)], 1, args.replicas, args.bucket_edges, args.step_s,
                         args.rows_per_step, squad, hotpot, args.extra)
            harness.baseline = {s.stage: s.driver_rchar for s in harness.run(base, 0, "local").stages}
        for scale in args.scale:
            shape = Shape(args.tasks, sorted(args.lengths), args.samples * scale, args.replicas, args.bucket_edges,
                          args.step_s, args.rows_per_step, squad, hotpot, args.extra)
            for store in args.store:
                console.print(stage_table(harness.run(shape, scale, store)))
                write_json(args, harness.runs)  # after every run: a long invocation cut short keeps its figures
    finally:
        harness.close()
    verdicts = judge(harness.runs)
    for run in harness.runs:
        console.print(stage_table(run))
    console.print(verdict_table(verdicts))
    console.print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        write_json(args, harness.runs, verdicts)
        console.print(f"figures: {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown(harness.runs, verdicts))
    return 0


def render(args: argparse.Namespace) -> int:
    """`--render`: the tables and verdicts of a finished invocation, from its JSON."""
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 240)
    runs = load_runs(args.render)
    verdicts = judge(runs)
    for run in runs:
        console.print(stage_table(run))
    console.print(verdict_table(verdicts))
    if args.markdown:
        args.markdown.write_text(markdown(runs, verdicts))
    return 0


def write_json(args: argparse.Namespace, runs: list[RunFigures], verdicts: list[Verdict] | None = None) -> None:
    """Every figure, and the targets' verdicts, to `--json`."""
    if args.json:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": options, "runs": [asdict(r) for r in runs],
                                         "targets": [asdict(v) for v in verdicts or judge(runs)]},
                                        indent=2, default=str))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a terminated harness stops its drivers too
    sys.exit(main())
