"""Synthetic run roots shared by the report tests: built once per session (~3 s), copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.report.report_helpers import build_run


@pytest.fixture(scope="session")
def pristine_roots(tmp_path_factory) -> tuple[Path, Path]:
    """model-a with its summaries written by `pipeline.report`, model-b with scores only (no summary/)."""
    base = tmp_path_factory.mktemp("report-runs")
    build_run(base / "model-a-run", "model-a")
    build_run(base / "model-b-run", "model-b", summarise=False)
    return base / "model-a-run", base / "model-b-run"


@pytest.fixture
def run_roots(pristine_roots, tmp_path) -> tuple[Path, Path]:
    """Fresh copies of the two run roots (a report may write model-b's summaries)."""
    copies = []
    for root in pristine_roots:
        shutil.copytree(root, tmp_path / "runs" / root.name)
        copies.append(tmp_path / "runs" / root.name)
    return copies[0], copies[1]
