"""The LongBench v2 file read from a real S3 server (SeaweedFS on loopback, access keys enforced)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from longeval.errors import DataFileError
from longeval.store import ENDPOINT_ENV_VARS
from longeval.tasks.longbench_v2 import load_longbench_v2
from tests.s3server import S3Server, seaweedfs  # noqa: F401  (the module-scoped server fixture)
from tests.tasks.longbench_v2.lb2_helpers import make_item


@pytest.fixture
def server(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:  # noqa: F811
    for var in (*ENDPOINT_ENV_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in seaweedfs.env().items():
        monkeypatch.setenv(var, value)
    yield seaweedfs


def test_data_file_is_read_from_s3(server):
    items = [make_item(i) for i in range(5)]
    server.client().put_object(Bucket=server.bucket, Key="lbv2/data.json", Body=json.dumps(items).encode())
    data = load_longbench_v2(f"s3://{server.bucket}/lbv2/data.json")
    assert [item.item_id for item in data.items] == [item["_id"] for item in items]


def test_missing_s3_file_names_the_file_and_the_key(server):
    with pytest.raises(DataFileError, match=r"lbv2/nothing.json'.*file not found.*suite.data.longbench_v2_path"):
        load_longbench_v2(f"s3://{server.bucket}/lbv2/nothing.json")


def test_wrong_credentials_are_a_clear_error(server, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(DataFileError, match="cannot read it"):
        load_longbench_v2(f"s3://{server.bucket}/lbv2/data.json")
