"""Run names stay inside the store root; secrets are redacted by value as well as by name, everywhere the project
writes. Through the command line."""

from __future__ import annotations

import json
import shutil
import tempfile
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


@pytest.mark.ray
def test_secrets_are_redacted_by_value_and_in_urls(tmp_path):
    token = "hf_Zq81secretvalue"
    password = "pa55w0rd-in-url"
    args = ["generate", "model=tiny_random", "suite.tasks=[vt]", "suite.lengths=[1024]", "suite.samples=1",
            f"store.root={tmp_path}", "run_name=s",
            f"+model.env.HF_TOKEN={token}",  # secret by name
            f"+model.env.MY_DOWNLOAD_VAR={token}",  # the same value under an innocent name
            f"model.api.base_url=https://alice:{password}@example.invalid/v1"]
    proc = longeval(*args, env={"MY_ACCESS_TOKEN": "env-only-s3cr3t"})
    assert proc.returncode == 0, flat(proc)
    written = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "s").rglob("*")
                        if p.is_file() and p.suffix in (".yaml", ".json"))
    assert "config.yaml" in {p.name for p in (tmp_path / "s").iterdir()}
    for secret in (token, password, "alice:"):
        assert secret not in written
    assert "https://***@example.invalid/v1" in written
    assert "MY_DOWNLOAD_VAR: '***'" in written.replace('"', "'")


PLANTED = {
    "model.env, an ordinary name": "pl4nted-env-unknown-name",
    "model.env, a secret name": "pl4nted-openai-key",
    "model.env, a password": "pl4nted-db-pass",
    "a secret-named process variable": "pl4nted-process-password",
    "a URL's password": "pl4nted-url-password",
}


@pytest.mark.engine
@pytest.mark.ray
def test_no_planted_secret_reaches_any_file_a_run_writes(tmp_path):
    """A real run (tiny model, W&B offline) with a secret planted every way: no file under the run root, the W&B
    folder (binary .wandb included) or Ray's session logs holds any of them, and the engine still got its env."""
    from tests.run.test_pipeline_faults import TINY

    values = list(PLANTED.values())
    scratch = Path(tempfile.mkdtemp(prefix="le-sec-", dir="/tmp"))  # short: Ray's socket paths must fit
    try:
        wandb_dir = tmp_path / "wandb"
        proc = longeval(
            "run", *TINY, f"store.root={tmp_path}", "run_name=s", "tracking=wandb", f"tracking.dir={wandb_dir}",
            f"+model.env.MY_DB_HOST_X={values[0]}", f"+model.env.OPENAI_KEY={values[1]}",
            f"+model.env.DB_PASS={values[2]}", "+model.env.SHORT_ONE=ab",
            f"model.api.base_url=https://alice:{values[4]}@example.invalid/v1",
            f"tracking.tags=[tag-{values[4]},tag-{values[1]}]",
            env={"TMPDIR": str(scratch), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                 "MY_SERVICE_PASSWORD": values[3]})
        assert proc.returncode == 0, flat(proc)[-3000:]
        sessions = list((scratch / "ray").glob("session_2*"))
        assert sessions, "the run's Ray left no session folder"
        files = [p for folder in (tmp_path / "s", wandb_dir, *sessions) for p in folder.rglob("*") if p.is_file()]
        assert any(p.suffix == ".wandb" for p in files) and any(p.name == "debug.log" for p in files)
        assert any(p.parent.name == "engines" for p in files) and any(p.name == "config.yaml" for p in files)
        leaks = {(name, str(p)) for p in files for name, value in PLANTED.items() if value.encode() in p.read_bytes()}
        leaks |= {(name, "output") for name, value in PLANTED.items() if value in proc.stdout + proc.stderr}
        assert not leaks
        [record] = [json.loads(p.read_text()) for p in (tmp_path / "s" / "engines").glob("*.json")]
        # the engine's process had every variable (an unset one would read null), and its record shows none
        assert record["env"] == {"MY_DB_HOST_X": "***", "OPENAI_KEY": "***", "DB_PASS": "***", "SHORT_ONE": "***",
                                 "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
        saved = (tmp_path / "s" / "config.yaml").read_text()
        assert "SHORT_ONE: '***'" in saved and "https://***@example.invalid/v1" in saved
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
