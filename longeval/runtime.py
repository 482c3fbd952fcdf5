"""Ray for a run: where its temp dir goes, how it starts, how its errors read, and the multi-node storage guard."""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile

from longeval.config import Config
from longeval.errors import ConfigError, LongevalError
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


def init_ray(cfg: Config) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if cfg.cluster.address:
        kwargs["address"] = cfg.cluster.address
    elif os.environ.get("RAY_ADDRESS"):  # inside `ray job submit`: join the job's cluster as it is
        pass
    else:
        kwargs["num_cpus"] = cfg.cluster.num_cpus or max(2, os.cpu_count() or 2)
        kwargs["_temp_dir"] = ray_temp_dir()
    ray.init(**kwargs)
    # Our own progress bars stand in for Ray Data's; its INFO lines go to Ray's log files, not the terminal
    # (LONGEVAL_LOG=INFO brings them back).
    ctx = ray.data.DataContext.get_current()  # importing ray.data sets up its loggers: adjust them after
    logging.getLogger("ray.data").setLevel(os.environ.get("LONGEVAL_LOG", "ERROR"))
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # Rows reach the engine in the same order and the same batches on every run: vLLM on CPU is not
    # batch-invariant, so identical greedy outputs need identical batch composition.
    ctx.execution_options.preserve_order = True


def unwrap_ray_errors(fn, *args, **kwargs):
    """Re-raise a LongevalError that happened inside a Ray worker as itself, so the CLI prints it plainly."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        cause = exc
        while cause is not None and not isinstance(cause, LongevalError):
            cause = getattr(cause, "cause", None) or cause.__cause__
        if isinstance(cause, LongevalError):
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
