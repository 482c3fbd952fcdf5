"""Instance shard names: one codec builds and parses them, byte for byte what run roots hold."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longeval.config import load_config
from longeval.errors import StoreError
from longeval.planning.plan import make_plan
from longeval.store.shards import ShardName

parts = st.text(st.characters(min_codepoint=ord("0"), max_codepoint=ord("z"), exclude_characters="./\\"),
                min_size=1, max_size=12)
names = st.builds(ShardName, parts, parts, st.integers(1, 10**7), st.integers(-(10**6), 10**6),
                  st.integers(0, 10**7), st.one_of(st.just(""), st.text("0123456789abcdef", min_size=1, max_size=8)))


def test_a_generated_shard_name_is_the_format_run_roots_hold():
    name = ShardName("ruler", "niah_single_1", 4096, 42, 3)
    assert str(name) == name.text == name.prefix == "ruler.niah_single_1.L4096.s42.00003"
    assert ShardName.parse("ruler.niah_single_1.L4096.s42.00003") == name


def test_a_follow_up_shard_is_its_generated_shard_with_a_tag():
    name = ShardName.parse("longbench_v2.longbench_v2.L131072.s7.00012f0a1b2c3d")
    assert name == ShardName("longbench_v2", "longbench_v2", 131072, 7, 12, followup="0a1b2c3d")
    assert name.prefix == "longbench_v2.longbench_v2.L131072.s7.00012"
    assert name.text == "longbench_v2.longbench_v2.L131072.s7.00012f0a1b2c3d"
    assert dataclasses.replace(name, followup="").text == name.prefix


def test_a_row_names_its_generated_shard():
    row = {"family": "sync", "task": "shortest_path", "target_length": 8192, "seed": 1, "shard_index": 123456}
    assert ShardName.of(row).text == "sync.shortest_path.L8192.s1.123456"


def test_the_plan_names_its_shards_with_the_codec():
    cfg = load_config(["suite.tasks=[niah_single_1,vt]", "suite.lengths=[1024,4096]", "suite.samples=7",
                       "suite.shard_size=3"])
    for spec in make_plan(cfg).shards:
        parsed = ShardName.parse(spec.name)
        assert (f"{parsed.family}/{parsed.task}", parsed.target_length, parsed.seed, parsed.shard_index) == (
            spec.task, spec.target_length, spec.seed, spec.shard_index)
        assert not parsed.followup


@pytest.mark.parametrize("foreign", [
    "scores", "ruler.vt.L4096.s42", "ruler.vt.4096.s42.00001", "ruler.vt.L4096.s42.0001", "ruler.vt.L4096.s42.000001",
    "ruler.vt.L4096.s42.00001g12", "ruler.vt.L4096.s42.00001f", "ruler.vt.L4096.s42.00001.parquet",
    "a.b.c.L4096.s42.00001",
])
def test_a_foreign_name_is_refused_with_the_format(foreign):
    with pytest.raises(StoreError, match="not an instance shard name"):
        ShardName.parse(foreign)


@given(names)
def test_every_name_parses_back_to_itself(name):
    assert ShardName.parse(name.text) == name
    assert ShardName.parse(name.prefix) == dataclasses.replace(name, followup="")
    assert name.text.startswith(name.prefix)
