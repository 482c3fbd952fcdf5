"""Metadata reads never pay for prompts: a run root whose prompt columns are huge, read through every path that
wants ids, lengths, errors or shard membership, reads a small fraction of its bytes (measured by the process's
own read counter, /proc/self/io). And an engine replica reads only the row groups of the prompts it runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longeval.config import load_config
from longeval.errors import DamagedShardError
from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, Prediction
from longeval.stages.followup import write_followups
from longeval.stages.infer import META_COLUMNS, PromptReader, pending_predictions, pool_shards, schedule
from longeval.stages.infer.dispatch import Work
from longeval.stages.score import scoring_input
from longeval.stages.summarise import planned_ids, rows_with_meta, run_status
from longeval.store.compact import compact_predictions
from longeval.store.run_root import RunRoot
from longeval.store.shards import ShardName

TOKENS = 1_000_000  # per prompt: a 1M-token instance
ROWS = 4
SHARDS = [ShardName("ruler", "niah_single_1", 4096, 42, i) for i in range(2)]
OVERRIDES = ["model=tiny_random", "suite.tasks=[niah_single_1]", "suite.lengths=[4096]", f"suite.samples={2 * ROWS}",
             f"suite.shard_size={ROWS}"]


def _rchar() -> int:
    """Bytes this process has read through read(2)/pread(2) so far (page cache hits included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.fixture
def huge(tmp_path: Path) -> tuple[RunRoot, int]:
    """Two instance shards of four 1M-token prompts (random, so they do not compress) and their predictions."""
    root = RunRoot(str(tmp_path / "run"))
    rng = np.random.default_rng(0)
    for shard in SHARDS:
        rows = [{"instance_id": f"{shard.shard_index}-{i}", "family": shard.family, "task": shard.task,
                 "context_id": f"{shard.shard_index}-{i}", "target_length": shard.target_length,
                 "input_tokens": TOKENS, "max_new_tokens": 128, "seed": shard.seed, "shard_index": shard.shard_index,
                 "index": shard.shard_index * ROWS + i, "prompt": rng.bytes(TOKENS).hex(),
                 "prompt_token_ids": rng.integers(0, 50_000, TOKENS, dtype=np.int32), "references": ["1234567"],
                 "meta": "{}", "metric": "string_match_all"} for i in range(ROWS)]
        root.write_table("instances", shard.text, pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA))
    preds = [Prediction(instance_id=f"{s.shard_index}-{i}", model_id="m", output="1234567", output_tokens=3,
                        finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1).to_row()
             for s in SHARDS for i in range(ROWS)]
    root.write_part("predictions", pa.Table.from_pylist(preds, schema=PREDICTION_SCHEMA))
    size = sum(f.stat().st_size for f in (root.local_path() / "instances").iterdir())
    assert size > 20e6
    return root, size


def test_every_metadata_path_reads_a_small_fraction_of_the_instances(huge, tiny_model_path) -> None:
    root, size = huge
    cfg = load_config([*OVERRIDES, f"store.root={root.local_path().parent}", "run_name=run"])
    paths = {
        "metadata columns": lambda: root.read_stage("instances", INSTANCE_SCHEMA, columns=META_COLUMNS),
        "pending_predictions": lambda: pending_predictions(root),
        "planned_ids": lambda: planned_ids(cfg, root),
        "rows_with_meta": lambda: rows_with_meta(root, pa.table({"family": ["ruler"], "model_id": ["m"],
                                                                 "instance_id": ["0-0"]}), "ruler"),
        "run_status": lambda: run_status(cfg, root),
        "scoring_input": lambda: scoring_input(cfg, root),
        "write_followups (no two-call task)": lambda: write_followups(cfg, root, str(tiny_model_path)),
        "compact_predictions": lambda: compact_predictions(root),
    }
    for name, read in paths.items():
        before = _rchar()
        read()
        assert _rchar() - before < 0.02 * size, f"{name} read {_rchar() - before:,} of {size:,} bytes"


def test_a_family_table_reads_only_its_own_family_shards(huge) -> None:
    root, _ = huge
    scores = pa.table({"family": ["sync"], "model_id": ["m"], "instance_id": ["x"]})
    before = _rchar()
    rows = rows_with_meta(root, scores, "sync")  # the root holds only RULER shards
    assert _rchar() - before < 20_000 and rows == {"m": [{"family": "sync", "model_id": "m", "instance_id": "x",
                                                          "meta": "{}"}]}


def test_a_replica_reads_only_the_row_groups_of_its_prompts(huge) -> None:
    root, size = huge
    reader = PromptReader(root)
    before = _rchar()
    request = reader.request("1-2", SHARDS[1].prefix)
    read = _rchar() - before
    assert len(request.prompt_token_ids) == TOKENS and request.max_new_tokens == 128
    assert read < 0.3 * size / len(SHARDS), f"read {read:,} bytes for one prompt of {ROWS * len(SHARDS)}"
    # held: at most `group_bytes` of row groups (Arrow buffers), or the one group being read
    held = sum(t.nbytes for t in reader.groups.values())
    assert held == reader.group_bytes and (held <= reader.group_bytes_max or len(reader.groups) == 1)
    reader.close()


def _short_shards(root: RunRoot, n: int) -> list[ShardName]:
    """`n` instance shards of ten 4K-token prompts of vt (random contexts): one row group each."""
    rng = np.random.default_rng(1)
    shards = [ShardName("ruler", "vt", 4096, 42, i) for i in range(n)]
    for shard in shards:
        rows = [{"instance_id": f"{shard.shard_index}-{i}", "family": "ruler", "task": "vt", "target_length": 4096,
                 "context_id": f"c{rng.integers(1 << 30)}", "input_tokens": 4096, "max_new_tokens": 16, "seed": 42,
                 "shard_index": shard.shard_index, "index": i, "prompt": "",
                 "prompt_token_ids": rng.integers(0, 50_000, 4096, dtype=np.int32), "references": ["x"],
                 "meta": "{}", "metric": "string_match_all"} for i in range(10)]
        root.write_table("instances", shard.text, pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA))
    return shards


def test_a_cells_prompts_are_read_shard_by_shard_once_each_holding_a_few_shards(tmp_path: Path) -> None:
    """The schedule puts a task and length's prompts shard by shard, so a replica's reader reads each shard's
    bytes about once while it keeps only the last few shards (`open_files`): what it holds does not grow with
    the number of shards (30 here)."""
    root = RunRoot(str(tmp_path / "run"))
    shards = _short_shards(root, 30)
    size = sum(f.stat().st_size for f in (root.local_path() / "instances").iterdir())
    work = schedule(root.read_stage("instances", INSTANCE_SCHEMA, columns=META_COLUMNS))
    order = [int(w.instance_id.split("-")[0]) for w in work]  # the shard index
    assert order == sorted(order)  # shard by shard, though context ids are random
    reader = PromptReader(root)
    before, most = _rchar(), 0
    for w in work:
        assert len(reader.request(w.instance_id, w.shard).prompt_token_ids) == 4096
        most = max(most, len({name for name, _ in reader.groups}))
    read = _rchar() - before
    assert most <= reader.open_files_max < len(shards)
    reader.close()
    assert read < 1.5 * size, f"read {read:,} bytes of {size:,} for 300 prompts in 30 shards"


def test_a_replica_lets_go_of_a_row_group_once_it_asked_for_every_row_of_it(tmp_path: Path) -> None:
    """What a replica holds of its shards is the group it is on, not its budget: kept row groups of shards it
    was done with made a short pool's replica grow by the budget (32 MiB) from 1x to 10x the samples. A group
    another replica shares (some rows never asked for here) stays, within the budget."""
    root = RunRoot(str(tmp_path / "run"))
    shards = _short_shards(root, 6)
    reader = PromptReader(root)
    one_group = 0
    for shard in shards[:5]:
        for i in range(10):
            reader.request(f"{shard.shard_index}-{i}", shard.prefix)
            one_group = max(one_group, reader.group_bytes)
        assert reader.groups == {} and reader.group_bytes == 0, f"kept {shard.text} after all its rows were asked"
    assert 4096 * 10 * 4 <= one_group < 2 * 4096 * 10 * 4  # a shard's token ids, once
    reader.request("5-0", shards[5].prefix)  # the other nine go to another replica
    assert list(reader.groups) == [(shards[5].text, 0)] and reader.group_bytes > 0
    reader.close()


def test_a_replica_given_its_shards_by_the_driver_lists_nothing(huge, monkeypatch) -> None:
    """On S3 every replica's own listing of the instances stage was one more LIST per replica per command."""
    root, _ = huge
    names = sorted(root.shard_names("instances"))
    rows = [Work("1-2", "1-2", 1, SHARDS[1].prefix), Work("0-0", "0-0", 1, SHARDS[0].prefix)]
    assert list(pool_shards(root, rows[:1])) == [SHARDS[1].text]  # only the shards that hold the pool's prompts

    def no_listing(stage: str) -> set[str]:
        raise AssertionError(f"listed {stage}")

    monkeypatch.setattr(root, "shard_names", no_listing)
    reader = PromptReader(root, shards=names)
    assert len(reader.request("1-2", SHARDS[1].prefix).prompt_token_ids) == TOKENS
    reader.close()


@pytest.mark.parametrize("reader", ["column read", "replica's prompt read"])
@pytest.mark.parametrize(("damage", "offset"), [("value", 1000), ("header", 3)])
def test_a_damaged_page_sets_the_shard_aside(huge, reader: str, damage: str, offset: int) -> None:
    """A damaged value fails the page's checksum, a damaged header its decoding (a thrift error, once a plain
    StoreError that left the shard in place). Either way the shard is set aside, so a rerun writes it again.
    (Metadata columns come from the footer's copy, `store.FOOTER_METADATA`: the read that reaches pages here is of
    token ids.)"""
    root, _ = huge
    name = SHARDS[0].text
    path = root.local_path() / "instances" / f"{name}.parquet"
    import pyarrow.parquet as pq

    group = pq.ParquetFile(path).metadata.row_group(0)
    (column,) = [group.column(i) for i in range(group.num_columns)
                 if group.column(i).path_in_schema.startswith("prompt_token_ids.")]
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + offset] ^= 0xFF  # the header starts at the page's offset, its values follow
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedShardError, match="set aside") as raised:
        if reader == "column read":
            root.read_shard("instances", name, INSTANCE_SCHEMA, columns=["prompt_token_ids"])
        else:
            PromptReader(root).request("0-0", SHARDS[0].prefix)
    assert ("checksum" if damage == "value" else "header") in str(raised.value)
    assert name not in root.shard_names("instances")  # set aside: a rerun writes it again


def test_longeval_has_pyarrow_allocate_with_the_c_library_so_freed_memory_goes_back():
    """mimalloc, Arrow's default, kept about 0.2 MB per shard a driver read (issue #22); a user's own setting
    still wins."""
    import os
    import subprocess
    import sys

    code = "import longeval, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"},
                            capture_output=True, text=True, check=True)
    assert (ours.stdout.strip(), theirs.stdout.strip()) == ("system", "jemalloc")


def test_memory_freed_by_earlier_prompts_goes_back_before_a_long_prompt_is_listed(huge, monkeypatch) -> None:
    """A 1M-token prompt becomes a 41 MB list: what the prompts before it freed goes back to the system first,
    so a replica's peak is its window, not its window plus glibc's keep (issue #22). Short prompts skip it."""
    from longeval.stages.infer import reader as reader_module

    root, _ = huge
    calls: list[int] = []
    monkeypatch.setattr(reader_module, "release_freed_memory", lambda: calls.append(1))
    reader = PromptReader(root)
    assert len(reader.request("1-2", SHARDS[1].prefix).prompt_token_ids) == TOKENS and calls == [1]
    monkeypatch.setattr(reader_module, "RELEASE_BEFORE_TOKENS", TOKENS + 1)
    assert len(reader.request("1-3", SHARDS[1].prefix).prompt_token_ids) == TOKENS and calls == [1]
    reader.close()


def test_a_read_error_that_is_not_damage_stays_a_store_error_with_a_finite_cause_chain(huge) -> None:
    """A shard gone between its footer read and its row group read is the store's error, not a damaged shard;
    its cause chain must end (an error that is its own cause sends the drivers' cause walks round forever)."""
    from longeval.errors import StoreError
    from longeval.stages.infer import cause_of

    root, _ = huge
    name = SHARDS[0].text
    fragment = root.open_shard("instances", name)
    (root.local_path() / "instances" / f"{name}.parquet").unlink()
    with pytest.raises(StoreError) as raised:
        root.read_row_groups("instances", name, fragment, [0], ["prompt_token_ids"])
    assert not isinstance(raised.value, DamagedShardError)
    assert raised.value.__cause__ is not None and raised.value.__cause__.__cause__ is not raised.value.__cause__
    assert cause_of(raised.value)  # the walk to the innermost error ends


def test_a_row_groups_planned_bytes_are_what_it_holds_once_read(huge) -> None:
    """The reader sizes a run of row groups from the footer before reading it (`ids_bytes`) and keeps what it
    read within its budget by `nbytes`: an estimate below `nbytes` (it left out the values' validity bitmap, an
    eighth of a byte a token) let a run that filled the budget push out its own last group, read again."""
    from longeval.stages.infer.reader import ids_bytes

    root, _ = huge
    name = SHARDS[0].text
    fragment = root.open_shard("instances", name)
    groups = list(range(fragment.metadata.num_row_groups))
    tables = root.read_row_groups("instances", name, fragment, groups, ["prompt_token_ids"])
    for g, table in zip(groups, tables, strict=True):
        assert 0 <= ids_bytes(fragment.metadata, g) - table.nbytes <= 64, (g, table.nbytes)


def test_a_replica_keeps_the_index_of_its_open_shards_only(huge) -> None:
    """A replica that visits every shard of a pool keeps the ids and read row groups of the shards it has open,
    not of every shard it visited; a shard it comes back to is opened and indexed again."""
    root, _ = huge
    reader = PromptReader(root, open_files=1)
    for shard in SHARDS:
        assert len(reader.request(f"{shard.shard_index}-0", shard.prefix).prompt_token_ids) == TOKENS
    assert set(reader.where) == set(reader.read) == {SHARDS[1].text}
    assert len(reader.request("0-1", SHARDS[0].prefix).prompt_token_ids) == TOKENS
    assert set(reader.where) == set(reader.read) == {SHARDS[0].text}
