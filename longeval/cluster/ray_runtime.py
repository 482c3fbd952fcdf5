"""Ray for a run: where its temp dir goes, how it starts, how its errors read, and the multi-node storage guard."""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import pickle
import socket
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any

from longeval.cluster import interrupt, reaper
from longeval.config import Config
from longeval.errors import ConfigError, LongevalError, RayStartError, find_error
from longeval.store.run_root import RunRoot

if TYPE_CHECKING:
    import ray

log = logging.getLogger(__name__)


NO_ACTOR_RESTARTS = {"max_restarts": 0}
"""Ray Data restarts its pool actors by default, and since it hands them their constructor arguments through the
object store, every run printed an error-level line (ray #53727) that such restarts might fail. Our stages need no
restarts: a dead actor fails the stage, and the rerun resumes from the committed shards."""

TASK_RETRIES = {"max_retries": 2}
"""Ray Data retries a task whose worker died without end (`max_retries=-1`): a shard that kills its worker every
time (out of memory) would hang the run. A stage's task writes its shard whole or not at all, so a retry on
another worker is safe: two are allowed, then the stage fails and the rerun resumes from the committed shards."""

_REMOTE_ARGS_DEPRECATED = r"`ray_remote_args` is deprecated"
"""The start of the RayDeprecationWarning Ray 2.60's map_batches gives for any `**ray_remote_args`."""


def map_pool(ds: ray.data.Dataset, fn: Any, **kwargs: Any) -> ray.data.Dataset:
    """`ds.map_batches(fn, **kwargs)` with our failure policy: pool actors (`fn` a class) never restarted
    (`NO_ACTOR_RESTARTS`), tasks (`fn` a function) retried twice at most (`TASK_RETRIES`).

    Ray 2.60's map_batches takes num_cpus, memory, resources, runtime_env and the like as named parameters (give
    them in `kwargs`), but max_restarts and max_retries only through `**ray_remote_args`, whose
    RayDeprecationWarning was printed on every run. Only that warning is silenced, here where it is known: the
    pinned Ray still takes the arguments, and tests/cluster/test_ray_runtime.py fails on a Ray whose map_batches
    would not, before a run would.
    """
    from ray.util.annotations import RayDeprecationWarning

    policy = NO_ACTOR_RESTARTS if isinstance(fn, type) else TASK_RETRIES
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_REMOTE_ARGS_DEPRECATED, category=RayDeprecationWarning)
        return ds.map_batches(fn, **kwargs, **policy)


def run_key(*parts: Any) -> str:
    """A fingerprint of what a stage's Ray task was given (a run's config, model, root): a worker process keeps
    what it built for one run while the tasks it is given are for that run."""
    return hashlib.sha256(pickle.dumps(parts)).hexdigest()


RAY_SOCKET_SUFFIX = 66
"""Bytes Ray puts below its temp dir for a Unix socket (<temp_dir>/session_<date>_<time>_<pid>/sockets/
plasma_store, 62 to 66 bytes): 62 with a 5-digit pid; room for 7 digits and a longer date."""
AF_UNIX_MAX = 107
"""The longest AF_UNIX socket path, in bytes."""


def ray_temp_dir(tmp: str | None = None) -> str:
    """Ray's temp dir under TMPDIR when its socket paths fit there, else a short one under /tmp.

    A long TMPDIR (a deep CI checkout, a per-test scratch folder) would otherwise make `ray.init`
    fail with "AF_UNIX path length cannot exceed 107 bytes".
    """
    tmp = tmp or tempfile.gettempdir()
    under_tmp = os.path.join(tmp, "ray")
    if len(under_tmp.encode()) + RAY_SOCKET_SUFFIX <= AF_UNIX_MAX:
        return under_tmp
    digest = hashlib.sha256(tmp.encode()).hexdigest()[:8]
    return f"/tmp/ray-{digest}"  # one per TMPDIR, so concurrent sessions with their own TMPDIR stay apart


MALLOC_ARENA_MAX = "2"
"""glibc's heaps per process for the workers of a local Ray when the run root is on S3 (and, in
cluster/runtime_env.yaml, for a cluster's jobs), unless the environment sets it: by default every thread that
allocates gets a heap of its own, up to 8 a core, and the S3 client's threads left freed memory in theirs. A
replica of a 64K-256K pool on SeaweedFS added 117-126 MiB above its base, with two heaps 105 MiB against 110
planned (benchmarks/README.md, "Two heaps per process"). Not for local roots: a CPU engine's threads allocate
too, and there the limit buys nothing."""


def init_ray(cfg: Config) -> None:
    """Start Ray for this run: join the cluster `cluster.address` or `RAY_ADDRESS` names, else start a private
    local Ray of our own, even when another one runs on the machine.

    Ray's own default would attach to whatever `ray start --head` left on the machine (it reads
    `<temp dir>/ray_current_cluster`), and then refuse our `num_cpus` with a traceback; a Ray someone else started
    is joined only when asked for (`cluster.address=auto` joins that one). Which Ray was used is logged.
    """
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    address, source = cfg.cluster.address, "cluster.address"
    if not address and os.environ.get("RAY_ADDRESS"):  # e.g. inside `ray job submit`: join the job's cluster
        address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address:
        if not _reachable(address):  # Ray itself would retry for minutes before failing
            raise ConfigError(f"cannot join the Ray cluster at {address} ({source}): nothing answers there. Start it "
                              f"first (`ray start --head`), fix the address, or unset {source} to run on a private "
                              "local Ray")
        try:  # RAY_ADDRESS is read by Ray itself, as before: so it also picks up a token of a token-auth cluster
            ray.init(**({"address": address} if source == "cluster.address" else {}), **kwargs)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError, or Ray's bare Exception
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"cannot join the Ray cluster at {address} ({source}): {first}. Start it first (`ray "
                              f"start --head`), fix the address, or unset {source} to run on a private local Ray"
                              ) from exc
        log.warning("Ray: joined the cluster at %s (%s=%s; %d node(s), %g CPUs)", _gcs_address(), source, address,
                    len([n for n in ray.nodes() if n.get("Alive")]), ray.cluster_resources().get("CPU", 0))
    else:
        temp_dir = ray_temp_dir()
        running = running_ray(temp_dir)
        started = time.time()
        if cfg.store.root.startswith("s3://"):  # Ray's processes inherit this one's environment, so its workers too
            os.environ.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)
        if cfg.cluster.metrics_export_port:
            kwargs["_metrics_export_port"] = cfg.cluster.metrics_export_port
        before = sessions(temp_dir)
        try:
            ray.init(address="local", num_cpus=cfg.cluster.num_cpus or max(2, os.cpu_count() or 2),
                     _temp_dir=temp_dir, **kwargs)
        except Exception as exc:  # Ray's own start-up failures are a bare Exception, RuntimeError, OSError...
            raise RayStartError(start_failure(exc, cfg, temp_dir, before)) from exc
        reaper.watch(started)  # else a kill -9 of this process leaves Ray's agents running for a minute
        if running:
            log.warning("Ray: another Ray runs on this machine (%s); this run started a private local Ray of its "
                        "own (%s). To run on that one instead: cluster.address=%s (or RAY_ADDRESS=%s)",
                        running, _gcs_address(), running, running)
    interrupt.restore_sigterm()  # ray.init's own handler exits at once: ours ends the run as Ctrl-C does
    # Our own progress bars stand in for Ray Data's; its INFO lines go to Ray's log files, not the terminal
    # (LONGEVAL_LOG=INFO brings them back).
    ctx = ray.data.DataContext.get_current()  # importing ray.data sets up its loggers: adjust them after
    logging.getLogger("ray.data").setLevel(os.environ.get("LONGEVAL_LOG", "ERROR"))
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # Rows reach the engine in the same order and the same batches on every run: vLLM on CPU is not
    # batch-invariant, so identical greedy outputs need identical batch composition.
    ctx.execution_options.preserve_order = True


RAY_NODE_WAIT_S = 30
"""How long Ray waits for a new node's raylet to register (`raylet_start_wait_time_s` in ray/_private/node.py,
not a setting): on a busy machine, or with a process its agents need dead, `ray.init` gives up after it."""

RAY_AGENT_PORT = 52365
"""The port every Ray's dashboard agent tries first (Ray's DEFAULT_DASHBOARD_AGENT_LISTEN_PORT); `ray.init` has no
argument to move it. The agent of a second Ray on the machine runs without its HTTP server instead."""


def start_failure(exc: BaseException, cfg: Config, temp_dir: str, before: set[str] | None = None) -> str:
    """One line for a private local Ray that did not start: what failed, the cause on this machine (a taken port
    and its holder, the other Rays, the load), the fix, and where Ray's logs are. `before`: the session folders
    under `temp_dir` before this start (the new one is the failed start's; others may start at the same time)."""
    text = str(exc)
    first = " ".join((text.strip().splitlines() or [type(exc).__name__])[0].split())
    wait = os.environ.get("RAY_gcs_server_port_wait_time_s")  # noqa: SIM112 (Ray's own name)
    if "timed out during startup" in text:
        what = f"Ray's node did not come up within Ray's {RAY_NODE_WAIT_S} s"
    elif "Failed to start GCS" in text:
        what = "Ray's GCS (its head process) did not start"
    elif "gcs_server_port" in text and "Timed out" in text:
        what = "Ray's GCS did not report its port in time" + (
            f" (RAY_gcs_server_port_wait_time_s={wait})" if wait is not None else "")
    else:
        what = f"Ray did not start ({first})"
    causes: list[str] = []
    fixes: list[str] = []
    ports = []  # the fixed ports this Ray asked for, each with what sets it
    if cfg.cluster.metrics_export_port:
        ports.append((cfg.cluster.metrics_export_port, "cluster.metrics_export_port",
                      "set cluster.metrics_export_port to a free port, or to null (a free one Ray picks)"))
    if (os.environ.get("RAY_GCS_SERVER_PORT") or "").isdigit():
        ports.append((int(os.environ["RAY_GCS_SERVER_PORT"]), "RAY_GCS_SERVER_PORT",
                      "unset RAY_GCS_SERVER_PORT (a free port Ray picks) or set it to a free port"))
    for port, source, fix in ports:
        holder = port_holder(port)
        if holder is not None:
            causes.append(f"port {port} ({source}) is taken by {holder}")
            fixes.append(fix)
    if wait is not None and "gcs_server_port" in text:
        fixes.append(f"raise RAY_gcs_server_port_wait_time_s (now {wait}) or unset it (Ray's default is 30 s)")
    taken = bool(causes)  # a taken port says it all: no other Ray, no load
    session = _new_session(temp_dir, before or set())
    others = [] if taken else other_rays(exclude=session)
    if others:
        agent = port_holder(RAY_AGENT_PORT)
        held = f"; {agent} holds port {RAY_AGENT_PORT}, Ray's dashboard-agent port" if agent else ""
        runs = "another Ray runs" if len(others) == 1 else f"{len(others)} other Rays run"
        causes.append(f"{runs} on this machine ({'; '.join(others[:3])}{held})")
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus and not taken:
        causes.append(f"the machine is busy (load average {load:.1f} on {cpus} CPUs)")
    if not fixes:
        if others:
            fixes.append("stop the other Ray if it is yours and idle (`ray stop` ends every Ray you started on this "
                         "machine; another run's private Ray ends with that run) or join it with cluster.address="
                         "HOST:PORT (or RAY_ADDRESS)")
        fixes.append("rerun when the machine is less busy" if load > cpus else "rerun (finished work is kept)")
    logs = f"; Ray's logs: {session}/logs" if session else ""
    cause = "; ".join(causes) or (first if first not in what else "no taken port, other Ray or load seen here")
    return f"{what}: {cause}. To fix: {'; or '.join(fixes)}{logs}"


def port_holder(port: int) -> str | None:
    """Who listens on `port` here ("pid N (name)", or "another process" when that cannot be seen), None if free."""
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no holder
            probe.bind(("", port))
        return None
    except OSError:
        pass
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):  # another user's sockets, or no permission to list them
        pass
    return "another process"


def other_rays(exclude: str | None = None) -> list[str]:
    """The Rays running on this machine (one raylet each), but the session `exclude`: each as its raylet's pid, its
    GCS address and who started it (`ray start`, or the process whose private Ray it is)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        args = proc.info["cmdline"] or []
        if not args or os.path.basename(args[0]) != "raylet":
            continue
        flags = dict(a.split("=", 1) for a in args[1:] if a.startswith("--") and "=" in a)
        session = flags.get("--session_dir", "")
        if exclude and os.path.realpath(session) == os.path.realpath(exclude):
            continue
        gcs = flags.get("--gcs-address", "?")
        found.append(f"raylet pid {proc.info['pid']}, GCS {gcs}, {_started_by(session)}")
    return found


def _started_by(session: str) -> str:
    """Who started a Ray session: its folder name ends with the starting process's pid."""
    import psutil

    pid = os.path.basename(session).rsplit("_", 1)[-1]
    try:
        command = " ".join(psutil.Process(int(pid)).cmdline())
    except (ValueError, psutil.Error):
        return "started by `ray start`" if pid.isdigit() else "started by ?"
    if " start" in command and "ray" in command:
        return f"started by `ray start` (pid {pid})"
    return f"the private Ray of pid {pid} ({command[:80]})"


def sessions(temp_dir: str) -> set[str]:
    """The session folders under a Ray temp dir."""
    return set(glob.glob(os.path.join(temp_dir, "session_2*")))


def _new_session(temp_dir: str, before: set[str]) -> str | None:
    """The session folder a start made: the newest one that was not there before it."""
    new = sorted(sessions(temp_dir) - before, key=os.path.getmtime)
    return new[-1] if new else None


def running_ray(temp_dir: str | None = None) -> str | None:
    """The address of a live Ray that `ray start` left on this machine, as Ray's own lookup would find it (its
    `ray_current_cluster` file under our temp dir or the default one), or None."""
    default = os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")  # Ray's own
    for folder in dict.fromkeys([temp_dir or ray_temp_dir(), default]):
        try:
            with open(os.path.join(folder, "ray_current_cluster")) as f:
                address = f.read().strip()
        except OSError:
            continue
        if address and _reachable(address, timeout_s=0.5):  # a file left by a Ray that is gone says nothing
            return address
    return None


def _reachable(address: str, timeout_s: float = 5.0) -> bool:
    """Whether a `host:port` address accepts a connection; other forms (`auto`, `ray://...`) are left to Ray."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _gcs_address() -> str:
    import ray

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # an older Ray without it: the address is only for the log line
        return "?"


def unwrap_ray_errors(fn, *args, **kwargs):
    """Re-raise a LongevalError that happened inside a Ray worker as itself, so the CLI prints it plainly."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        cause = find_error(exc, LongevalError)
        if cause is not None and cause is not exc:  # never `raise exc from exc`: an error its own cause loops walks
            raise cause from exc
        raise


def check_shared_storage(cfg: Config, root: RunRoot) -> None:
    """Refuse a local run root on a cluster of several nodes unless it is marked shared: every node's actors
    write shards, and on local disks they would scatter over the nodes."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and root.local_path() is not None and not cfg.store.shared_filesystem:
        raise ConfigError(
            f"this Ray cluster has {len(nodes)} nodes and the run root {root.uri} is a local path: each node would "
            "write its shards to its own disk. Use store.root=s3://bucket/prefix, or, if that path is on a "
            "filesystem every node mounts (NFS, Lustre), say so with store.shared_filesystem=true")


def check_shards_seen(root: RunRoot, stage: str, written: dict[str, str]) -> None:
    """`store.shared_filesystem=true` is a promise this checks: every shard the workers wrote (name → the host
    that wrote it) must be under the run root as this driver sees it. On nodes with disks of their own the
    generation workers' shards are on their disks only; stopping here, before any inference, loses nothing but
    them."""
    seen = set(root.shard_names(stage))
    missing = sorted((name, host) for name, host in written.items() if name not in seen)
    if missing:
        name, host = missing[0]
        raise ConfigError(
            f"store.shared_filesystem=true, but {len(missing)} of the {len(written)} {stage} shards the workers "
            f"wrote are not under {root.uri} on this host ({socket.gethostname()}), e.g. {name}, written on {host}: "
            "the nodes do not share that path. Use store.root=s3://bucket/prefix, or a path every node mounts; "
            "nothing was inferred yet")
