"""The command line: plan without running, and bad input that fails at once with a message naming the fix."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from longeval.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_plan_prints_shards_and_pools_without_running(capsys, tmp_path, smollm2_path):
    code, text = _run(capsys, "plan", "suite=ruler", "suite.tasks=[niah_single_1,vt]",
                      "suite.lengths=[4096,131072]", "suite.allow_too_long=true", f"store.root={tmp_path}")
    assert code == 0
    assert "2000 instances in 80 shards" in text
    assert "max_model_len 8192" in text
    assert "[131072] exceed" in text
    # SmolLM2 in float32: 30 x 3 x 64 x 2 x 4 B = 46,080 B/token; VLLM_CPU_KVCACHE_SPACE=2 GiB = 364 blocks of 128.
    # The planned sequences are 4,096 (half) and 131,072 (never sent): 46,592 // 4,096 = 11.
    assert "KV cache 46,592 tokens per replica, max_num_seqs 11 (sized from the suite lengths" in text
    assert not any(tmp_path.iterdir())  # nothing written


def test_check_loads_the_overrides_and_runs_nothing(capsys, tmp_path):
    """What a batch script asks before it starts Ray (cluster/slurm/longeval.sbatch)."""
    code, text = _run(capsys, "check", "model=tiny_random", "suite.tasks=[niah_single_1,vt]",
                      f"store.root={tmp_path}", "run_name=checked")
    assert code == 0, text
    assert "config ok: model tiny-random, 2 tasks" in text and str(tmp_path / "checked") in text
    code, text = _run(capsys, "check", "model=tiny_random", "suite.tasks=[niah_single_9]", f"store.root={tmp_path}")
    assert code == 2 and "error: unknown task 'niah_single_9'" in text
    assert not any(tmp_path.iterdir())  # nothing written either way


YARN_WITHOUT_BASE = ("+model.engine_kwargs.hf_overrides={rope_scaling: {rope_type: yarn, factor: 4.0, "
                     "original_max_position_embeddings: 32768}, max_position_embeddings: 131072}")


@pytest.mark.parametrize(("argv", "expected"), [
    (["model=tiny_random", "suite.lengths=[2000000]"],
     "error: suite.lengths has 2,000,000 tokens but tiny-random's model.max_model_len is 8,192"),
    (["model=tiny_random", f"run_name={'r' * 300}"],
     r"error: run_name is 300 characters; the filesystem allows \d+ bytes per name \(store.root .*\); "
     "shorten run_name"),
    (["model=llama31_8b", YARN_WITHOUT_BASE],
     "error: with model.engine_kwargs.hf_overrides=.* put rope_theta: 500000 inside "
     "model.engine_kwargs.hf_overrides.rope_scaling"),
], ids=["length", "run_name", "rope"])
def test_check_plan_and_run_refuse_the_same_config_alike(capsys, tmp_path, argv, expected):
    """`check` runs every check `run` makes of the config alone (issue #46: it said `config ok` for all three),
    with `plan`'s and `run`'s message, and writes nothing."""
    texts = []
    for command in ("check", "plan", "run"):
        code, text = _run(capsys, command, *argv, f"store.root={tmp_path}")
        assert code == 2 and re.search(expected, text), (command, text)
        texts.append(text[text.index("error:"):])
    assert texts[0] == texts[1] == texts[2]
    assert "Errno" not in texts[0] and "Traceback" not in texts[0]
    assert not any(tmp_path.iterdir())


def test_plan_estimates_gpu_hours_and_they_grow_with_length(capsys, tmp_path):
    hours = []
    for lengths in ("[4096]", "[131072]"):
        code, text = _run(capsys, "plan", "model=llama31_8b", "cluster.gpu=a100_80gb", "cluster.num_gpus=8",
                          "suite=ruler", "suite.tasks=[vt]", f"suite.lengths={lengths}", f"store.root={tmp_path}")
        assert code == 0, text
        found = re.search(r"estimated GPU time on a100_80gb: ([\d,.]+) GPU-hours", text)
        assert found, text
        hours.append(float(found.group(1).replace(",", "")))
    assert hours[0] > 0 and hours[1] > 32 * hours[0]  # one 128K prompt costs more than 32 of 4K


def test_plan_prints_the_sizing_block_for_the_quick_suite(capsys, tmp_path, smollm2_path):
    """Disk, host memory, generation CPU, GPU time and wall time, each with its arithmetic
    (longeval.planning.sizing)."""
    code, text = _run(capsys, "plan", f"store.root={tmp_path}")
    assert code == 0
    assert "sizing: 66 instances, 157,696 tokens, 33 shards, cluster local" in text  # quick: 11 tasks x 3 lengths x 2
    for figure in ("disk: instances", "disk: predictions", "disk: scores", "disk: instance cache", "disk: total",
                   "memory: driver", "memory: replica, pool0 (<= 4,096 tokens)", "memory: generation actor",
                   "memory: head node, at most", "generation", "GPU: total on a100_80gb", "wall time"):
        assert f"│ {figure}" in text, figure
    assert "11 prompts in flight (max_num_seqs 11) x 4,096 tokens" in text  # the window of the plan above
    assert "GPU figures as if on 8 x a100_80gb (cluster.gpu is unset" in text
    assert "measured: benchmarks/sizing_figures.py on" in text
    assert not any(tmp_path.iterdir())


def test_plan_says_which_figures_it_cannot_size_without_the_architecture(capsys, tmp_path):
    code, text = _run(capsys, "plan", "model=tiny_random", "model.path=/nowhere/model", f"store.root={tmp_path}")
    assert code == 0
    assert "cannot size: GPU-hours, wall time and replica memory: the architecture of 'tiny-random' is unknown" in text
    assert "│ disk: instances" in text and "│ memory: replica, pool0 (<= 4,096 tokens) │ unknown" in text
    assert "GPU: total" not in text and "estimated GPU time" not in text


def test_plan_refuses_a_length_beyond_max_model_len(capsys, tmp_path):
    code, text = _run(capsys, "plan", "suite=ruler", "suite.tasks=[vt]", "suite.lengths=[4096,131072]",
                      f"store.root={tmp_path}")
    assert code == 2
    assert "suite.lengths has 131,072 tokens but smollm2-135m-instruct's model.max_model_len is 8,192" in text
    assert "suite.allow_too_long=true" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["suite.tasks=[niah_single_9]"],
         "unknown task 'niah_single_9'; known tasks: longbench_v2/longbench_v2, michelangelo/idk"),
        (["suite=nope"], "unknown suite 'nope'; choices: longbench_v2, michelangelo"),
        (["suite.lenghts=[4096]"], "suite.lenghts"),
        (["suite.samples=many"], "suite.samples"),
        (["suite.lengths=[100]"], "must be at least 256"),
        (["suite.tasks=[qa_1]"], "needs suite.data.squad_path"),
        (["suite.tasks=[qa_1]", "suite.data.squad_path=/nowhere/dev-v2.0.json"],
         "'/nowhere/dev-v2.0.json': file not found. Expected SQuAD v2.0 JSON"),
        (["suite.tasks=[vt]", "suite.lengths=[300]"], "use a larger suite.lengths value"),
        (["model.path=/nowhere/model"], "model folder '/nowhere/model' does not exist"),
    ],
)
def test_bad_input_fails_with_a_clear_message(capsys, tmp_path, smollm2_path, argv, expected):
    code, text = _run(capsys, "run", f"store.root={tmp_path}", *argv)
    assert code == 2
    assert "error:" in text
    assert expected in text
    assert "Traceback" not in text


def test_missing_qa_file_names_the_config_key(capsys, tmp_path, smollm2_path):
    code, text = _run(capsys, "generate", f"store.root={tmp_path}", "suite.tasks=[qa_2]",
                      f"suite.data.hotpotqa_path={tmp_path / 'hotpot.json'}")
    assert code == 2
    assert "suite.data.hotpotqa_path" in text and "HotpotQA JSON" in text


def test_plan_sizes_gpu_pools_for_1m_tokens(capsys, tmp_path):
    """The preset's architecture block is enough: /models/Llama-3.1-Nemotron-8B-UltraLong-1M-Instruct is not here."""
    code, text = _run(capsys, "plan", "model=ultralong8b_1m", "suite=michelangelo_1m", "cluster=h100_80gb",
                      f"store.root={tmp_path}")
    assert code == 0
    assert "pool2 on NVIDIA H100 80GB (gpu_memory_utilization 0.9)" in text
    pool2 = text[text.index("pool2 on"):]
    # 32 layers x 8 KV heads x 128 x 2 x 2 B = 131,072 B; x 1,048,576 tokens = 128 GiB; TP 4 on 8 GPUs: 2 replicas;
    # 2,158,271 tokens of KV cache per replica (tests/planning/test_plan.py works it out): 2 full-length sequences.
    for row in ("│ tensor_parallel_size │ 4 │", "│ replicas │ 2 (8 of 8 GPUs) │", "│ max_model_len │ 1,048,576 │",
                "│ max_num_seqs │ 2 (sized from the suite lengths;",
                "│ max_num_batched_tokens │ 16,384 │", "│ KV cache per token │ 131,072 B (128.0 KiB) │",
                "│ KV cache per sequence │ 128.0 GiB │", "(2,158,271 tokens) │",
                "│ full-length sequences that fit │ 2 │"):
        assert row in pool2, row
    assert "exceed" not in text and "warning" not in text
    assert not any(tmp_path.iterdir())


def test_plan_warns_when_a_pool_does_not_fit(capsys, tmp_path):
    code, text = _run(capsys, "plan", "model=ultralong8b_1m", "suite=michelangelo_1m", "cluster=a100_40gb",
                      "cluster.num_gpus=4", f"store.root={tmp_path}")
    assert code == 0
    assert "warning: does not fit: one sequence of 1,048,576 tokens needs 128.0 GiB of KV cache" in text


def test_plan_without_a_gpu_prints_kv_bytes_per_token(capsys, tmp_path):
    code, text = _run(capsys, "plan", "model=llama31_8b", "suite=ruler", "suite.tasks=[vt]", f"store.root={tmp_path}")
    assert code == 0
    assert "KV cache 131,072 bytes/token (128.0 KiB), 16.0 GiB per sequence of 131,072 tokens" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["cluster=h100_80gb", "cluster.gpu=v100"], "unknown GPU 'v100' in cluster.gpu; known: a100_40gb"),
        (["cluster=h100_80gb", "model.path=/nowhere/model"], "set model.architecture.num_hidden_layers"),
    ],
)
def test_plan_gpu_errors_say_what_to_do(capsys, tmp_path, argv, expected):
    code, text = _run(capsys, "plan", f"store.root={tmp_path}", *argv)
    assert code == 2
    assert expected in text


def test_plan_without_data_files_warns_and_still_plans(capsys):
    assert main(["plan", "model=llama31_8b", "suite=ruler", "cluster=a40_48gb"]) == 0
    out = capsys.readouterr().out
    assert "before running:" in out and "suite.data.squad_path" in out
    assert "tensor_parallel_size" in out


def _cache_entries(uri: str, names: list[str]) -> None:
    """Committed entries in an instance cache, as a generation actor leaves them."""
    from longeval.store.run_root import RunRoot

    for name in names:
        RunRoot(uri).write_table("instances", name, pa.table({"instance_id": [name], "prompt": ["x" * 500]}))


def test_cache_prune_takes_the_cache_from_the_overrides(capsys, tmp_path):
    from longeval.stages.instance_cache import InstanceCache

    _cache_entries(str(tmp_path / "_cache"), ["k0", "k1"])
    code, text = _run(capsys, "cache", "prune", "--max-size", "0", "--dry-run", f"store.root={tmp_path}")
    assert code == 0, text
    assert "would remove k0: " in text and "would remove k1: " in text
    assert f"cache {tmp_path}/_cache: would remove 2 entries (" in text and "kept 0 (0 B)" in text
    assert len(InstanceCache(str(tmp_path / "_cache")).entries()) == 2  # a dry run removes nothing
    # overrides before or after the options; the summary names what went
    code, text = _run(capsys, "cache", "prune", f"store.root={tmp_path}", "--older-than", "0s")
    assert code == 0, text
    assert f"cache {tmp_path}/_cache: removed 2 entries (" in text and "would" not in text
    assert InstanceCache(str(tmp_path / "_cache")).entries() == []
    elsewhere = tmp_path / "shared"
    _cache_entries(str(elsewhere), ["k2"])
    code, text = _run(capsys, "cache", "prune", "--max-size", "10GB", f"store.instance_cache={elsewhere}")
    assert code == 0 and f"cache {elsewhere}: removed 0 entries (0 B), kept 1 (" in text


@pytest.mark.parametrize("key", ["store.root", "store.instance_cache"])
def test_cache_prune_on_a_folder_that_does_not_exist_says_so(capsys, tmp_path, key):
    """A mistyped root used to exit 0 with `removed 0 entries`; an existing root without a cache yet still does."""
    missing = tmp_path / "runz"
    code, text = _run(capsys, "cache", "prune", "--older-than", "30d", f"{key}={missing}")
    assert code == 2, text
    assert text.startswith(f"error: {key}={missing}: no such folder") and text.count("error:") == 1, text
    assert "there is no instance cache to prune; check the path" in text and "removed" not in text
    assert not missing.exists()
    code, text = _run(capsys, "cache", "prune", "--older-than", "30d", f"store.root={tmp_path}")
    assert code == 0 and f"cache {tmp_path}/_cache: removed 0 entries" in text, text


@pytest.mark.parametrize("argv", [["--older-than", "-5d"], ["--older-than=-5d"], ["--max-size", "-5GB"],
                                  ["--max-size", "-1"]])
def test_cache_prune_refuses_a_negative_age_or_size_saying_why(capsys, tmp_path, argv):
    """`--older-than -5d` got argparse's "expected one argument"; now every spelling reaches the option's check."""
    code, text = _run(capsys, "cache", "prune", *argv, f"store.root={tmp_path}")
    option, value = argv[0].split("=")[0], argv[-1].split("=")[-1]
    assert code == 2, text
    assert text.startswith(f"error: {option} '{value}' is negative: ") and text.count("error:") == 1, text
    assert ("give a positive age, e.g. --older-than 5d" if option == "--older-than" else
            "give a size of 0 or more, e.g. --max-size 50GB") in text
    assert "expected one argument" not in text


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "longeval cache prune needs --older-than AGE (e.g. 30d), --max-size SIZE (e.g. 50GB), or both"),
    (["--older-than", "30"], "--older-than '30' is not an age; give a number and a unit (s, m, h, d, w)"),
    (["--max-size", "lots"], "--max-size 'lots' is not a size; give a number and a unit (B, KB, MB, GB, TB"),
    (["--max-size", "1GB", "store.rot=x"], "store.rot"),
])
def test_cache_prune_bad_arguments_get_one_line(capsys, tmp_path, argv, expected):
    code, text = _run(capsys, "cache", "prune", *argv, f"store.root={tmp_path}")
    assert code == 2
    assert expected in text and "Traceback" not in text
    assert text.startswith("error:") and text.count("error:") == 1


@pytest.mark.parametrize(("command", "handler", "kept"), [
    ("plan", "cmd_plan", False),
    ("report", "cmd_report", False),
    ("generate", "cmd_run", True),
])
def test_ctrl_c_promises_kept_work_only_for_commands_that_write_a_run(capsys, monkeypatch, command, handler, kept):
    """Mock: the command's handler is interrupted at once (a Ctrl-C)."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"longeval.cli.{handler}", interrupted)
    code, text = _run(capsys, command, "suite.samples=2")
    assert code == 130
    assert ("finished shards and predictions are kept" in text) is kept
    assert text.startswith("interrupted")


def test_the_results_table_says_when_the_essay_haystack_is_not_rulers(capsys, tmp_path) -> None:
    """`longeval run` prints under its table what the HTML report and README say: essay-haystack scores on a
    corpus other than Paul Graham's essays are not comparable with RULER's published table."""
    import json

    import pyarrow.compute as pc

    from longeval.cli import print_results
    from longeval.report.runs import load_run
    from longeval.stages.summarise import RunResult
    from longeval.text.corpus import PAUL_GRAHAM, PYDOC
    from tests.report.report_helpers import build_run

    root = tmp_path / "run"
    build_run(root, "model-a")
    tables = dict(load_run(str(root)).tables)
    tasks = tables["tasks"]
    essay = pc.if_else(pc.equal(tasks["task"], "niah_single_1"), "niah_single_2", tasks["task"])
    tables["tasks"] = tasks.set_column(tasks.schema.get_field_index("task"), "task", essay)
    result = RunResult(root=str(root), tables=tables)
    line = "not RULER's haystack: ruler/niah_single_2 ran on the essay haystack"

    (root / "versions.json").write_text(json.dumps({"essay_corpus": {"name": PYDOC}}), encoding="utf-8")
    print_results(result)
    out = " ".join(capsys.readouterr().out.split())
    assert line in out and f"{PYDOC!r}, not RULER's Paul Graham essays" in out
    assert "not comparable with RULER's published table" in out
    assert out.index("not RULER's haystack") < out.index("results: ")
    print_results(RunResult(root=str(root), tables=load_run(str(root)).tables))  # no essay task: nothing to say
    assert "not RULER's haystack" not in capsys.readouterr().out

    (root / "versions.json").write_text(json.dumps({"essay_corpus": {"name": PAUL_GRAHAM}}), encoding="utf-8")
    print_results(result)
    assert "not RULER's haystack" not in capsys.readouterr().out
    (root / "versions.json").unlink()  # a run from before versions.json named the corpus
    print_results(result)
    assert "not RULER's haystack" not in capsys.readouterr().out


# -- `score` and `infer` alone say what they left partial (issue #46) --------------------------------------------

STAND_IN = ["model=tiny_random", "model.engine=stand_in", "suite.tasks=[niah_single_1]", "suite.lengths=[1024]",
            "suite.samples=2", "store.cache_instances=false"]
UNREACHABLE_API = ["model.engine=openai", "model.api.mode=completions", "model.api.base_url=http://127.0.0.1:9/v1",
                   "model.api.max_retries=0"]
"""A real OpenAI client sent to a port nothing listens on (discard, 9): every request is refused, an engine error."""


@pytest.fixture(scope="module")
def generated(tmp_path_factory, tiny_model_path):
    """A run root with its 2 instances only (`longeval generate`)."""
    from longeval.config import load_config
    from longeval.run.pipeline import run

    base = tmp_path_factory.mktemp("generated")
    run(load_config([*STAND_IN, f"store.root={base}", "run_name=g"]), stages=("generate",))
    return base / "g"


@pytest.fixture
def unscored(generated, tmp_path):
    """A fresh copy of the generated root, and the overrides that name it."""
    import shutil

    shutil.copytree(generated, tmp_path / "g")
    return tmp_path / "g", [*STAND_IN, f"store.root={tmp_path}", "run_name=g"]


@pytest.mark.ray
def test_score_on_a_partial_root_says_what_is_missing_and_exits_3(capsys, unscored):
    """1 of 2 instances predicted: `score` scores it, then says the run is partial (was: `done:` and exit 0)."""
    from longeval.records import INSTANCE_SCHEMA, PREDICTION_SCHEMA, Prediction
    from longeval.run.consistency import PARTIAL_EXIT
    from longeval.store.run_root import RunRoot

    path, overrides = unscored
    root = RunRoot(str(path))
    first = root.read_stage("instances", INSTANCE_SCHEMA, columns=["instance_id", "references"]).to_pylist()[0]
    root.write_part("predictions", pa.Table.from_pylist([Prediction(
        instance_id=first["instance_id"], model_id="tiny-random", output=" ".join(first["references"]),
        output_tokens=2, finish_reason="stop", cached_prompt_tokens=0, latency_s=0.1).to_row()],
        schema=PREDICTION_SCHEMA))
    code, text = _run(capsys, "score", *overrides)
    partial = (f"warning: partial run {root.uri}: 1 of 2 instances are not predicted (0 engine errors, 1 not run "
               "yet); the numbers cover 1 of 2 instances. Rerun the same command to finish")
    assert code == PARTIAL_EXIT and text.count("warning: partial run") == 1 and partial in text, text
    assert text.index(f"done: {root.uri}") < text.index(partial)
    assert root.has("scores", "scores")  # the score it could make is kept


def test_score_infer_and_report_on_a_root_without_instances_are_one_error_line(capsys, tmp_path):
    """A run root that holds no instances (a mistyped run_name, or never generated): was `done:` and exit 0 for
    `score` and `infer`, and a report of nothing (exit 3) for `report` with overrides; now one error naming the
    fix, exit 2, and nothing written."""
    from longeval.config import load_config
    from longeval.store.run_root import RunRoot

    overrides = [*STAND_IN, f"store.root={tmp_path}", "run_name=typo"]
    uri = RunRoot(load_config(overrides).run_root).uri
    for command in ("score", "infer", "report"):
        code, text = _run(capsys, command, *overrides)
        assert code == 2 and text.endswith(
            f"error: run root {uri} holds no instances: nothing to {command}; check that the overrides name the run "
            "you meant (store.root, run_name, model, suite), or generate it first: `longeval run` with these "
            "overrides"), (command, text)
        assert not (tmp_path / "typo").exists()


@pytest.mark.ray


@pytest.mark.engine
def test_infer_exits_3_while_instances_are_left_without_a_final_prediction(capsys, unscored, monkeypatch):
    """Every request refused: the instances are engine errors after `infer`, which said `done:` and exit 0; now it
    says they are left (exit 3). A rerun that predicts them all exits 0: scoring them is `score`'s work."""
    from longeval.run.consistency import PARTIAL_EXIT
    from longeval.store.run_root import RunRoot

    path, overrides = unscored
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    code, text = _run(capsys, "infer", *overrides, *UNREACHABLE_API)
    partial = (f"warning: partial run {RunRoot(str(path)).uri}: 2 of 2 instances are not predicted (2 engine errors, "
               "0 not run yet)")
    assert code == PARTIAL_EXIT and text.count("warning: partial run") == 1 and partial in text, text
    code, text = _run(capsys, "infer", *overrides)  # the stand-in engine answers every one
    assert code == 0 and "partial run" not in text and f"done: {RunRoot(str(path)).uri}" in text, text
    with pytest.raises(SystemExit):
        main(["infer", "--help"])
    assert "3 some are left without one, e.g. engine errors" in " ".join(capsys.readouterr().out.split())
