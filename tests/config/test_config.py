"""Config composition and validation: everything wrong fails before any work, naming the key."""

from __future__ import annotations

import re

import pytest
import yaml
from omegaconf import OmegaConf

from longeval.config import ApiMode, Engine, Redactor, group_choices, load_config, to_yaml, validate
from longeval.config.schema import TrackingBackend, TrackingMode
from longeval.errors import ConfigError, UnknownTaskError
from longeval.tasks import effective_thresholds


def test_defaults_compose_to_the_embedded_quick_run():
    cfg = load_config()
    assert cfg.model.path == "packaged:smollm2"
    assert cfg.suite.name == "quick" and cfg.suite.lengths == [1024, 2048, 4096]
    assert len(cfg.suite.tasks) == 11 and "qa_1" not in cfg.suite.tasks
    assert cfg.run_root.startswith("runs/smollm2-135m-instruct-quick-seed42-")
    assert load_config(["suite.samples=3"]).run_root != cfg.run_root  # a different suite, a different root
    assert load_config(["tracking=none"]).run_root == cfg.run_root


def test_ruler_suite_is_the_papers_configuration():
    cfg = load_config(["suite=ruler"])
    assert len(cfg.suite.tasks) == 13
    assert cfg.suite.lengths == [4096, 8192, 16384, 32768, 65536, 131072]
    assert cfg.suite.samples == 500 and cfg.suite.effective_threshold is None  # each family's own: RULER's 85.6
    assert effective_thresholds(cfg.suite.effective_threshold)["ruler"] == 85.6
    assert set(effective_thresholds(70.0).values()) == {70.0}  # the suite's, when set, for every family


def test_overrides_reach_every_group():
    cfg = load_config(["model=llama31_8b", "suite=ruler", "suite.lengths=[4096,131072]", "run_name=x",
                       "store.root=s3://bucket/runs", "model.answer_prefix=false"])
    assert cfg.model.max_model_len == 131072 and not cfg.model.answer_prefix
    assert cfg.suite.lengths == [4096, 131072]
    assert cfg.run_root == "s3://bucket/runs/x"


@pytest.mark.parametrize("group", ["model", "suite", "cluster", "store", "tracking"])
def test_every_group_has_choices(group):
    assert group_choices(group)


def test_gpu_presets_follow_the_models_real_configs():
    for name in ("qwen25_7b_1m", "qwen25_14b_1m"):
        qwen = load_config([f"model={name}"]).model
        # No dual chunk attention on the pinned vLLM: capped where its model card says standard attention holds.
        assert qwen.max_model_len == 262144 and qwen.max_num_seqs is None
        assert "VLLM_ATTENTION_BACKEND" not in qwen.env and "dual_chunk_attention_config" not in qwen.architecture
    ultralong = load_config(["model=ultralong8b_1m"]).model
    assert ultralong.max_model_len == 1048576 and ultralong.architecture["max_position_embeddings"] == 1048576
    assert ultralong.env == {} and ultralong.max_num_seqs is None
    assert load_config(["model=llama33_70b_tp4"]).model.tensor_parallel_size == 4
    assert load_config(["model=llama33_70b_tp8"]).model.tensor_parallel_size == 8


@pytest.mark.parametrize(
    ("overrides", "error", "words"),
    [
        (["suite.tasks=[nope]"], UnknownTaskError, ["unknown task 'nope'", "ruler/niah_single_1"]),
        (["model=gpt5"], ConfigError, ["unknown model 'gpt5'", "smollm2_cpu"]),
        (["suite.sampels=3"], ConfigError, ["unknown config key 'suite.sampels'", "samples"]),
        (["model.max_model_len=big"], ConfigError, ["model.max_model_len"]),
        (["suite.lengths=[]"], ConfigError, ["suite.lengths is empty"]),
        (["suite.shard_size=0"], ConfigError, ["shard_size"]),
        (["model.prompt_format=helmet"], ConfigError, ["model.prompt_format='helmet'", "chat, ruler"]),
        (["model.prompt_format=ruler", "model.ruler_template=llama3"], ConfigError, ["meta-llama3"]),
    ],
)
def test_bad_config_names_the_problem(overrides, error, words):
    with pytest.raises(error) as info:
        load_config(overrides)
    for word in words:
        assert word in str(info.value)


def test_saved_config_hides_credentials():
    cfg = load_config(["+model.env.HF_TOKEN=hf_secret_value", "+model.env.VLLM_LOGGING_LEVEL=INFO"])
    text = to_yaml(cfg)
    assert "hf_secret_value" not in text and "HF_TOKEN: '***'" in text
    assert "VLLM_LOGGING_LEVEL: INFO" in text


def test_task_parameters_are_overridden_by_family_task_and_key():
    from longeval.tasks import get_task

    cfg = load_config(["+suite.params.ruler.num_needle_v=2", "+suite.params.niah_multivalue.max_new_tokens=64",
                       "+suite.params.vt.num_hops=2"])
    multivalue = get_task("niah_multivalue", cfg.suite.params)
    assert multivalue.params.num_needle_v == 2 and multivalue.max_new_tokens == 64
    assert get_task("vt", cfg.suite.params).params.num_hops == 2
    assert get_task("niah_multivalue").params.num_needle_v == 4  # the registry itself is untouched


@pytest.mark.parametrize(("override", "expected"), [
    ("+suite.params.vt.num_hopz=2", "ruler/vt has no parameter 'num_hopz'; its parameters: num_chains"),
    ("+suite.params.sync.cot=false", "suite.params.sync names no family or task of this suite"),
])
def test_bad_task_parameter_names_the_fields(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config([override])


def test_family_parameter_that_no_task_has_is_refused():
    with pytest.raises(ConfigError, match="no ruler task of this suite has 'num_needlez'"):
        load_config(["+suite.params.ruler.num_needlez=2"])


@pytest.mark.parametrize(("override", "expected"), [
    ("suite.params.sync.no_path_share=0.5", "add it with a leading '+': +suite.params.sync.no_path_share=..."),
    ("+suite.params.sync.cot=false", "override it without the leading '+': suite.params.sync.cot=..."),
])
def test_params_overrides_say_when_to_use_plus(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(["suite=sync", override])
    assert expected in str(err.value)


def test_credentials_are_redacted_but_the_tokenizer_path_is_kept():
    shown = Redactor.of(environ={}).tree({"HF_TOKEN": "hf_abc", "api_key": "sk-1", "AWS_SECRET_ACCESS_KEY": "x",
                                          "tokenizer": "/m", "VLLM_CPU_KVCACHE_SPACE": "2"})
    assert shown == {"HF_TOKEN": "***", "api_key": "***", "AWS_SECRET_ACCESS_KEY": "***", "tokenizer": "/m",
                     "VLLM_CPU_KVCACHE_SPACE": "2"}


def test_tracking_wandb_composes_and_bad_values_name_the_choices():
    cfg = load_config(["tracking=wandb", "tracking.project=lc", "tracking.entity=team", "tracking.tags=[a,b]"])
    t = cfg.tracking
    assert (t.backend, t.mode, t.project, t.entity, t.tags, t.table_rows) == ("wandb", "offline", "lc", "team",
                                                                              ["a", "b"], 50)
    assert load_config().tracking.backend == "none"
    with pytest.raises(ConfigError, match="tracking.backend='wandbb'; choices: none, wandb"):
        load_config(["tracking.backend=wandbb"])
    with pytest.raises(ConfigError, match="tracking.mode='cloud'; choices: offline, online, disabled"):
        load_config(["tracking=wandb", "tracking.mode=cloud"])


def test_enum_settings_equal_their_strings_and_are_saved_as_plain_strings():
    cfg = load_config(["model.engine=openai", "model.api.base_url=http://x/v1", "model.api.mode=completions",
                       "tracking=wandb", "tracking.mode=online"])
    assert (cfg.model.engine, cfg.model.api.mode, cfg.tracking.backend, cfg.tracking.mode) == \
        (Engine.openai, ApiMode.completions, TrackingBackend.wandb, TrackingMode.online)
    assert cfg.model.engine == "openai" and cfg.model.api.mode == "completions" and cfg.tracking.mode == "online"
    saved = yaml.safe_load(to_yaml(cfg))  # a safe load refuses python objects: only plain strings pass
    assert (saved["model"]["engine"], saved["model"]["api"]["mode"]) == ("openai", "completions")
    assert (saved["tracking"]["backend"], saved["tracking"]["mode"]) == ("wandb", "online")
    assert "Engine" not in to_yaml(cfg) and "!!" not in to_yaml(cfg)


def test_a_config_yaml_written_before_the_enums_still_loads():
    saved = yaml.safe_load(to_yaml(load_config()))
    saved["model"]["engine"], saved["model"]["api"]["mode"] = "vllm", "chat"  # as plain str fields wrote them
    saved["tracking"]["backend"], saved["tracking"]["mode"] = "none", "offline"
    cfg = validate(OmegaConf.create(saved))
    assert cfg.model.engine is Engine.vllm and cfg.tracking.mode is TrackingMode.offline
    saved["model"]["engine"] = "tgi"
    with pytest.raises(ConfigError, match="model.engine='tgi'; choices: vllm, openai"):
        validate(OmegaConf.create(saved))


@pytest.mark.parametrize(("override", "expected"), [
    ("model.engine=VLLM", "model.engine='VLLM'; choices: vllm, openai"),
    ("model.api.mode=chats", "model.api.mode='chats'; choices: chat, completions"),
])
def test_bad_enum_overrides_name_the_key_and_choices(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config([override])


def test_redaction_reaches_nested_values_and_spares_token_counts():
    shown = Redactor.of(environ={}).tree({"hf_overrides": {"hf_token": "t0k", "rope_scaling": {"factor": 4}},
                    "max_num_batched_tokens": 131072, "headers": [{"x-api-key": "k"}, {"Authorization_token": "b"}],
                    "WANDB_API_KEY": "w", "tokenizer_mode": "auto"})
    assert shown == {"hf_overrides": {"hf_token": "***", "rope_scaling": {"factor": 4}},
                     "max_num_batched_tokens": 131072,
                     "headers": [{"x-api-key": "***"}, {"Authorization_token": "***"}],
                     "WANDB_API_KEY": "***", "tokenizer_mode": "auto"}


def test_ruler_prompt_format_composes_and_is_saved():
    from longeval.text.render import prompt_format

    cfg = load_config(["model.prompt_format=ruler", "model.ruler_template=meta-llama3"])
    assert prompt_format(cfg.model).ruler_template == "meta-llama3"
    assert "prompt_format: ruler" in to_yaml(cfg) and "ruler_template: meta-llama3" in to_yaml(cfg)
    assert prompt_format(load_config([]).model).ruler_template is None  # the model's chat template by default


def test_an_adaptive_run_defaults_to_small_shards_and_an_explicit_size_wins():
    """An adaptive round is one shard per open cell, so its default shard is smaller than a full sweep's."""
    from longeval.config import ADAPTIVE_SHARD_SIZE, SHARD_SIZE

    assert load_config(["suite=ruler"]).suite.shard_size == SHARD_SIZE == 25
    assert load_config(["suite=ruler", "suite.adaptive=true"]).suite.shard_size == ADAPTIVE_SHARD_SIZE == 10
    assert load_config(["suite=ruler", "suite.adaptive=true", "suite.shard_size=25"]).suite.shard_size == 25
    assert load_config(["suite=michelangelo", "suite.adaptive=true"]).suite.shard_size == 10  # the suite's own
    assert "shard_size: 10" in to_yaml(load_config(["suite=ruler", "suite.adaptive=true"]))  # resolved on disk


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_a_longeval_conf_without_a_config_tree_names_the_variable_and_the_path(tmp_path, monkeypatch, capsys, what):
    """Hydra called it `bad override: Primary config directory not found.`, though no override was wrong."""
    from longeval.cli import main

    folder = tmp_path / "my-conf"
    if what == "empty":
        folder.mkdir()
    monkeypatch.setenv("LONGEVAL_CONF", str(folder))
    code = main(["check", "model=tiny_random"])
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert code == 2, text
    assert text.startswith(f"error: LONGEVAL_CONF={folder}: ") and text.count("error:") == 1, text
    assert ("no such folder" if what == "missing" else "a folder without config.yaml") in text
    assert "or unset it for the packaged one" in text and "override" not in text


def _conf_with_suite(tmp_path, monkeypatch, text: str):
    """A copy of conf/ with one more suite file, as a user's own config dir (LONGEVAL_CONF)."""
    import shutil

    from longeval.config import conf_dir

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "suite" / "mine.yaml").write_text(text)
    monkeypatch.setenv("LONGEVAL_CONF", str(conf))
    return conf / "suite" / "mine.yaml"


def test_a_suite_file_with_a_yaml_syntax_error_names_the_file_line_and_problem(tmp_path, monkeypatch):
    path = _conf_with_suite(tmp_path, monkeypatch, "name: mine\ntasks: [niah_single_1\nlengths: [4096]\n")
    with pytest.raises(ConfigError) as info:
        load_config(["suite=mine"])
    message = str(info.value)
    assert message == (f"{path}, line 3, column 8: expected ',' or ']', but got ':' (while parsing a flow sequence "
                       "that starts at line 2, column 8); fix the YAML syntax there")


@pytest.mark.parametrize(("text", "expected"), [
    ("lengths: abc\n", "suite.lengths must be a list of integers, got 'abc'; write lengths: [4096,8192]"),
    ("lengths: [4096, abc]\n", "suite.lengths[1] must be an integer, got 'abc'; write lengths: [4096,8192]"),
    ("lengths: [4096]\nsamples: lots\n", "suite.samples must be an integer, got 'lots'; write samples: 500"),
    ("lengths: [4096]\nsample: 3\n", "unknown config key 'suite.sample'; keys under suite: adaptive,"),
])
def test_a_wrong_key_or_type_in_a_suite_file_names_file_key_type_and_value(tmp_path, monkeypatch, text, expected):
    path = _conf_with_suite(tmp_path, monkeypatch, "name: mine\ntasks: [niah_single_1]\n" + text)
    with pytest.raises(ConfigError) as info:
        load_config(["suite=mine"])
    assert str(info.value).startswith(f"{path}: {expected}")


@pytest.mark.parametrize(("override", "expected"), [
    ("suite.lengths=abc", "suite.lengths must be a list of integers, got 'abc'; write suite.lengths=[4096,8192]"),
    ("suite.lengths=4096", "suite.lengths must be a list of integers, got '4096'; write suite.lengths=[4096]"),
    ("suite.lengths=[4096,abc]", "suite.lengths[1] must be an integer, got 'abc'; write suite.lengths=[4096,8192]"),
    ("suite.tasks=vt", "suite.tasks must be a list of strings, got 'vt'; write suite.tasks=[vt]"),
    ("suite.samples=many", "suite.samples must be an integer, got 'many'; write suite.samples=500"),
    ("suite.allow_too_long=maybe", "suite.allow_too_long must be true or false, got 'maybe'; write "
                                   "suite.allow_too_long=false"),
    ("suite.params=3", "suite.params must be a mapping (key: value), got '3'; write suite.params={vt:{num_hops:2}}"),
    ("suite.data=3", "suite.data must be a group of settings (essay_dir, squad_path, hotpotqa_path, "
                     "longbench_v2_path), got '3'; set its keys one by one, e.g. suite.data.essay_dir=..."),
])
def test_a_wrong_typed_override_names_key_type_value_and_fix(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert str(info.value) == expected


@pytest.mark.parametrize(("overrides", "expected"), [
    (["run_name=été"], "cannot parse the override 'run_name=été': an unquoted value is ASCII letters, digits and "
                       "_-./:+@ without spaces; quote the value for Hydra and the override for the shell: "
                       "'run_name=\"été\"' (a run name itself takes only ASCII letters, digits and . _ = + -, e.g. "
                       "run_name=my-run)"),
    (["run_name=my", "big", "run"], "'big' is not an override (KEY=VALUE); if it belongs to 'run_name=my', quote the "
                                    "whole value for Hydra and the override for the shell: 'run_name=\"my big run\"'"),
    (["suite.data.essay_dir=/d/été"], "quote the value for Hydra and the override for the shell: "
                                      "'suite.data.essay_dir=\"/d/été\"'"),
    (["vt"], "'vt' is not an override: write KEY=VALUE, e.g. suite=ruler or suite.samples=10"),
])
def test_an_override_hydra_cannot_parse_says_the_quoting_rule(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert expected in str(info.value)
    assert "LexerNoViableAltException" not in str(info.value)


def test_the_quoted_override_the_message_suggests_parses():
    import shlex

    cfg = load_config(shlex.split("'suite.data.essay_dir=\"/d/été x\"'"))
    assert cfg.suite.data.essay_dir == "/d/été x"


def test_a_presets_params_for_tasks_not_selected_are_dropped():
    cfg = load_config(["suite=michelangelo_quick", "suite.tasks=[idk]"])
    assert cfg.suite.tasks == ["idk"] and "mrcr" not in cfg.suite.params
    assert load_config(["suite=michelangelo_quick"]).suite.params["mrcr"] == {"grading": "openai"}
    with pytest.raises(ConfigError, match="suite.params.nope names no family or task of this suite"):
        load_config(["suite=michelangelo_quick", "suite.tasks=[idk]", "+suite.params.nope.x=1"])
    with pytest.raises(ConfigError, match="suite.params.mrcr names no family or task of this suite"):
        load_config(["suite=michelangelo_quick", "suite.tasks=[idk]", "suite.params.mrcr.grading=exact"])


@pytest.mark.parametrize(("override", "expected"), [
    ("+suite.foo=1", "unknown config key 'suite.foo'; keys under suite: adaptive,"),
    ("+foo=1", "unknown config key 'foo'; keys under the top level: cluster, model, plugins,"),
    ("~suite.lengths", "~suite.lengths removes a setting the schema requires; give it a value instead, e.g. "
                       "suite.lengths=[4096,8192]"),
    ("suite.lengths=[4096", "cannot parse the override 'suite.lengths=[4096': check its brackets and quotes (a list "
                            "is [a,b], a mapping {k:v})"),
    ("model.env=3", "model.env must be a mapping (key: value), got '3'; write model.env={key:value}"),
])
def test_added_removed_and_malformed_keys_get_one_line(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert str(info.value).startswith(expected)
    assert load_config(["+model.env.X=1"]).model.env["X"] == "1"  # free-form maps still take new keys


def test_the_docs_name_the_folder_make_run_writes():
    """`make run` (no overrides) writes <store.root>/<model>-<suite>-seed<seed>-<suite hash>: the README's and
    docs/tracking.md's paths are that folder, hash included, so a reader finds it (and a changed quick suite, whose
    hash changes, fails here until the docs follow)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    folder = load_config([]).run_root
    assert re.fullmatch(r"runs/smollm2-135m-instruct-quick-seed42-[0-9a-f]{8}", folder), folder
    for doc in ("README.md", "docs/tracking.md"):
        named = set(re.findall(r"runs/smollm2-135m-instruct-quick-seed42[\w-]*", (repo / doc).read_text()))
        assert named == {folder}, f"{doc} names {named}, `make run` writes {folder}"
