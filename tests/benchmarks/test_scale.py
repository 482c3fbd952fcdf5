"""benchmarks/scale.py's own arithmetic, without running a pipeline: what it reads from SeaweedFS's request log,
how it names Ray processes, and how it judges the issue's targets (the harness itself runs for minutes)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scale():
    spec = importlib.util.spec_from_file_location("scale_harness", REPO / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_harness"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _glog(t: float, text: str) -> str:
    stamp = time.localtime(t)
    return f"I{time.strftime('%m%d %H:%M:%S', stamp)}.{int(t % 1 * 1e6):06d} {text}\n"


def test_requests_are_counted_per_stage_from_the_server_log(scale, tmp_path: Path):
    log = tmp_path / "weed.log"
    began = time.time() - 100
    lines = [
        _glog(began - 5, 'stats.go:42 "admin" GET "/b" 200 1ms'),  # before the stage: the harness's listing
        _glog(began + 1, "s3api_object_handlers_list.go:91 ListObjectsV2Handler bucket=b prefix=run/instances/ "
                         "marker="),
        _glog(began + 1, 'stats.go:42 "admin" GET "/b" 200 1ms'),
        _glog(began + 2, "s3api_object_handlers_list.go:91 ListObjectsV2Handler bucket=b prefix=run/instances/ "
                         "marker="),
        _glog(began + 2, 'stats.go:42 "admin" GET "/b" 200 1ms'),
        _glog(began + 3, 'stats.go:42 "admin" HEAD "/b/run/instances/a.parquet" 200 1ms'),
        _glog(began + 3, 'stats.go:42 "admin" GET "/b/run/instances/a.parquet" 206 1ms'),
        _glog(began + 4, 'stats.go:42 "admin" POST "/b/run/predictions/p.parquet" 200 1ms'),
        _glog(began + 4, 'stats.go:42 "admin" PUT "/b/run/predictions/p.parquet" 200 1ms'),
        _glog(began + 4, 'stats.go:42 "admin" POST "/b/run/predictions/p.parquet" 200 1ms'),
        _glog(began + 5, 'stats.go:42 "admin" HEAD "/b/run/_manifest/x.json" 404 1ms'),
        "a line of something else\n",
    ]
    log.write_text("".join(lines))
    meter = scale.S3Meter(SimpleNamespace(bucket="b", log_path=log), metrics_port=0)
    figures = meter.stage(began, began + 10, prefix="run")
    assert figures["requests"] == 8  # not the listing before the stage
    assert figures["by_method"] == {"GET": 3, "HEAD": 2, "POST": 2, "PUT": 1}
    assert figures["files_touched"] == 3
    assert figures["written"] == ["predictions/p.parquet"]
    assert figures["full_listings"] == 2 and figures["most_listings_of_one_prefix"] == 2
    assert figures["client_errors"] == 1


def test_ray_processes_are_named_by_actor_kind(scale):
    assert scale.kind_of("ray::MapBatches(generate_shards)") == "generate"
    assert scale.kind_of("ray::MapBatches(score_units)") == "scorer"
    assert scale.kind_of("ray::Replica.run") == "replica"
    assert scale.kind_of("ray::MapWorker(MapBatches(Scorer))") == "scorer"
    assert scale.kind_of("ray::IDLE") == "ray (other)"
    assert scale.kind_of("/usr/bin/raylet --flags") is None


def _run(scale, factor: int, *, driver_gib: float, parts: int, aborted: str = ""):
    stages = [scale.StageFigures("generate", "longeval generate", data_files_written=10,
                                 driver_peak_rss=int(0.3 * scale.GIB)),
              scale.StageFigures("infer", "longeval infer", status=aborted or "ok", data_files_written=parts,
                                 driver_peak_rss=int(driver_gib * scale.GIB),
                                 kinds={"replica": {"processes": 2, "peak_rss_max": 5e8, "peak_rss_sum": 1e9,
                                                    "rchar": 0}})]
    return scale.RunFigures(factor, "local", 10 * factor, 1, [4096], "root", stages=stages, instance_shards=10,
                            instance_bytes=10**9, prediction_files=parts)


def test_targets_are_judged_per_run_and_across_scales(scale):
    verdicts = {v.target: v for v in scale.judge([_run(scale, 1, driver_gib=1.0, parts=10),
                                                   _run(scale, 10, driver_gib=1.05, parts=30)])}
    assert verdicts["driver peak RSS <= 2 GB (any stage)"].met
    assert verdicts["driver peak RSS grows <= 10 % from 1x to 10x"].met
    files = verdicts["data files per stage <= 1 per instance shard (max over stages)"]
    assert not files.met and files.measured == {"1x": "1.00 per shard", "10x": "3.00 per shard"}
    grown = scale.judge([_run(scale, 1, driver_gib=1.0, parts=10), _run(scale, 10, driver_gib=1.5, parts=10)])
    assert not next(v for v in grown if v.target.startswith("driver peak RSS grows")).met
    aborted = scale.judge([_run(scale, 1, driver_gib=1.0, parts=10),
                           _run(scale, 10, driver_gib=1.0, parts=10, aborted="aborted: memory")])
    assert all(v.met is False for v in aborted if "10x" in str(v.measured) or "growth" in v.measured)


def test_a_replica_is_judged_by_what_it_added_above_its_base_against_its_pools_planned_figure(scale):
    run = _run(scale, 1, driver_gib=1.0, parts=10)
    run.planned_replica_bytes = {"pool0": 100, "pool1": 400}
    run.replicas = [{"replica": "pool0/r0", "peak_rss": 1080, "base_rss": 1000},
                    {"replica": "pool1/r1", "peak_rss": 1300, "base_rss": 1000}]
    assert scale.window_bound(run) == 0.8  # pool0's 80 of 100; pool1's 300 of 400 is 0.75
    run.replicas.append({"replica": "pool1/r0", "peak_rss": 1500, "base_rss": 1000})
    assert scale.window_bound(run) == 1.25
    run.replicas.append({"replica": "pool0/r1", "peak_rss": 900})  # an older record: no base, no verdict
    assert scale.window_bound(run) == float("inf")


def test_longeval_plan_sizes_each_pool_of_a_scale_run(scale, tmp_path: Path):
    shape = scale.Shape(["ruler/vt"], [4096, 65536], 10, 2, [32768], 0.08, 4, tmp_path / "s.json", tmp_path / "h.json")
    planned = scale.planned_replica_bytes(shape.overrides(str(tmp_path), "r"))
    assert set(planned) == {"pool0", "pool1"} and 0 < planned["pool0"] < planned["pool1"]
