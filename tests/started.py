"""What each test starts, seen rather than declared: Ray, a vLLM engine, a SeaweedFS server, a two-node cluster,
Slurm, Chromium.

A watcher process polls the process table while the session runs and notes the processes this pytest worker started
(each inherits `LONGEVAL_TEST_WORKER`, set below, even through `ray start`'s daemons and Slurm's jobs). A test's
kinds are those of the processes that appeared while it ran, plus those recorded while each of its fixtures was
set up (a module's server counts for every test that uses it, not only the first). They go to the junit report as
a `started` property, which `benchmarks/test_time.py` groups the suite's cost by; `LONGEVAL_STARTED=0` turns
the sampling off.

Each kind is also a marker (`@pytest.mark.ray`, ...; a module's `pytestmark` covers its tests), and `make
test-quick` runs the tests that carry none. So that the quick loop never starts a server, there a test that
carries no such marker and makes one's process fails, saying which marker to add (`CHECK_MARKERS`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.watch_processes import WORKER_ENV

MARKERS = {
    "ray": "starts Ray (a local one, or `ray start`)",
    "cluster": "starts a Ray cluster of two or more nodes on loopback",
    "engine": "runs the real vLLM engine on CPU",
    "s3": "starts a SeaweedFS S3 server",
    "slurm": "starts Slurm's daemons and runs a job",
    "browser": "drives headless Chromium",
}
"""The kinds of real part, each a marker. `cluster`: two or more raylets of this worker alive at once."""
KINDS = tuple(MARKERS)

os.environ[WORKER_ENV] = str(os.getpid())  # every process this worker starts inherits it


@dataclass
class Seen:
    """What the watcher has reported so far, read from its file between tests (never during one)."""

    path: Path
    events: list[tuple[float, str, bool]] = field(default_factory=list)
    """(when, kind, whether a process was made then, not only put to work)."""
    offset: int = 0

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as source:
            source.seek(self.offset)
            for line in source:
                if not line.endswith("\n"):  # written half: read it next time
                    break
                self.offset += len(line.encode("utf-8"))
                event = json.loads(line)
                self.events.append((event["t"], event["kind"], event["new"]))

    def kinds_between(self, start: float, end: float, *, made: bool = False) -> set[str]:
        """The real parts used between two times; `made`: only those whose processes were made then."""
        kinds = {kind for t, kind, new in self.events if start <= t <= end and (new or not made)}
        if any(start <= t <= end for t in _ENGINES_IN_PROCESS):
            kinds.add("engine")
        return kinds


CHECK_MARKERS = os.environ.get("LONGEVAL_CHECK_MARKERS", "0") == "1"
"""Fail a test that starts a real part without its marker: on in `make test-quick`, where such a test would start
it. Off in `make test`, which runs every test anyway: a process can outlive the test that made it, and a full run
should not fail on a watcher's attribution."""
_ENGINES_IN_PROCESS: list[float] = []
"""When a `VllmEngine` was built in this process (no child process shows it)."""
_SEEN: Seen | None = None
_FIXTURE_KINDS: dict[str, set[str]] = {}
_FIXTURE_SPANS: dict[str, list[tuple[float, float]]] = {}


def _enabled() -> bool:
    return os.environ.get("LONGEVAL_STARTED", "1") != "0"


def pytest_configure(config: pytest.Config) -> None:
    for kind, what in MARKERS.items():
        config.addinivalue_line("markers", f"{kind}: {what}")


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
            _ENGINES_IN_PROCESS.append(time.time())
            return built(self, *args, **kwargs)

        vllm_engine.VllmEngine.__init__ = noted  # type: ignore[method-assign]
    global _SEEN
    out = Path(tempfile.mkdtemp(prefix="started-")) / "seen.jsonl"
    _SEEN = Seen(out)
    watcher = subprocess.Popen([sys.executable, str(Path(__file__).with_name("watch_processes.py")), str(os.getpid()),
                                str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, WORKER_ENV: ""})
    deadline = time.monotonic() + 30
    while not out.exists() and watcher.poll() is None and time.monotonic() < deadline:  # its first look is taken
        time.sleep(0.05)


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
    outcome = yield
    if call.when != "call" or _SEEN is None:
        return
    _SEEN.read()
    kinds = _SEEN.kinds_between(item.stash.get(_START, call.start), time.time())
    used = {*getattr(item, "fixturenames", ()), *getattr(item, "funcargs", {})}  # with getfixturevalue's
    for name in sorted(used):
        for span in _FIXTURE_SPANS.pop(name, []):
            _FIXTURE_KINDS.setdefault(name, set()).update(_SEEN.kinds_between(*span))
        kinds |= _FIXTURE_KINDS.get(name, set())
    item.user_properties.append(("started", ",".join(k for k in KINDS if k in kinds)))
    report = outcome.get_result()
    made = _SEEN.kinds_between(item.stash.get(_START, call.start), time.time(), made=True)
    if CHECK_MARKERS and made and report.passed and not any(item.get_closest_marker(kind) for kind in KINDS):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} starts {', '.join(sorted(made))} but carries none of the markers "
                           f"{', '.join(KINDS)}: mark it (@pytest.mark.{sorted(made)[0]}) so that `make test-quick`, "
                           "which runs the unmarked tests, leaves it out")


_START = pytest.StashKey[float]()

