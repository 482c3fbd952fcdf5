"""Run the `longeval` command line in a subprocess, the way a user meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.exit_codes import command_of, documented

REPO = Path(__file__).resolve().parents[1]


def longeval(*argv: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m longeval.cli ARGV`, its stdout and stderr as text; the run root and caches as the tests' own."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "longeval.cli", *argv], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)
    command = command_of(list(argv))
    if command is not None:  # the exit code as docs/operations.md's table gives it for the command
        documented(command, proc.returncode)
    return proc


def flat(proc: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr with whitespace collapsed, for substring checks across wrapped lines."""
    return " ".join((proc.stdout + proc.stderr).split())
