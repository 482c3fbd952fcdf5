"""The SeaweedFS test server starts from a folder at any depth (a checkout may lie anywhere).

A Unix socket's path must fit in 107 bytes; the server once put its filer and S3 sockets in its own folder, and
every S3 test failed from a checkout path longer than about 23 characters.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.s3server import find_weed, start_seaweedfs

pytestmark = pytest.mark.skipif(find_weed() is None, reason="SeaweedFS `weed` binary not found (dev extra)")


@pytest.mark.s3
def test_the_server_starts_and_serves_from_a_deep_folder(tmp_path: Path):
    deep = tmp_path / ("a-checkout-folder-with-a-long-name-" * 4) / "pytest-of-root" / "popen-gw1" / "seaweedfs0"
    assert len(str(deep / "filer.sock")) > 107
    server = start_seaweedfs(deep)
    try:
        client = server.client()
        client.put_object(Bucket=server.bucket, Key="x/y.txt", Body=b"hello")
        assert client.get_object(Bucket=server.bucket, Key="x/y.txt")["Body"].read() == b"hello"
        assert server.socket_dir is not None and len(str(server.socket_dir / "filer.sock")) <= 107
        assert (deep / "data").is_dir()  # the data stays in the server's own folder
    finally:
        server.stop()
    assert server.socket_dir is not None and not server.socket_dir.exists()


def test_the_suites_scratch_leaves_room_for_socket_paths():
    # vLLM binds its ZMQ sockets at <TMPDIR>/<uuid4>, in every engine the tests start (tests/conftest.py).
    tmp = os.environ["TMPDIR"]
    assert len(f"{tmp}/{'0' * 36}".encode()) <= 107 - 20, "leave room: the scratch path may grow a little"
