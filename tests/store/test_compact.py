"""Merging prediction parts into one file per instance shard, and what a crash in the middle leaves (local and on
a real S3 server, SeaweedFS)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, ErrorKind, Prediction, latest_predictions
from longeval.stages.infer import final_ids
from longeval.store.compact import compact_predictions
from longeval.store.run_root import RunRoot
from longeval.store.shards import ORPHANS, ShardName, compacted_prefix
from tests.s3server import S3Server

pytestmark = [pytest.mark.s3]

SHARDS = [ShardName("ruler", "vt", 4096, 0, i) for i in range(3)]


def _instances(root: RunRoot) -> list[str]:
    """Three instance shards of four instances each (only the columns compaction reads matter)."""
    ids = []
    for shard in SHARDS:
        rows = [{"instance_id": f"{shard.shard_index}-{i}", "family": shard.family, "task": shard.task,
                 "target_length": shard.target_length, "seed": shard.seed, "shard_index": shard.shard_index,
                 "prompt_token_ids": [1, 2, 3], "references": ["x"]} for i in range(4)]
        root.write_table("instances", shard.text, pa.Table.from_pylist(rows, schema=INSTANCE_SCHEMA))
        ids += [r["instance_id"] for r in rows]
    return ids


def _pred(iid: str, output: str = "ok", error: str = "") -> dict:
    return Prediction(instance_id=iid, model_id="m", output=output, output_tokens=1, finish_reason="stop",
                      cached_prompt_tokens=0, latency_s=0.1, error=error).to_row()


def _parts(root: RunRoot, ids: list[str]) -> None:
    """Parts as replicas leave them: a few rows each, across shards, an engine error and its retry, a row of an
    instance no shard holds."""
    rows = [_pred(i) for i in ids[:-1]]
    rows.append(_pred(ids[-1], "", ErrorKind.ENGINE_ERROR.format("died")))
    for start in range(0, len(rows), 5):
        root.write_part("predictions", pa.Table.from_pylist(rows[start:start + 5], schema=PREDICTION_SCHEMA))
    root.write_part("predictions", pa.Table.from_pylist([_pred(ids[-1], "retried")], schema=PREDICTION_SCHEMA))
    root.write_part("predictions", pa.Table.from_pylist([_pred("gone")], schema=PREDICTION_SCHEMA))


def _view(root: RunRoot) -> dict[str, tuple[str, str]]:
    """What every reader sees: one prediction per instance."""
    preds = latest_predictions(root.read_stage("predictions", PREDICTION_SCHEMA))
    return {r["instance_id"]: (r["output"], r["error"]) for r in preds.to_pylist()}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path) -> RunRoot:
    if request.param == "local":
        return RunRoot(str(tmp_path / "run"))
    server: S3Server = request.getfixturevalue("s3_env")
    return RunRoot(f"s3://{server.bucket}/compact-{tmp_path.name}")


def test_the_merge_keeps_the_answer_of_the_replica_a_lost_ones_prompt_went_to(tmp_path) -> None:
    """The lost replica's part is the one a reader would take (it sorts last: the part names are hashes of their
    ids, so a late part with one of several other ids is picked to sort so); the merge keeps the row of the
    replica the prompt went to, and the late part's other row, of a prompt the lost one had finished."""
    for j in range(1, 12):
        root = RunRoot(str(tmp_path / f"run{j}"))
        ids = _instances(root)
        root.write_part("predictions", pa.Table.from_pylist([{**_pred(ids[0], "r0's"), "replica": "pool0/r0"}],
                                                            schema=PREDICTION_SCHEMA))
        late = [{**_pred(i, "late"), "replica": "pool0/r1"} for i in (ids[0], ids[j])]
        root.write_part("predictions", pa.Table.from_pylist(late, schema=PREDICTION_SCHEMA))
        if _view(root)[ids[0]][0] == "late":
            break
    else:
        pytest.fail("no late part sorted last")
    compact_predictions(root, given_away={("pool0/r1", ids[0])})
    preds = root.read_stage("predictions", PREDICTION_SCHEMA).sort_by("instance_id")
    assert preds["instance_id"].to_pylist() == sorted([ids[0], ids[j]])
    assert dict(zip(preds["instance_id"].to_pylist(), preds["output"].to_pylist(), strict=True)) == {
        ids[0]: "r0's", ids[j]: "late"}


def test_parts_become_one_file_per_instance_shard_and_readers_see_the_same(root: RunRoot) -> None:
    ids = _instances(root)
    _parts(root, ids)
    before, final_before = _view(root), final_ids(root)
    done = compact_predictions(root)
    names = root.shard_names("predictions")
    assert sorted(compacted_prefix(n) for n in names) == sorted([s.prefix for s in SHARDS] + [ORPHANS])
    assert done.read == 5 and done.removed == 5 and done.rows == len(ids) + 1
    assert _view(root) == before and final_ids(root) == final_before
    assert before[ids[-1]] == ("retried", "")
    # one row per instance now, in each file
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == len(set(preds["instance_id"].to_pylist())) == len(ids) + 1
    # nothing left to merge: no reads, no writes, the same files
    assert compact_predictions(root).read == 0 and root.shard_names("predictions") == names


def test_new_parts_are_merged_with_their_shards_file_only(root: RunRoot) -> None:
    ids = _instances(root)
    root.write_part("predictions", pa.Table.from_pylist([_pred(i) for i in ids], schema=PREDICTION_SCHEMA))
    compact_predictions(root)
    first = root.shard_names("predictions")
    root.write_part("predictions", pa.Table.from_pylist([_pred(ids[0], "again")], schema=PREDICTION_SCHEMA))
    done = compact_predictions(root)
    assert done.read == 2  # shard 0's file and the new part; shards 1 and 2 untouched
    after = root.shard_names("predictions")
    assert len(after) == 3 and len(after & first) == 2
    assert _view(root)[ids[0]] == ("again", "")


@pytest.mark.parametrize(("step", "crash_after"), [("write_table", 0), ("write_table", 2), ("remove_shard", 0),
                                                   ("remove_shard", 1), ("remove_shard", 4)])
def test_a_merge_cut_short_loses_and_duplicates_nothing_once_redone(root: RunRoot, step: str, crash_after: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between the merge's steps (fault injection: the n-th write or removal raises, as a kill -9 would
    stop the merge there)."""
    ids = _instances(root)
    _parts(root, ids)
    before = _view(root)
    original, calls = getattr(RunRoot, step), []

    def dying(self: RunRoot, stage: str, name: str, *args) -> None:
        if stage == "predictions" and len(calls) == crash_after:
            raise KeyboardInterrupt("killed")
        calls.append(name)
        original(self, stage, name, *args)

    monkeypatch.setattr(RunRoot, step, dying)
    with pytest.raises(KeyboardInterrupt):
        compact_predictions(root)
    assert _view(root) == before  # readers lose nothing while both copies exist
    monkeypatch.setattr(RunRoot, step, original)
    compact_predictions(root)
    assert _view(root) == before
    preds = root.read_stage("predictions", PREDICTION_SCHEMA)
    assert preds.num_rows == len(set(preds["instance_id"].to_pylist())), "duplicated rows"
    assert all(compacted_prefix(n) is not None for n in root.shard_names("predictions"))
