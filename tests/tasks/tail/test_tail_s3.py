"""TAIL's documents and built dataset on a real S3 server (SeaweedFS on loopback, access keys enforced)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from longeval.store import ENDPOINT_ENV_VARS
from longeval.tasks.tail import load_domains, load_tail_dataset, make_manifest, write_tail_dataset
from tests.s3server import S3Server, seaweedfs  # noqa: F401  (the module-scoped server fixture)
from tests.tasks.tail.tail_helpers import domain_of, question_for, report


@pytest.fixture
def server(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:  # noqa: F811
    for var in (*ENDPOINT_ENV_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in seaweedfs.env().items():
        monkeypatch.setenv(var, value)
    yield seaweedfs


def test_documents_are_read_from_s3(server):
    client = server.client()
    for name in ("finance", "law"):
        client.put_object(Bucket=server.bucket, Key=f"docs/{name}/a.txt", Body=report(name, 120).encode())
    domains = load_domains(f"s3://{server.bucket}/docs")
    assert [d.name for d in domains] == ["finance", "law"]
    assert all(len(d.segments) >= 2 for d in domains)


def test_dataset_round_trips_through_s3(server):
    domain = domain_of("finance", 300)
    questions = [question_for(domain, 1, 0.5)]
    uri = f"s3://{server.bucket}/bench"
    write_tail_dataset(uri, questions, {domain.name: domain.segments},
                       make_manifest(generator_model="test-generator", seed=3, domains=[domain]))
    data = load_tail_dataset(uri)
    assert [q.question_id for q in data.questions] == [questions[0].question_id]
    assert list(data.segments[domain.name]) == list(domain.segments)
