"""The LongBench v2 file read from a real S3 server (SeaweedFS on loopback, access keys enforced)."""

from __future__ import annotations

import json

import pytest

from longeval.errors import DataFileError
from longeval.tasks.longbench_v2 import load_longbench_v2
from tests.tasks.longbench_v2.lb2_helpers import make_item

pytestmark = [pytest.mark.s3]


def test_data_file_is_read_from_s3(s3_env):
    items = [make_item(i) for i in range(5)]
    s3_env.client().put_object(Bucket=s3_env.bucket, Key="lbv2/data.json", Body=json.dumps(items).encode())
    data = load_longbench_v2(f"s3://{s3_env.bucket}/lbv2/data.json")
    assert [item.item_id for item in data.items] == [item["_id"] for item in items]


def test_missing_s3_file_names_the_file_and_the_key(s3_env):
    with pytest.raises(DataFileError, match=r"lbv2/nothing.json'.*file not found.*suite.data.longbench_v2_path"):
        load_longbench_v2(f"s3://{s3_env.bucket}/lbv2/nothing.json")


def test_wrong_credentials_are_a_clear_error(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(DataFileError, match="cannot read it"):
        load_longbench_v2(f"s3://{s3_env.bucket}/lbv2/data.json")
