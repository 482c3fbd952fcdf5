"""`report` and `compare` on an unreachable S3 store fail in seconds with a message, like `run`."""

from __future__ import annotations

import time

import pytest

from tests.cli_subprocess import flat, longeval

DEAD_STORE = {"LONGEVAL_S3_ENDPOINT": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}


@pytest.mark.parametrize("argv", [["report", "s3://bucket/run-a", "-o", "r.html"],
                                  ["compare", "s3://bucket/run-a", "s3://bucket/run-b"]])
def test_an_unreachable_store_fails_fast(argv, tmp_path):
    started = time.monotonic()
    proc = longeval(*argv[:-1], str(tmp_path / argv[-1]) if argv[-1].endswith(".html") else argv[-1],
                    env=DEAD_STORE, timeout=120)
    text = flat(proc)
    assert proc.returncode == 2, text
    assert time.monotonic() - started < 30
    assert "cannot reach the S3 endpoint http://127.0.0.1:1 (from LONGEVAL_S3_ENDPOINT)" in text
    assert "Traceback" not in text
