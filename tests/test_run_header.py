"""The run header names the suite as run: a suite whose tasks the command line replaced says so (issue #26)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from longeval import cli
from longeval.run import pipeline


@pytest.fixture
def header(monkeypatch, tmp_path, capsys):
    """The header `longeval generate` prints, the pipeline replaced by a stand-in that runs nothing."""
    monkeypatch.setattr(pipeline, "run", lambda cfg, **_: SimpleNamespace(root=cfg.run_root, consistency=None))

    def printed(*overrides: str) -> str:
        cli.cmd_run(["suite=quick", f"store.root={tmp_path}", *overrides], ("generate",))
        return capsys.readouterr().out.splitlines()[0]

    return printed


def test_the_header_says_when_the_suites_tasks_are_overridden(header):
    assert "suite quick (" in header() and "overridden" not in header()
    assert "suite quick (tasks overridden: vt, cwe) (2 tasks x" in header("suite.tasks=[vt,cwe]")
    assert "suite quick (tasks overridden) (5 tasks x" in header("suite.tasks=[vt,cwe,fwe,qa_1,niah_single_1]")
