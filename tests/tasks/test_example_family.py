"""The worked example of docs/adding-a-family.md is a working family (issue #26): registered as a plugin, it
generates exact-length instances through the generate stage's own function, and the tests that loop over the
registry (the task contract, the dashboards) pass with it, with no edit outside its package.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from longeval.errors import ConfigError
from longeval.planning.plan import ShardSpec
from longeval.records import Instance
from longeval.scoring import score_prediction
from longeval.stages.generate import generate_shard
from longeval.tasks import FAMILIES, TASKS, register
from longeval.tasks.base import Draft, GenContext, TaskSpec
from longeval.tasks.family import Family, SampleData
from longeval.text import Encoder, load_encoder
from tests.example_family import FAMILY
from tests.example_family.kv_retrieval import KvParams, generate
from tests.task_instances import prediction, sample_context, task_instance

REPO = Path(__file__).resolve().parents[2]
KEY = "lost_in_the_middle/kv_retrieval"


@pytest.fixture
def registered() -> Iterator[Family]:
    """The example registered as its plugin does, and unregistered after the test (other tests count families)."""
    register(FAMILY)
    try:
        yield FAMILY
    finally:
        FAMILIES.pop(FAMILY.name, None)
        for spec in FAMILY.tasks:
            TASKS.pop(spec.key, None)


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.mark.parametrize("length", [1024, 4096])
def test_the_example_generates_exact_json_through_the_generate_stage(registered, encoder, length):
    table = generate_shard(GenContext(encoder=encoder), ShardSpec(KEY, length, 7, 0, 0, 5))
    instances = [Instance.from_row(row) for row in table.to_pylist()]
    assert [i.depth for i in instances] == list(KvParams().depths)  # stratified over instances, in percent
    for instance in instances:
        assert instance.input_tokens + instance.max_new_tokens == length  # to the token
        assert np.array_equal(encoder.encode(instance.prompt), instance.prompt_token_ids)  # as the text tokenizes
        key = json.loads(instance.meta)["key"]
        data = json.loads(instance.prompt.split("JSON data:\n", 1)[1].split("\n\nKey:", 1)[0])
        assert data[key] == instance.references[0] and len(data) > 5
        judge = TASKS[KEY].judge
        assert score_prediction(instance, prediction(instance, f" {instance.references[0]}"), judge).score == 1.0
        assert score_prediction(instance, prediction(instance, "no idea"), judge).score == 0.0


def test_registering_refuses_a_family_without_intro_or_with_a_taken_bare_name(registered):
    with pytest.raises(ConfigError, match="has no intro"):
        register(dataclasses.replace(FAMILY, name="no_intro", intro="", tasks=()))
    twin = dataclasses.replace(FAMILY.tasks[0], family="twin")
    with pytest.raises(ConfigError, match=f"bare name 'kv_retrieval' is taken by {KEY}"):
        register(dataclasses.replace(FAMILY, name="twin", tasks=(twin,)))
    assert "twin" not in FAMILIES and "no_intro" not in FAMILIES


def test_a_frame_keeps_json_braces_and_refuses_a_format_escaped_slot(encoder):
    ctx = GenContext(encoder=encoder)
    frame = ctx.frame('Answer as {"value": "..."}.\n\n{context}\n\nKey: {"k": 1}', "")
    assert '{"value": "..."}' in frame.head and '{"k": 1}' in frame.tail
    with pytest.raises(ConfigError, match="not str.format"):
        ctx.frame("Data:\n{{context}}\nKey: x", "")


@dataclasses.dataclass(frozen=True)
class FileKvParams(KvParams):
    path: str = ""
    """A JSON file of the depths to ask at: the family's own data file, named by a parameter."""


def _generate_from_file(ctx: GenContext, params: FileKvParams, **kwargs) -> Draft:
    depths = tuple(json.loads(Path(params.path).read_text(encoding="utf-8")))
    return generate(ctx, KvParams(depths=depths), **kwargs)


def _write_depths(folder: Path) -> SampleData:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "depths.json").write_text("[37.0]", encoding="utf-8")
    return SampleData(params={"kv_from_file": {"path": str(folder / "depths.json")}})


FILE_FAMILY = Family(
    name="kv_file", title="KV from a file", intro="The example, asking at the depths its data file lists.",
    tasks=(TaskSpec("kv_file", "kv_from_file", FileKvParams(), _generate_from_file, "string_match_all", 64,
                    judge=FAMILY.tasks[0].judge),),
    sample_data=_write_depths)


def test_a_family_with_its_own_data_file_brings_its_sample(encoder, tmp_path):
    """The tests over every family generate from the registry's sample data: a family that reads a file of its
    own declares `sample_data` in its package and edits nothing in tests/ (issue #26, part 3)."""
    register(FILE_FAMILY)
    try:
        ctx = sample_context(encoder, tmp_path)
        assert ctx.task_overrides["kv_from_file"] == {"path": str(tmp_path / "kv_file" / "depths.json")}
        assert ctx.data.squad_path and ctx.data.longbench_v2_path  # the built-in families' samples too
        instance = task_instance(ctx, "kv_file/kv_from_file")
        assert instance.depth == 37.0  # read from the sample file
        assert instance.input_tokens + instance.max_new_tokens == instance.target_length == 2048
    finally:
        FAMILIES.pop(FILE_FAMILY.name, None)
        TASKS.pop("kv_file/kv_from_file", None)


def test_the_tests_over_every_family_pass_with_the_example_registered():
    """The contract (for the example's task) and the dashboards' tests, in a pytest run that loads the plugin."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "tests.example_family.plugin",
         "tests/tasks/test_contract.py", "tests/tracking/test_dashboards.py",
         "-k", "kv_retrieval or not every_task_keeps"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"PASSED tests/tasks/test_contract.py::test_every_task_keeps_the_contract[{KEY}]" in run.stdout
    assert "PASSED tests/tracking/test_dashboards.py::test_every_workspace_key_is_one_the_logger_produces" in run.stdout


def test_the_docs_show_the_example_as_it_is():
    """Every line of docs/adding-a-family.md's code blocks is a line of the example's package: the page cannot
    drift from the tested code (shell commands and elided strings aside)."""
    doc = (REPO / "docs" / "adding-a-family.md").read_text()
    source = "\n".join(p.read_text() for p in (REPO / "tests" / "example_family").glob("*.py"))
    lines = {line.strip() for line in source.splitlines()}
    blocks = [block.split("\n", 1)[1] for block in doc.split("```")[1::2] if block.startswith("python")]
    assert len(blocks) >= 3
    for block in blocks:
        for line in block.splitlines():
            if line.strip() and "..." not in line:
                assert line.strip() in lines, f"docs/adding-a-family.md shows a line the example lacks: {line!r}"
