"""One exit-code table (docs/operations.md, "Exit codes") for every command that reads or writes a run root
(issue #46): the commands' `--help` says the same, and `tests/exit_codes.py` checks every code the other tests
get from `longeval.cli.main` (and from `tests.cli_subprocess.longeval`) against it."""

from __future__ import annotations

import re

import pytest

from longeval.cli import main
from longeval.run.consistency import EXIT_CODES
from tests.exit_codes import checked, command_of, documented, documented_exit_codes

COMMANDS = ("run", "generate", "infer", "score", "report", "compare", "check", "cache prune")


def test_the_table_has_a_row_for_every_command_and_only_the_codes_that_exist():
    table = documented_exit_codes()
    assert set(table) == set(COMMANDS)
    assert all(codes <= {0, 2, 3, 130, 143} and {0, 2, 130, 143} <= codes for codes in table.values())
    assert set(EXIT_CODES.values()) <= table["report"] & table["compare"] & table["run"] & table["score"]
    assert 3 not in table["generate"] | table["check"] | table["cache prune"]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_gives_the_codes_of_the_table(command, capsys):
    with pytest.raises(SystemExit):
        main([*command.split()[:1], "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = {int(code) for code in re.findall(r"(?:exit codes:|;) (\d+) ", text[text.index("exit codes:"):])}
    assert said == documented_exit_codes()[command] - {143}, text


def test_a_code_the_table_does_not_give_fails_the_test_that_got_it():
    assert documented("check", 2) == 2
    with pytest.raises(AssertionError, match="does not give it"):
        documented("check", 3)
    with pytest.raises(AssertionError, match="has no row"):
        documented("plan-everything", 0)
    assert command_of(["cache", "prune", "--dry-run"]) == "cache prune" and command_of(["models", "prepare"]) is None


def test_the_tests_main_is_the_checked_one():
    """conftest installs the check before test modules import `main`: an undocumented code fails any test."""
    assert hasattr(main, "unchecked")
    wrapped = checked(lambda argv=None: 3)
    with pytest.raises(AssertionError, match="`longeval check` exited 3"):
        wrapped(["check", "model=tiny_random"])
    assert wrapped(["models", "prepare"]) == 3  # a command the table does not cover is not checked
