"""The private local Ray of a run ends with the run, however the run ends.

Ray's fate sharing stops the GCS and the raylet when the driver dies, but after a `kill -9` of the driver the
raylet's dashboard and runtime-env agents spend a minute reporting its death to the GCS that died with it
(measured: both still there 60 s later) before they exit. This watcher ends them at once. `runtime.init_ray`
starts one for each Ray it starts, with the pids of Ray's head processes (the GCS, the raylet, ...). It reads a
pipe whose only writer is the driver, so end of file means the driver is gone, whatever killed it; it also ends
when the head processes are gone (a `ray.shutdown()` in a process that lives on). Meanwhile it keeps a list of
their descendants, since the agents are the raylet's children and are orphaned the moment it dies.

    python -m longeval.cluster.reaper PID:START ...     (started by runtime.init_ray, not by hand)

Only the standard library and psutil are imported: it starts in a fraction of a second.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

POLL_S = 1.0
"""How often the watcher looks for the head processes (the driver's death wakes it at once)."""
REFRESH_S = 5.0
"""How often it refreshes its list of their descendants: one scan of the process table, which is most of what
the watcher costs (the agents it is for are born with Ray, before its first scan). A scan per head every second
took 0.55 CPU-s a minute beside an idle Ray on 2 cores, the most of any process there (issue #23)."""
GRACE_S = 3.0
"""Between SIGTERM and SIGKILL for what is left of the Ray."""

_watchers: list[subprocess.Popen] = []  # the write ends of their pipes stay open as long as this process lives


def watch(since: float) -> subprocess.Popen | None:
    """Start the watcher for the Ray this process started at `since` (a `time.time()`): its head processes are
    this process's children born since then that run Ray's own programs."""
    import psutil
    import ray

    ray_dir = os.path.dirname(ray.__file__)
    heads = []
    for child in psutil.Process().children():
        try:
            if child.create_time() >= since - 1.0 and any(ray_dir in arg for arg in child.cmdline()[:3]):
                heads.append(_name(child))
        except psutil.Error:
            continue
    if not heads:  # nothing to tell a shut-down Ray from a running one by: better no watcher than a wrong one
        return None
    watcher = subprocess.Popen([sys.executable, "-m", "longeval.cluster.reaper", *heads], stdin=subprocess.PIPE,
                               start_new_session=True)  # a Ctrl-C in the terminal is the driver's to handle
    _watchers.append(watcher)
    return watcher


def _name(proc) -> str:
    """A process as pid and start time, which a reused pid does not match."""
    return f"{proc.pid}:{proc.create_time()!r}"


def _process(name: str):
    """The live process `name` stands for, or None."""
    import psutil

    pid, _, start = name.partition(":")
    try:
        proc = psutil.Process(int(pid))
        if proc.create_time() == float(start) and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.Error, ValueError):
        pass
    return None


def _family(names: set[str]) -> set[str]:
    """`names` that still live, and all their descendants (from one scan of the process table)."""
    import psutil

    children: dict[int, list] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc)
    found, todo = set(), list(filter(None, map(_process, names)))
    while todo:
        proc = todo.pop()
        try:
            found.add(_name(proc))
        except psutil.Error:
            continue
        todo += children.get(proc.pid, [])
    return found


def _stop(names: set[str]) -> None:
    import psutil

    procs = list(filter(None, map(_process, names)))
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    deadline = time.monotonic() + GRACE_S
    while (procs := [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue


def main(argv: list[str] | None = None) -> int:
    heads = set(sys.argv[1:] if argv is None else argv)
    known = _family(heads)
    stdin = sys.stdin.fileno()
    refreshed = time.monotonic()
    while any(map(_process, heads)):
        readable, _, _ = select.select([stdin], [], [], POLL_S)
        if readable and not os.read(stdin, 4096):
            break  # end of file: the driver is gone
        if time.monotonic() - refreshed >= REFRESH_S:
            known |= _family(heads)
            refreshed = time.monotonic()
    _stop(_family(known))
    return 0


if __name__ == "__main__":
    sys.exit(main())
