"""A run root keeps one configuration: the settings that identify it are listed once (`RUN_SETTINGS`)."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from omegaconf import OmegaConf

from longeval.config import load_config, to_yaml
from longeval.errors import ConfigError
from longeval.run.provenance import COMPARED_SETTINGS, RUN_SETTINGS, check_same_config, run_identity
from longeval.store.run_root import RunRoot


@pytest.fixture
def made(tmp_path):
    """A run root made with a small suite (its config.yaml only), and that config."""
    cfg = load_config(["suite.tasks=[niah_single_1]", "suite.lengths=[1024]", "suite.samples=2"])
    root = RunRoot(str(tmp_path / "run"))
    root.write_text("config.yaml", to_yaml(cfg))
    return cfg, root


def test_the_stored_config_has_the_identity_of_the_config_that_wrote_it(made):
    cfg, root = made
    stored = OmegaConf.create(root.read_text("config.yaml"))
    assert run_identity(stored) == run_identity(cfg)
    assert list(run_identity(cfg)) == list(RUN_SETTINGS)
    assert run_identity(cfg)["suite.seed"] == cfg.suite.seed


def test_an_older_config_lacking_a_setting_reads_as_none():
    identity = run_identity({"model": {"path": "m"}, "suite": {"seed": 1}})
    assert identity["model.path"] == "m" and identity["suite.seed"] == 1
    assert identity["model.ruler_template"] is None and identity["suite.data.squad_path"] is None


def test_the_same_config_reruns_and_more_samples_too(made):
    cfg, root = made
    check_same_config(cfg, root)
    check_same_config(replace(cfg, suite=replace(cfg.suite, samples=5)), root)


@pytest.mark.parametrize(("key", "change"), [
    ("suite.seed", lambda c: replace(c, suite=replace(c.suite, seed=c.suite.seed + 1))),
    ("model.path", lambda c: replace(c, model=replace(c.model, path="/elsewhere"))),
    ("model.system_prompt", lambda c: replace(c, model=replace(c.model, system_prompt="Be brief."))),
])
def test_a_changed_identifying_setting_is_refused_by_name(made, key, change):
    cfg, root = made
    with pytest.raises(ConfigError, match=rf"was made with {key}=.*; use another run_name"):
        check_same_config(change(cfg), root)


def test_changed_data_behind_the_root_is_refused(made):
    cfg, root = made
    root.write_json("versions.json", {"data_fingerprint": "not-the-current-data"})
    with pytest.raises(ConfigError, match="data files behind run root"):
        check_same_config(cfg, root)


def test_runs_compare_on_the_run_settings_but_the_model_and_data_location():
    assert set(COMPARED_SETTINGS) < set(RUN_SETTINGS)
    assert set(RUN_SETTINGS) - set(COMPARED_SETTINGS) == {
        "model.path", "suite.data.essay_dir", "suite.data.squad_path", "suite.data.hotpotqa_path",
        "suite.data.longbench_v2_path"}


def test_completing_an_adaptive_root_into_the_full_sweep_needs_its_shard_size_and_order(tmp_path):
    """An adaptive run writes shards of 10 in each cell's shuffled order by default; a full-sweep rerun on its
    root without those settings is refused, naming them, and with them goes ahead."""
    args = ["suite=ruler", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=20"]
    adaptive = load_config([*args, "suite.adaptive=true"])
    root = RunRoot(str(tmp_path / "run"))
    root.write_text("config.yaml", to_yaml(adaptive))
    with pytest.raises(ConfigError, match=r"suite\.shard_size=10 and suite\.shuffle=true; .*suite\.shard_size=25 "
                                          r"and suite\.shuffle=false .*Pass the root's settings"):
        check_same_config(load_config(args), root)
    check_same_config(load_config([*args, "suite.shard_size=10", "suite.shuffle=true"]), root)
    # a shuffled cell's order depends on its count: more (or fewer) samples would reshuffle finished shards
    with pytest.raises(ConfigError, match=r"suite\.samples=20.*suite\.samples=30"):
        check_same_config(load_config([*args[:-1], "suite.samples=30", "suite.adaptive=true"]), root)


WHOLE = load_config(["suite.tasks=[niah_single_1]", "suite.lengths=[1024]", "suite.samples=2"])


@pytest.mark.parametrize(("damage", "why"), [
    (lambda text: text[:100], r"it lacks suite, cluster, store and \d+ more of the keys every config.yaml"),
    (lambda text: text[:text.index("reasoning:")], r"it lacks suite, cluster, store"),
    (lambda text: text[:text.index("reasoning:") + 4], r"it does not parse as YAML \(could not find expected ':' "),
    (lambda text: "- just\n- a list\n", "it holds a list, not a mapping of settings"),
    (lambda text: "", "it is empty"),
    (lambda text: text.replace("reasoning: false", "reasoning: maybe"),
     r"it does not match the config schema \(model.reasoning must be true or false, got 'maybe'\)"),
], ids=["cut", "cut_before_reasoning", "unparsable", "list", "empty", "schema"])
def test_a_damaged_config_yaml_is_named_with_what_it_is_checked_against_and_how_to_restore_it(tmp_path, damage, why):
    """Issue #46: a cut-short config.yaml read as `made with model.reasoning=None` and the advice was to delete the
    root. The error names the damaged file, what it is checked against, and a restoration that keeps the work."""
    root = RunRoot(str(tmp_path / "run"))
    root.write_text("config.yaml", damage(to_yaml(WHOLE)))
    with pytest.raises(ConfigError) as err:
        check_same_config(WHOLE, root)
    message = str(err.value)
    assert re.match(rf"{re.escape(root.path('config.yaml'))} is damaged: {why}", message), message
    assert "This command's config is checked against it, the config run root" in message
    assert f"move it aside (e.g. to {root.path('config.yaml')}.damaged) and rerun this command" in message
    assert "delete" not in message and "was made with model" not in message and "\n" not in message


def test_a_config_yaml_that_is_not_text_is_damaged(tmp_path):
    root = RunRoot(str(tmp_path / "run"))
    root.write_bytes("config.yaml", b"\xff\xfe" + to_yaml(WHOLE).encode("utf-16-le"))
    with pytest.raises(ConfigError, match=r"is damaged: it is not UTF-8 text"):
        check_same_config(WHOLE, root)


def test_deleting_a_root_is_advised_only_when_it_holds_no_predictions(made):
    """Another run_name is always offered; deleting the root only while no prediction would go with it."""
    cfg, root = made
    reseeded = replace(cfg, suite=replace(cfg.suite, seed=7))
    root.write_json("versions.json", {"data_fingerprint": "not-the-current-data"})
    for check in (reseeded, cfg):  # a changed setting, then changed data behind the root
        with pytest.raises(ConfigError) as err:
            check_same_config(check, root)
        assert "use another run_name=..." in str(err.value)
        assert "or delete that run root (it holds no predictions) to start over" in str(err.value)
    root.write_table("predictions", "ruler.niah_single_1.L1024.s42.00000.p0", pa.table({"instance_id": ["a"]}))
    with pytest.raises(ConfigError) as err:
        check_same_config(reseeded, root)
    assert str(err.value) == (f"run root {root.uri} was made with suite.seed=42, not 7; use another run_name=... or "
                              "store.root=... to run with suite.seed=7, or pass suite.seed=42 to go on with that root")
    with pytest.raises(ConfigError) as err:
        check_same_config(cfg, root)
    assert "use another run_name=... to evaluate the new data" in str(err.value) and "delete" not in str(err.value)


FINISHED = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
            "suite.samples=2", "store.cache_instances=false", "cluster.generate_parallelism=1", "run_name=finished"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_path) -> Path:
    """A finished stand-in run (its instances, predictions, scores and summaries): its store.root."""
    from longeval.cli import main

    store = tmp_path_factory.mktemp("finished")
    assert main(["run", *FINISHED, f"store.root={store}"]) == 0
    return store


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "_lease" not in p.parts}


@pytest.mark.ray


@pytest.mark.engine
def test_a_finished_root_with_a_cut_config_is_refused_by_name_and_restored_by_the_advice(finished, tmp_path, capsys):
    """The end to end of issue #46 on a finished root: `run` and `report` name the damaged file and change nothing;
    `report ROOT -o` still reads the root; moving the file aside and rerunning, as the error says, writes the same
    config.yaml again and keeps every instance, prediction and score byte for byte."""
    from longeval.cli import main

    shutil.copytree(finished, tmp_path / "store")
    args = [*FINISHED, f"store.root={tmp_path / 'store'}"]
    folder = tmp_path / "store" / "finished"
    whole = (folder / "config.yaml").read_text()
    (folder / "config.yaml").write_text(whole[:whole.index("reasoning:") + 4])  # cut inside a key
    before = _snapshot(folder)
    capsys.readouterr()
    for command in ("run", "report"):
        assert main([command, *args]) == 2
        text = " ".join(capsys.readouterr().out.split())
        assert f"error: {folder / 'config.yaml'} is damaged: it does not parse as YAML" in text, text
        assert "delete" not in text and "was made with model." not in text
        assert _snapshot(folder) == before  # nothing changed
    assert main(["report", str(folder), "-o", str(tmp_path / "report.html")]) == 0
    (folder / "config.yaml").rename(folder / "config.yaml.damaged")
    assert main(["run", *args]) == 0
    assert (folder / "config.yaml").read_text() == whole.replace(str(finished), str(tmp_path / "store"))  # copied
    after = _snapshot(folder)
    for name, data in before.items():
        if name.startswith(("instances/", "predictions/", "scores/", "_manifest/")) or name == "versions.json":
            assert after[name] == data, name
    assert any(name.startswith("predictions/") for name in before)
