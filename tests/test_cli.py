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
    """Disk, host memory, generation CPU, GPU time and wall time, each with its arithmetic (longeval.sizing)."""
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
    # 2,158,271 tokens of KV cache per replica (tests/test_plan.py works it out): 2 full-length sequences.
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
    from longeval.store import RunRoot

    for name in names:
        RunRoot(uri).write_table("instances", name, pa.table({"instance_id": [name], "prompt": ["x" * 500]}))


def test_cache_prune_takes_the_cache_from_the_overrides(capsys, tmp_path):
    from longeval.instance_cache import InstanceCache

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

    from longeval.cli import _print_results
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
    _print_results(result)
    out = " ".join(capsys.readouterr().out.split())
    assert line in out and f"{PYDOC!r}, not RULER's Paul Graham essays" in out
    assert "not comparable with RULER's published table" in out
    assert out.index("not RULER's haystack") < out.index("results: ")
    _print_results(RunResult(root=str(root), tables=load_run(str(root)).tables))  # no essay task: nothing to say
    assert "not RULER's haystack" not in capsys.readouterr().out

    (root / "versions.json").write_text(json.dumps({"essay_corpus": {"name": PAUL_GRAHAM}}), encoding="utf-8")
    _print_results(result)
    assert "not RULER's haystack" not in capsys.readouterr().out
    (root / "versions.json").unlink()  # a run from before versions.json named the corpus
    _print_results(result)
    assert "not RULER's haystack" not in capsys.readouterr().out
