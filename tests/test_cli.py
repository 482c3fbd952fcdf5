"""The command line: plan without running, and bad input that fails at once with a message naming the fix."""

from __future__ import annotations

import pytest

from longeval.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_plan_prints_shards_and_pools_without_running(capsys, tmp_path, smollm2_path):
    code, text = _run(capsys, "plan", "suite=ruler", "suite.tasks=[niah_single_1,vt]",
                      "suite.lengths=[4096,131072]", f"store.root={tmp_path}")
    assert code == 0
    assert "2000 instances in 80 shards" in text
    assert "max_model_len 8192" in text
    assert "[131072] exceed" in text
    assert not any(tmp_path.iterdir())  # nothing written


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
