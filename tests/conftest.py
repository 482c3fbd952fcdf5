"""Test environment: offline, repo-local caches, and the model folders built once per session.

Environment variables are set at import, before any test module imports transformers or vLLM, because
both read them at import time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ("tests.s3server", "tests.started")  # SeaweedFS fixtures for every module; what each test starts

REPO = Path(__file__).resolve().parents[1]
# The scratch lives under /tmp, not in the checkout: the tests' servers and engines make Unix sockets in it
# (vLLM's ZMQ sockets, SeaweedFS's, munge's), a socket's path must fit in 107 bytes, and a checkout may lie at
# any depth. One parent per user and checkout, so the sessions of two clones stay apart.
_SCRATCH_PARENT = Path("/tmp") / f"longeval-tests-{os.getuid()}-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}"
_OWNER_FILE = ".owner-pid"
_STALE_AFTER_S = 3600


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return pid > 0


def _prune_old_sessions() -> None:
    """Remove scratch folders of finished sessions older than an hour; keep recent ones for debugging."""
    for old in _SCRATCH_PARENT.glob("session-*"):
        try:
            if time.time() - old.stat().st_mtime < _STALE_AFTER_S:
                continue
            owner = old / _OWNER_FILE
            if owner.is_file() and _pid_alive(int(owner.read_text() or 0)):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(old, ignore_errors=True)


def _scratch_tmpdir() -> Path:
    """A temp folder per session: vLLM leaves ZMQ socket files in the temp dir, so keep them here.

    Subprocesses (vLLM's spawned engine, Ray workers, nested pytest) inherit TMPDIR and reuse the folder
    instead of making their own.
    """
    inherited = Path(os.environ.get("TMPDIR", "/nonexistent"))
    if inherited.parent == _SCRATCH_PARENT and inherited.is_dir():
        return inherited
    _SCRATCH_PARENT.mkdir(parents=True, exist_ok=True)
    _prune_old_sessions()
    scratch = Path(tempfile.mkdtemp(prefix="session-", dir=_SCRATCH_PARENT))
    (scratch / _OWNER_FILE).write_text(str(os.getpid()))
    return scratch


os.environ["TMPDIR"] = str(_scratch_tmpdir())
tempfile.tempdir = None  # forget any temp dir computed before TMPDIR was set
os.environ.setdefault("LONGEVAL_CACHE", str(REPO / ".cache"))
# torch.compile caches default to the temp dir; keep them across sessions so warm-ups are paid once.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "torchinductor"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Two test workers share the machine's cores: an engine's OpenMP threads that spin between a decoding step's
# parallel regions take CPU the other worker needs. Waiting threads decoded the tiny model on 14-16 CPU-s beside
# a busy loop instead of 19-22 (benchmarks/omp_wait.py). Set before anything loads libgomp; Ray, its actors and
# every subprocess inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The multi-host harness's names carry the session's tag, so its leftover check counts this session's hosts only.
os.environ.setdefault("LONGEVAL_HOSTS_TAG", uuid.uuid4().hex[:3])
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 set; a CLI run in a subprocess would take them
# for a terminal's width and wrap its piped output, which a user's pipe never does.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def _check_exit_codes() -> None:
    """Every exit code a test gets from `longeval.cli.main` in process is checked against docs/operations.md's
    exit-code table (`tests/exit_codes.py`): installed before any test module imports `main`."""
    from longeval import cli
    from tests.exit_codes import checked

    if not hasattr(cli.main, "unchecked"):
        cli.main = checked(cli.main)


_check_exit_codes()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The packaged SmolLM2-135M-Instruct as a Hugging Face folder (converted on the first run, ~25 s)."""
    from longeval.engines.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="session")
def tiny_model_path(smollm2_path: Path) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, for plumbing tests (its output is junk)."""
    from longeval.engines.models import build_tiny_model

    return build_tiny_model()


@pytest.fixture(autouse=True, scope="module")
def _kept_engines_end_with_their_module() -> Iterator[None]:
    """Engines a module's runs keep for its next runs (`cluster.keep_engines`) stop with the module: each holds a
    CPU of the worker's Ray, which the next module's tests may need whole."""
    yield
    placement = sys.modules.get("longeval.stages.infer.placement")
    if placement is not None:
        placement.release_engines()


LONGEST = ("test_host_cluster.py", "test_pipeline_faults.py", "test_host_slurm.py", "test_infer.py")
"""The longest files of a clean-clone run (`benchmarks/test_time.py`: 606, 418, about 150 and 180 worker-seconds),
handed out first: the host module, handed out twelve minutes in, was the run's last seven minutes."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with engine tests first. They are the long units of `make test`'s two workers (a whole file goes to
    one worker), and a long one handed out last would keep one worker busy while the other idles."""
    slow = {item.path for item in items if item.get_closest_marker("engine")}
    # stable: the order within a file is kept
    items.sort(key=lambda item: (item.path not in slow, LONGEST.index(item.path.name) if item.path.name in LONGEST
                                 else len(LONGEST)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing session's scratch is removed: a full suite leaves gigabytes there (runs, Ray's logs, the S3
    server's volumes), and a machine that runs the suite from many checkouts ran out of disk. A failing one's is
    kept for debugging, pruned by a later session an hour on."""
    if not hasattr(session.config, "workerinput") and os.geteuid() == 0:
        from tests.cluster.hosts import available, leftovers

        left = leftovers() if available() is None else []
        if left:  # a test's hosts (tests/cluster/hosts.py) outlived it: the machine keeps their namespaces
            print(f"\nnamespaces or links of the multi-host harness left behind: {', '.join(left)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            exitstatus = session.exitstatus
    scratch = Path(os.environ["TMPDIR"])
    owner = scratch / _OWNER_FILE
    if exitstatus != 0 or hasattr(session.config, "workerinput") or not owner.is_file():
        return
    if owner.read_text() == str(os.getpid()):
        shutil.rmtree(scratch, ignore_errors=True)
