"""What each test starts, seen rather than declared: Ray, a vLLM engine, a SeaweedFS server, a two-node cluster,
Slurm, Chromium.

A thread polls the process table while the session runs and keeps the processes this pytest worker started
(each inherits `LONGEVAL_TEST_WORKER`, set below, even through `ray start`'s daemons and Slurm's jobs). A test's
kinds are those of the processes that appeared while it ran, plus those recorded while each of its fixtures was
set up (a module's server counts for every test that uses it, not only the first). They go to the junit report as
a `started` property, which `benchmarks/test_time.py` groups the suite's cost by; `LONGEVAL_STARTED=0` turns
the sampling off.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

WORKER_ENV = "LONGEVAL_TEST_WORKER"
POLL_S = 0.2
KINDS = ("ray", "cluster", "engine", "s3", "slurm", "browser")
"""`cluster`: two or more raylets of this worker alive at once (a multi-node Ray on loopback)."""

os.environ[WORKER_ENV] = str(os.getpid())  # every process this worker starts inherits it


def kind_of(name: str, cmdline: list[str]) -> str | None:
    """The real part a process belongs to, from its name and command line (None: not one of ours to count)."""
    line = " ".join(cmdline)
    if name == "weed" or line.startswith("weed "):
        return "s3"
    if name.startswith(("slurm", "sbatch", "srun")):
        return "slurm"
    if "chrom" in name:
        return "browser"
    if line.startswith(("ray::Replica", "VLLM::EngineCore")) or "vllm.entrypoints" in line:
        return "engine"
    if name in ("gcs_server", "raylet"):
        return "ray"
    return None


@dataclass
class Sampler:
    """The processes this worker started, when each appeared, and what they are."""

    seen: dict[int, tuple[float, str | None, str]] = field(default_factory=dict)
    """pid -> (first seen, kind, name)."""
    engines_in_process: list[float] = field(default_factory=list)
    """When a `VllmEngine` was built in this process (no child process shows it)."""
    raylets_at_once: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        import psutil

        mine = str(os.getpid())
        now = time.time()
        raylets = 0
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            pid = proc.info["pid"]
            known = self.seen.get(pid)
            if known is None:
                try:
                    if proc.environ().get(WORKER_ENV) != mine:
                        self.seen[pid] = (now, None, "")
                        continue
                except (psutil.Error, OSError):
                    continue
                known = self.seen[pid] = (now, kind_of(proc.info["name"] or "", proc.info["cmdline"] or []),
                                          proc.info["name"] or "")
            raylets += known[2] == "raylet"
        if raylets > 1:
            self.raylets_at_once.append((now, raylets))

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a failed poll loses one sample, never a test
                continue

    def kinds_between(self, start: float, end: float) -> set[str]:
        kinds = {kind for first, kind, _ in self.seen.values() if kind and start <= first <= end}
        if any(start <= t <= end for t in self.engines_in_process):
            kinds.add("engine")
        if any(start <= t <= end for t, _ in self.raylets_at_once):
            kinds.add("cluster")
        return kinds


_SAMPLER = Sampler()
_FIXTURE_KINDS: dict[str, set[str]] = {}
_FIXTURE_SPANS: dict[str, list[tuple[float, float]]] = {}


def _enabled() -> bool:
    return os.environ.get("LONGEVAL_STARTED", "1") != "0"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _enabled():
        return
    try:
        from longeval.engines import vllm_engine
    except ImportError:  # vllm not installed: the quick loop's environment
        pass
    else:
        built = vllm_engine.VllmEngine.__init__

        def noted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            _SAMPLER.engines_in_process.append(time.time())
            return built(self, *args, **kwargs)

        vllm_engine.VllmEngine.__init__ = noted  # type: ignore[method-assign]
    threading.Thread(target=_SAMPLER.run, name="started-sampler", daemon=True).start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SAMPLER.stop.set()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.time()
    yield
    if _enabled():
        _FIXTURE_SPANS.setdefault(fixturedef.argname, []).append((start, time.time()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start = time.time()
    item.stash[_START] = start
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    yield
    if call.when != "call" or not _enabled():
        return
    _SAMPLER.poll()
    kinds = _SAMPLER.kinds_between(item.stash.get(_START, call.start), time.time())
    for name in getattr(item, "fixturenames", ()):
        for span in _FIXTURE_SPANS.pop(name, []):
            _FIXTURE_KINDS.setdefault(name, set()).update(_SAMPLER.kinds_between(*span))
        kinds |= _FIXTURE_KINDS.get(name, set())
    item.user_properties.append(("started", ",".join(k for k in KINDS if k in kinds)))


_START = pytest.StashKey[float]()
