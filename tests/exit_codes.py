"""The exit-code table of docs/operations.md ("Exit codes"), read once: the tests that drive a command check the
code it returned against it, so the table and the behaviour cannot drift apart (issue #46)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
COLUMNS = ((0,), (3,), (2,), (130, 143))
"""The table's code columns, in order."""


@functools.cache
def documented_exit_codes() -> dict[str, frozenset[int]]:
    """Command (`run`, `cache prune`, ...) -> the exit codes the table gives it."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Exit codes"):]
    section = section[:section.index("\n## ", 3)]
    table: dict[str, frozenset[int]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z ]+)`", cells[0]) if len(cells) == 1 + len(COLUMNS) else None
        if match:
            table[match.group(1)] = frozenset(code for cell, codes in zip(cells[1:], COLUMNS, strict=True)
                                              if cell != "—" for code in codes)
    return table


def documented(command: str, code: int) -> int:
    """`code`, after checking the table lists it for `command`: `assert documented("score", code) == 3`."""
    codes = documented_exit_codes()
    assert command in codes, f"docs/operations.md's exit-code table has no row for `{command}`"
    assert code in codes[command], (f"`longeval {command}` exited {code}, which docs/operations.md's exit-code table "
                                    f"does not give it (it gives {sorted(codes[command])})")
    return code


def command_of(argv: list[str]) -> str | None:
    """The table's row for a command line (`cache prune`, `run`, ...), None for a command it does not cover."""
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return None
    name = "cache prune" if words[:2] == ["cache", "prune"] else words[0]
    return name if name in documented_exit_codes() else None


def checked(main):
    """`longeval.cli.main` whose every exit code is checked against the table (tests/conftest.py installs it, so
    each in-process call of a test is checked, whatever it asserts itself)."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None) -> int:
        code = main(argv)
        import sys

        command = command_of(list(sys.argv[1:] if argv is None else argv))
        if command is not None:
            documented(command, code)
        return code

    wrapper.unchecked = main  # type: ignore[attr-defined]
    return wrapper
