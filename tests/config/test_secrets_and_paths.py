"""Run names stay inside the store root; secrets are redacted by value as well as by name, everywhere the project
writes. Through the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_subprocess import flat, longeval


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "a/../../b", "..", "a\\\\b", "sub/dir"])
def test_a_run_name_cannot_leave_the_store_root(tmp_path, name):
    store = tmp_path / "store"
    proc = longeval("plan", "model=tiny_random", f"store.root={store}", f"run_name={name}", timeout=60)
    text = flat(proc)
    assert proc.returncode == 2, text
    assert "would not be a folder inside store.root" in text and "run_name=" in text
    assert "Traceback" not in text
    assert not any(tmp_path.iterdir())


TOKEN = "hf_Zq81secretvalue"
URL_PASSWORD = "pl4nted-url-password"
PLANTED = {
    "model.env, an ordinary name": "pl4nted-env-unknown-name",
    "model.env, a secret name": "pl4nted-openai-key",
    "model.env, a password": "pl4nted-db-pass",
    "model.env HF_TOKEN, and its value under an innocent name": TOKEN,
    "a secret-named process variable": "pl4nted-process-password",
    "a token-named process variable": "env-only-s3cr3t",
    "a URL's password": URL_PASSWORD,
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.CompletedProcess[str], Path, Path]]:
    """One real run (tiny model, one prompt, W&B offline) with a secret planted every way, read by both tests
    below: its output, the folder holding its run root `s` and W&B's folder, and Ray's temp dir."""
    folder = tmp_path_factory.mktemp("planted")
    scratch = Path(tempfile.mkdtemp(prefix="le-sec-", dir="/tmp"))  # short: Ray's socket paths must fit
    try:
        proc = longeval(
            "run", "model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=1",
            f"store.root={folder}", "run_name=s", "tracking=wandb", f"tracking.dir={folder / 'wandb'}",
            f"+model.env.MY_DB_HOST_X={PLANTED['model.env, an ordinary name']}",
            f"+model.env.OPENAI_KEY={PLANTED['model.env, a secret name']}",
            f"+model.env.DB_PASS={PLANTED['model.env, a password']}", "+model.env.SHORT_ONE=ab",
            f"+model.env.HF_TOKEN={TOKEN}",  # secret by name
            f"+model.env.MY_DOWNLOAD_VAR={TOKEN}",  # the same value under an innocent name
            f"model.api.base_url=https://alice:{URL_PASSWORD}@example.invalid/v1",
            f"tracking.tags=[tag-{URL_PASSWORD},tag-{PLANTED['model.env, a secret name']}]",
            env={"TMPDIR": str(scratch), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                 "MY_SERVICE_PASSWORD": PLANTED["a secret-named process variable"],
                 "MY_ACCESS_TOKEN": PLANTED["a token-named process variable"]})
        yield proc, folder, scratch / "ray"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.engine
@pytest.mark.ray
def test_secrets_are_redacted_by_value_and_in_urls(planted):
    proc, folder, _ = planted
    assert proc.returncode == 0, flat(proc)[-3000:]
    written = "\n".join(p.read_text(errors="replace") for p in (folder / "s").rglob("*")
                        if p.is_file() and p.suffix in (".yaml", ".json"))
    assert "config.yaml" in {p.name for p in (folder / "s").iterdir()}
    for secret in (TOKEN, URL_PASSWORD, "alice:"):
        assert secret not in written
    assert "https://***@example.invalid/v1" in written
    assert "MY_DOWNLOAD_VAR: '***'" in written.replace('"', "'")


@pytest.mark.engine
@pytest.mark.ray
def test_no_planted_secret_reaches_any_file_a_run_writes(planted):
    """No file under the run root, the W&B folder (binary .wandb included) or Ray's session logs holds any planted
    secret, nor does the run's output, and the engine still got its env."""
    proc, folder, ray_tmp = planted
    assert proc.returncode == 0, flat(proc)[-3000:]
    sessions = list(ray_tmp.glob("session_2*"))
    assert sessions, "the run's Ray left no session folder"
    files = [p for top in (folder / "s", folder / "wandb", *sessions) for p in top.rglob("*")
             if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "debug.log" for p in files)
    assert any(p.parent.name == "engines" for p in files) and any(p.name == "config.yaml" for p in files)
    leaks = {(name, str(p)) for p in files for name, value in PLANTED.items() if value.encode() in p.read_bytes()}
    leaks |= {(name, "output") for name, value in PLANTED.items() if value in proc.stdout + proc.stderr}
    assert not leaks
    [record] = [json.loads(p.read_text()) for p in (folder / "s" / "engines").glob("*.json")]
    # the engine's process had every variable (an unset one would read null), and its record shows none
    assert record["env"] == {"MY_DB_HOST_X": "***", "OPENAI_KEY": "***", "DB_PASS": "***", "SHORT_ONE": "***",
                             "HF_TOKEN": "***", "MY_DOWNLOAD_VAR": "***",
                             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    saved = (folder / "s" / "config.yaml").read_text()
    assert "SHORT_ONE: '***'" in saved and "https://***@example.invalid/v1" in saved
