"""CPU-seconds a command costs, with everything it starts (Ray's daemons, engine processes, servers), whatever else
runs on the machine.

The test suite is CPU-bound on two cores (three pytest workers took longer than two), so a test's cost is the CPU
it burns, not its wall clock, which another job on the machine stretches. The command runs in a cgroup of its own
(v2, or v1's cpuacct), which every process it starts inherits; the group's CPU counter is read when the command
ends and its leftovers had two seconds to go. Needs write access to the cgroup tree (root).

    python benchmarks/cpu_seconds.py -- python -m pytest -q tests/stages/infer/test_infer.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpuacct")


def make_group() -> tuple[Path, str]:
    """A new cgroup and the file its CPU time is read from: v1's cpuacct where mounted, else v2."""
    name = f"longeval-cpu-{uuid.uuid4().hex[:8]}"
    if (V1 / "cpuacct.usage").exists():
        group = V1 / name
        group.mkdir()
        return group, "cpuacct.usage"
    if (V2 / "cgroup.controllers").exists():
        group = V2 / name
        group.mkdir()
        return group, "cpu.stat"
    raise SystemExit("no cgroup tree here (/sys/fs/cgroup): cpu_seconds.py needs cgroup v1's cpuacct or v2")


def used_seconds(group: Path, counter: str) -> float:
    text = (group / counter).read_text()
    if counter == "cpuacct.usage":
        return int(text) / 1e9
    usage = dict(line.split() for line in text.splitlines())
    return int(usage["usage_usec"]) / 1e6


def run(command: list[str], settle_s: float = 2.0) -> tuple[int, float, float]:
    """The command's exit code, CPU-seconds (its processes and all they started) and wall seconds."""
    try:
        group, counter = make_group()
    except PermissionError:
        raise SystemExit("cannot make a cgroup: run as root (cpu_seconds.py moves the command into a group of its "
                         "own)") from None
    began = time.monotonic()
    proc = subprocess.Popen(command, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    code = proc.wait()
    wall = time.monotonic() - began
    time.sleep(settle_s)  # daemons that outlive the command (Ray's agents stopping) still count
    seconds = used_seconds(group, counter)
    parent = group.parent / "cgroup.procs"
    for pid in (group / "cgroup.procs").read_text().split():  # leftovers back to the root group, so it can go
        with contextlib.suppress(OSError):  # it ended meanwhile
            parent.write_text(pid)
    try:
        group.rmdir()
    except OSError:
        print(f"note: {group} still holds processes; remove it once they end", file=sys.stderr)
    return code, seconds, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    code, seconds, wall = run(command)
    print(f"cpu_seconds {seconds:.1f}  wall_seconds {wall:.1f}  exit_code {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
