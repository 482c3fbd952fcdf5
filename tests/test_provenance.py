"""A run root keeps one configuration: the settings that identify it are listed once (`RUN_SETTINGS`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from longeval.config import load_config, to_yaml
from longeval.errors import ConfigError
from longeval.provenance import COMPARED_SETTINGS, RUN_SETTINGS, _check_same_config, run_identity
from longeval.store import RunRoot


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
    _check_same_config(cfg, root)
    _check_same_config(replace(cfg, suite=replace(cfg.suite, samples=5)), root)


@pytest.mark.parametrize(("key", "change"), [
    ("suite.seed", lambda c: replace(c, suite=replace(c.suite, seed=c.suite.seed + 1))),
    ("model.path", lambda c: replace(c, model=replace(c.model, path="/elsewhere"))),
    ("model.system_prompt", lambda c: replace(c, model=replace(c.model, system_prompt="Be brief."))),
])
def test_a_changed_identifying_setting_is_refused_by_name(made, key, change):
    cfg, root = made
    with pytest.raises(ConfigError, match=rf"was made with {key}=.*; use another run_name"):
        _check_same_config(change(cfg), root)


def test_changed_data_behind_the_root_is_refused(made):
    cfg, root = made
    root.write_json("versions.json", {"data_fingerprint": "not-the-current-data"})
    with pytest.raises(ConfigError, match="data files behind run root"):
        _check_same_config(cfg, root)


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
        _check_same_config(load_config(args), root)
    _check_same_config(load_config([*args, "suite.shard_size=10", "suite.shuffle=true"]), root)
    # a shuffled cell's order depends on its count: more (or fewer) samples would reshuffle finished shards
    with pytest.raises(ConfigError, match=r"suite\.samples=20.*suite\.samples=30"):
        _check_same_config(load_config([*args[:-1], "suite.samples=30", "suite.adaptive=true"]), root)
