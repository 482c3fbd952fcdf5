"""TAIL's documents and built dataset on a real S3 server (SeaweedFS on loopback, access keys enforced)."""

from __future__ import annotations

import pytest

from longeval.tasks.tail import load_domains, load_tail_dataset, make_manifest, write_tail_dataset
from tests.tasks.tail.tail_helpers import domain_of, question_for, report

pytestmark = [pytest.mark.s3]


def test_documents_are_read_from_s3(s3_env):
    client = s3_env.client()
    for name in ("finance", "law"):
        client.put_object(Bucket=s3_env.bucket, Key=f"docs/{name}/a.txt", Body=report(name, 120).encode())
    domains = load_domains(f"s3://{s3_env.bucket}/docs")
    assert [d.name for d in domains] == ["finance", "law"]
    assert all(len(d.segments) >= 2 for d in domains)


def test_dataset_round_trips_through_s3(s3_env):
    domain = domain_of("finance", 300)
    questions = [question_for(domain, 1, 0.5)]
    uri = f"s3://{s3_env.bucket}/bench"
    write_tail_dataset(uri, questions, {domain.name: domain.segments},
                       make_manifest(generator_model="test-generator", seed=3, domains=[domain]))
    data = load_tail_dataset(uri)
    assert [q.question_id for q in data.questions] == [questions[0].question_id]
    assert list(data.segments[domain.name]) == list(domain.segments)
