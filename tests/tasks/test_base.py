"""What every task shares: output budgets that follow the papers, the decoding record, data fingerprints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longeval.tasks import TASKS, get_task
from longeval.tasks.base import (
    DECODING,
    DataPaths,
    GenContext,
    data_fingerprint,
    file_fingerprint,
    instance_rng,
    make_instance,
    output_budget,
)
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder
from tests.s3server import S3Server, s3_env, seaweedfs  # noqa: F401  (the server fixtures)

PAPER_BUDGETS = {
    # RULER's tokens_to_generate (scripts/synthetic.yaml; anchors.md)
    "ruler/niah_single_1": 128, "ruler/niah_multivalue": 128, "ruler/vt": 30, "ruler/cwe": 120, "ruler/fwe": 50,
    "ruler/qa_1": 32, "ruler/qa_2": 32,
    # LongBench v2 Appendix: max_new_tokens=128 zero-shot (1024 for the CoT call, 128 for its answer call)
    "longbench_v2/longbench_v2": 128,
    # TAIL §4: "limit the maximum output to 512 tokens" (with step-by-step thinking)
    "tail/tail": 512,
    # Michelangelo §2.2: MRCR reproduces "a chunk of text up to 512 tokens"
    "michelangelo/mrcr": 512,
}


@pytest.mark.parametrize(("key", "budget"), PAPER_BUDGETS.items())
def test_default_budgets_are_the_papers(key: str, budget: int) -> None:
    assert TASKS[key].max_new_tokens == budget


def test_longbench_v2_budgets_and_its_decoding_deviation_are_declared() -> None:
    from longeval.tasks.longbench_v2 import LongBenchV2Params, max_new_tokens

    spec = TASKS["longbench_v2/longbench_v2"]
    assert max_new_tokens(LongBenchV2Params(cot=True)) == 1024 and spec.followup_budget == 128
    assert "temperature 0.1" in spec.decoding_deviation and "greedily" in spec.decoding_deviation
    others = [k for k, s in TASKS.items() if s.decoding_deviation and s.family != "longbench_v2"]
    assert others == []  # RULER, SYNC and TAIL decode greedily (temperature 0) as we do; Michelangelo does not say


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


def test_every_instance_records_its_decoding_and_any_deviation(encoder: Encoder) -> None:
    ctx = GenContext(encoder=encoder, fmt=PromptFormat())
    spec = get_task("ruler/niah_single_1")
    draft = spec.generate(ctx, spec.params, target_length=1024, max_new_tokens=output_budget(spec, ctx.fmt, 1024),
                          rng=instance_rng(3, spec.key, 1024, 0), index=0)
    plain = json.loads(make_instance(spec, draft, ctx, target_length=1024, seed=3, shard_index=0, index=0).meta)
    assert plain["decoding"] == DECODING == "greedy" and "decoding_deviation" not in plain
    sampled = dataclasses.replace(spec, decoding_deviation="the paper samples at 0.1")
    inst = make_instance(sampled, draft, ctx, target_length=1024, seed=3, shard_index=0, index=0)
    assert json.loads(inst.meta)["decoding_deviation"] == "the paper samples at 0.1"


# -- data fingerprints ---------------------------------------------------------------------------------


def test_a_local_data_file_is_fingerprinted_by_its_bytes(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text("[1]")
    first = file_fingerprint(str(data))
    assert first == file_fingerprint(f"file://{data}") != b"-"
    data.write_text("[2]")
    assert file_fingerprint(str(data)) != first
    assert file_fingerprint(str(tmp_path / "missing.json")) == file_fingerprint(None) == b"-"


@pytest.mark.s3
def test_a_remote_data_file_is_fingerprinted_by_size_and_etag(s3_env: S3Server) -> None:  # noqa: F811
    """Changed remote data must change the instance ids (it used to hash as '-')."""
    client, bucket = s3_env.client(), s3_env.bucket
    uri = f"s3://{bucket}/data/longbench_v2.json"
    assert file_fingerprint(uri) == b"-"  # not there yet
    client.put_object(Bucket=bucket, Key="data/longbench_v2.json", Body=b'[{"_id": "a"}]')
    first = file_fingerprint(uri)
    paths = DataPaths(longbench_v2_path=uri)
    before = data_fingerprint(paths)
    assert first != b"-" and file_fingerprint(uri) == first
    client.put_object(Bucket=bucket, Key="data/longbench_v2.json", Body=b'[{"_id": "b"}]')  # same size, new bytes
    assert file_fingerprint(uri) != first
    assert data_fingerprint(paths) != before
    client.put_object(Bucket=bucket, Key="data/longbench_v2.json", Body=b'[{"_id": "a"}]')
    assert file_fingerprint(uri) == first  # the same bytes again: the same ETag (their MD5), the same ids
    assert data_fingerprint(DataPaths(longbench_v2_path=f"s3://{bucket}/data/missing.json")) == data_fingerprint(
        DataPaths())
