"""Reading the official data file: three formats, clear errors for every malformed field, filters, caching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longeval.errors import ConfigError, DataFileError
from longeval.tasks.longbench_v2 import LongBenchV2Params, load_longbench_v2, select
from longeval.tasks.longbench_v2.data import FIELDS
from longeval.tasks.longbench_v2.task import item_at, load, selected
from longeval.text.tokenizer import Encoder
from tests.tasks.longbench_v2.lb2_helpers import context_for, make_item, write_json, write_jsonl, write_parquet

ITEMS = [make_item(i) for i in range(6)]


@pytest.mark.parametrize("writer, name", [(write_json, "data.json"), (write_jsonl, "data.jsonl"),
                                          (write_parquet, "data.parquet")])
def test_each_format_gives_the_same_items(tmp_path: Path, writer, name: str) -> None:
    data = load_longbench_v2(writer(tmp_path / name, ITEMS))
    assert len(data.items) == 6
    first = data.items[0]
    assert (first.item_id, first.domain, first.difficulty, first.length, first.answer) == (
        "66f00000", "Single-Document QA", "easy", "short", "A")
    assert first.choices == ("first option 0", "second option 0", "third option 0", "fourth option 0")
    assert first.context == ITEMS[0]["context"]
    assert [item.item_id for item in data.items] == [item["_id"] for item in ITEMS]  # file order
    assert data.by_id("66f00003").answer == "D" and data.by_id("nope") is None


def test_format_is_sniffed_not_taken_from_the_name(tmp_path: Path) -> None:
    assert len(load_longbench_v2(write_jsonl(tmp_path / "data.json", ITEMS)).items) == 6
    assert len(load_longbench_v2(write_parquet(tmp_path / "data.bin", ITEMS)).items) == 6


def test_file_uri_goes_through_pyarrow(tmp_path: Path) -> None:
    path = write_json(tmp_path / "data.json", ITEMS)
    assert len(load_longbench_v2(f"file://{path}").items) == 6
    with pytest.raises(DataFileError, match="file not found"):
        load_longbench_v2(f"file://{tmp_path}/missing.json")


def test_extra_columns_and_a_bom_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text("\ufeff" + json.dumps([{**ITEMS[0], "extra": 1}]), encoding="utf-8")
    assert load_longbench_v2(str(path)).items[0].item_id == "66f00000"


def test_missing_file_names_path_format_and_setting(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.json")
    with pytest.raises(DataFileError) as err:
        load_longbench_v2(missing)
    message = str(err.value)
    assert missing in message and "file not found" in message
    assert "suite.data.longbench_v2_path" in message and "JSON Lines or Parquet" in message and "choice_A" in message


def test_unset_path_says_longeval_cannot_download(encoder: Encoder) -> None:
    ctx = context_for(encoder, None)
    with pytest.raises(DataFileError, match=r"suite\.data\.longbench_v2_path is not set.*cannot download"):
        load(ctx, LongBenchV2Params())


def test_a_data_object_without_the_field_is_treated_as_unset(encoder: Encoder) -> None:
    from longeval.tasks.base import DataPaths, GenContext

    ctx = GenContext(encoder=encoder, data=DataPaths())
    with pytest.raises(DataFileError, match="longbench_v2_path is not set"):
        load(ctx, LongBenchV2Params())


@pytest.mark.parametrize("field", FIELDS)
def test_each_missing_field_is_named_with_item_and_id(tmp_path: Path, field: str) -> None:
    bad = dict(ITEMS[2])
    del bad[field]
    path = write_json(tmp_path / "data.json", [ITEMS[0], ITEMS[1], bad])
    with pytest.raises(DataFileError) as err:
        load_longbench_v2(path)
    message = str(err.value)
    assert f"has no field {field!r}" in message and "item 2" in message and path in message
    assert ("_id None" if field == "_id" else "_id '66f00002'") in message


@pytest.mark.parametrize("field, value, why", [
    ("difficulty", "medium", "not one of easy|hard"),
    ("length", "huge", "not one of short|medium|long"),
    ("answer", "E", "not one of A|B|C|D"),
    ("answer", "b", "not one of A|B|C|D"),
    ("context", 12, "has type int, expected a string"),
    ("choice_C", ["x"], "has type list, expected a string"),
    ("question", None, "has no field 'question'"),
])
def test_each_bad_value_is_named(tmp_path: Path, field: str, value, why: str) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [ITEMS[0], make_item(1, **{field: value})])
    with pytest.raises(DataFileError) as err:
        load_longbench_v2(path)
    message = str(err.value)
    assert "item 1 (_id '66f00001')" in message and repr(field) in message and why in message


@pytest.mark.parametrize("content, why", [
    ("[1, 2]", "item 0 has type int, expected a JSON object"),
    ("[{\"_id\": ", "not valid JSON"),
    ("{\"_id\": \"a\"}\nnot json\n", "line 2 is not a JSON record"),
    ("[]", "the file holds no items"),
    ("", "the file holds no items"),
])
def test_files_that_are_not_the_format(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "data.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFileError, match=why):
        load_longbench_v2(str(path))


def test_binary_garbage_and_broken_parquet(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(DataFileError, match="not UTF-8"):
        load_longbench_v2(str(garbage))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataFileError, match="not a readable Parquet"):
        load_longbench_v2(str(broken))


def test_a_repeated_id_is_an_error(tmp_path: Path) -> None:
    path = write_json(tmp_path / "data.json", [ITEMS[0], ITEMS[1], make_item(2, _id=ITEMS[0]["_id"])])
    with pytest.raises(DataFileError, match="item 2 repeats _id '66f00000' of item 0"):
        load_longbench_v2(path)


def test_filters_keep_file_order(tmp_path: Path) -> None:
    data = load_longbench_v2(write_json(tmp_path / "data.json", ITEMS))
    ids = lambda items: [int(item.item_id[3:]) for item in items]  # noqa: E731
    assert ids(select(data)) == [0, 1, 2, 3, 4, 5]
    assert ids(select(data, difficulties=["hard"])) == [1, 3, 5]
    assert ids(select(data, lengths=("long", "short"))) == [0, 2, 3, 5]
    assert ids(select(data, domains=["Multi-Document QA"])) == [1, 4]
    assert ids(select(data, domains=["Multi-Document QA"], difficulties=["easy"])) == [4]


def test_filter_values_that_cannot_match_are_config_errors(tmp_path: Path) -> None:
    data = load_longbench_v2(write_json(tmp_path / "data.json", ITEMS))
    with pytest.raises(ConfigError, match=r"difficulties: 'medium' not known; use values from: easy, hard"):
        select(data, difficulties=["medium"])
    with pytest.raises(ConfigError, match=r"lengths: 'Long' not known"):
        select(data, lengths=["Long"])
    with pytest.raises(ConfigError, match=r"domains: 'Long In-context Learning' not known; .*Multi-Document QA"):
        select(data, domains=["Long In-context Learning"])  # a real domain, but not in this file
    with pytest.raises(ConfigError, match="must be a list"):
        select(data, lengths="long")


def test_index_beyond_the_selection_tells_the_user_to_lower_samples(tmp_path: Path, encoder: Encoder) -> None:
    ctx = context_for(encoder, write_json(tmp_path / "data.json", ITEMS))
    params = LongBenchV2Params(difficulties=("hard",))
    assert item_at(ctx, params, 2).item_id == "66f00005"
    with pytest.raises(ConfigError) as err:
        item_at(ctx, params, 3)
    assert str(err.value) == (
        f"longbench_v2: instance 3 was asked for, but only 3 of the 6 items in {str(tmp_path / 'data.json')!r} "
        "pass the filters (domains=[], difficulties=['hard'], lengths=[]); set suite.samples to at most 3 "
        "or widen suite.params.longbench_v2"
    )


def test_the_file_is_read_once_per_context(tmp_path: Path, encoder: Encoder) -> None:
    path = tmp_path / "data.json"
    ctx = context_for(encoder, write_json(path, ITEMS))
    params = LongBenchV2Params(lengths=("medium",))
    assert [item.item_id for item in selected(ctx, params)] == ["66f00001", "66f00004"]
    path.unlink()  # a second read would fail: the parsed file and the selection come from the cache
    assert load(ctx, params).items[0].item_id == "66f00000"
    assert [item.item_id for item in selected(ctx, params)] == ["66f00001", "66f00004"]


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_directory_given_as_the_data_path_says_so_and_names_the_file_inside(tmp_path: Path, scheme: str) -> None:
    (tmp_path / "lb2").mkdir()
    write_json(tmp_path / "lb2" / "data.json", ITEMS)
    with pytest.raises(DataFileError) as err:
        load_longbench_v2(f"{scheme}{tmp_path}/lb2")
    message = str(err.value)
    assert message.startswith(f"LongBench v2 file '{scheme}{tmp_path}/lb2': is a directory, not a file; it holds "
                              "data.json. Expected the official LongBench v2 data")
    assert message.endswith(f"set suite.data.longbench_v2_path={scheme}{tmp_path}/lb2/data.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="is a directory, not a file, and holds no .json, .jsonl or .parquet file"):
        load_longbench_v2(f"{scheme}{tmp_path}/empty")
