"""Ray for a run: where its temp dir goes, how it starts, how its errors read, and the multi-node storage guard."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import time

from longeval import interrupt, reaper
from longeval.config import Config
from longeval.errors import ConfigError, LongevalError, find_error
from longeval.store import RunRoot

log = logging.getLogger(__name__)


NO_ACTOR_RESTARTS = {"max_restarts": 0}
"""Ray Data restarts its pool actors by default, and since it hands them their constructor arguments through the
object store, every run printed an error-level line (ray #53727) that such restarts might fail. Our stages need no
restarts: a dead actor fails the stage, and the rerun resumes from the committed shards. (map_batches takes it
through its `ray_remote_args`, which Ray 2.5x marks deprecated for 2.64 and offers no named parameter for yet.)"""


# Ray puts Unix sockets at <temp_dir>/session_<date>_<time>_<pid>/sockets/plasma_store, 62 to 66 bytes
# below its temp dir, and AF_UNIX paths stop at 107 bytes.
_RAY_SOCKET_SUFFIX = 66  # 62 with a 5-digit pid; room for 7 digits and a longer date
_AF_UNIX_MAX = 107


def ray_temp_dir(tmp: str | None = None) -> str:
    """Ray's temp dir under TMPDIR when its socket paths fit there, else a short one under /tmp.

    A long TMPDIR (a deep CI checkout, a per-test scratch folder) would otherwise make `ray.init`
    fail with "AF_UNIX path length cannot exceed 107 bytes".
    """
    tmp = tmp or tempfile.gettempdir()
    under_tmp = os.path.join(tmp, "ray")
    if len(under_tmp.encode()) + _RAY_SOCKET_SUFFIX <= _AF_UNIX_MAX:
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
        except (ConnectionError, RuntimeError, ValueError) as exc:
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
        ray.init(address="local", num_cpus=cfg.cluster.num_cpus or max(2, os.cpu_count() or 2), _temp_dir=temp_dir,
                 **kwargs)
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
