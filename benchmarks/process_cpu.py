"""CPU-seconds by kind of process over a command: which processes a test suite's CPU went to.

`cpu_seconds.py` gives one total; this splits it by process name with Linux process accounting (`acct(2)`, as
root): every process that ends while the command runs leaves a record of its name (`comm`, 15 characters, which
Ray sets to the actor's class: `ray::Replica`, `ray::MapWorker(`) and its user and system time. Accounting is
machine-wide, so run it on an otherwise quiet machine; processes still alive when the command ends are not counted.

    python benchmarks/process_cpu.py [--top 30] -- make test      # run, then the table
    python benchmarks/process_cpu.py --read FILE.pacct            # a file written earlier
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

RECORD = struct.Struct("=BBHIIIIIIf8H16s")
"""`struct acct_v3` (linux/acct.h): flag, version, tty, exit code, uid, gid, pid, ppid, begin time, elapsed,
then eight `comp_t` counters (user time, system time, ...) and the command name."""
AHZ = 100
"""Ticks per second of the `comp_t` times."""


def comp_t(value: int) -> int:
    """A `comp_t`: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 7))


def records(path: Path) -> Iterator[tuple[str, float]]:
    """(process name, CPU-seconds) of each v3 record in an accounting file."""
    data = path.read_bytes()
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        if fields[1] != 3:  # not a v3 record
            continue
        user, system = comp_t(fields[10]), comp_t(fields[11])
        yield fields[18].split(b"\0")[0].decode(errors="replace"), (user + system) / AHZ


def table(path: Path, top: int) -> str:
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for name, cpu in records(path):
        seconds[name] += cpu
        count[name] += 1
    lines = [f"{sum(seconds.values()):.0f} CPU-s in {sum(count.values())} processes that ended", "",
             f"{'CPU-s':>8} {'processes':>9}  name"]
    for name, cpu in sorted(seconds.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{cpu:8.1f} {count[name]:9d}  {name}")
    return "\n".join(lines)


def account(path: Path | None) -> None:
    """Turn process accounting on into `path`, or off (None)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode() if path else None) != 0:
        raise SystemExit(f"acct(2) failed: {os.strerror(ctypes.get_errno())} (process_cpu.py needs root)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--read", type=Path, help="an accounting file to read instead of running a command")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    if args.read:
        print(table(args.read, args.top))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, or --read FILE")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pacct"
        path.touch()
        account(path)
        try:
            code = subprocess.call(command)
        finally:
            account(None)
        print(table(path, args.top))
    return code


if __name__ == "__main__":
    sys.exit(main())
