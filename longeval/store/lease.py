"""One writer per run root: a lease a run takes before it writes, renews while it runs and gives back when it ends,
so a second `longeval run` on the same root refuses at once instead of doing the same GPU work twice.

The lease is a folder of numbered claims, `<root>/_lease/<generation>.json`; the claim with the highest number is
the lease. It names its holder (host, pid and the pid's start time, a run id, the stages it runs), when it started,
its last heartbeat and the stale limit it promised to renew within. A claim is made with the store's atomic create
(`RunRoot.create_bytes`: a hard link locally, a PutObject with `If-None-Match: *` on S3), so of two processes
claiming the same number exactly one wins. Taking over a released, stale or dead lease is claiming the next number,
so two processes taking over the same dead holder race for one name and, again, exactly one wins. Numbers only
grow: a release marks its claim released instead of deleting it, only claims below the lease are cleaned up, and
a claim made below the lease (by a process that read an old state) loses the check that follows every claim.

What holds: while its holder renews the heartbeat, no other process gets the lease. What does not: a holder that
stops renewing for longer than its stale limit (a suspended machine, a store unreachable that long) is taken over
while it may still run; it notices at its next renewal and logs an error. Staleness compares the holder's clock
(its heartbeat) with the reader's, so the limit must exceed the clock skew between hosts. A holder on the reader's
own host whose process is gone is taken over at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psutil

from longeval.errors import LeaseHeldError, StoreError
from longeval.store.run_root import RunRoot

if TYPE_CHECKING:
    from longeval.config import StoreConfig

__all__ = ["LEASE_DIR", "Holder", "Lease", "acquire", "claim_name", "current", "held_generation", "held_message",
           "hold", "lease_and_claims", "superseded", "writer_warning"]

log = logging.getLogger(__name__)

LEASE_DIR = "_lease"
_CLAIM = re.compile(r"^(\d{12})\.json$")
CLAIM_TRIES = 5
"""Claims a process makes before it gives up: each lost race is followed by a fresh look at the lease."""


def claim_name(generation: int) -> str:
    """The claim file of a generation, `_lease/000000000007.json` (fixed width: names sort as numbers)."""
    return f"{LEASE_DIR}/{generation:012d}.json"


def superseded(root: RunRoot, generation: int) -> bool:
    """Whether a claim after `generation` exists: the run that held it was taken over, and nothing it still runs
    may write the root. One HEAD request, not a listing: taking a lease over claims the next number."""
    return root.exists(claim_name(generation + 1))


_HELD: dict[str, int] = {}
"""Run roots whose lease this process holds (`hold`) -> the generation it holds."""


def held_generation(root: RunRoot) -> int | None:
    """The generation of `root`'s lease this process holds, None when it holds none. A driver hands it to its
    replicas: a killed driver's replicas live on for about a second, and their prediction writer checks it
    (`superseded`) before each commit, so a rerun that took the lease over in that second runs nothing twice."""
    return _HELD.get(root.uri)


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run root's lease, as its claim records it."""

    generation: int
    run_id: str
    host: str
    pid: int
    pid_started: float
    """The process's start time: a pid reused by another process is not taken for the holder."""
    started: float
    heartbeat: float
    stale_s: float
    command: str
    released: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, generation: int, data: bytes) -> Holder:
        """The holder a claim names; a claim that does not parse counts as a stale one (taken over)."""
        try:
            fields = json.loads(data)
            return cls(generation=generation, run_id=str(fields["run_id"]), host=str(fields["host"]),
                       pid=int(fields["pid"]), pid_started=float(fields["pid_started"]),
                       started=float(fields["started"]), heartbeat=float(fields["heartbeat"]),
                       stale_s=float(fields["stale_s"]), command=str(fields.get("command", "")),
                       released=bool(fields.get("released", False)))
        except (ValueError, KeyError, TypeError):
            return cls(generation, run_id="unreadable", host="?", pid=0, pid_started=0.0, started=0.0,
                       heartbeat=0.0, stale_s=0.0, command="")

    def free_because(self, now: float) -> str | None:
        """Why another process may take the lease (released, stale, its process gone), or None while it holds."""
        if self.released:
            return "released"
        if now - self.heartbeat > self.stale_s:
            return f"no heartbeat for longer than its stale limit of {_ago(self.stale_s)}"
        if self.host == socket.gethostname() and not _alive(self.pid, self.pid_started):
            return f"pid {self.pid} no longer runs on this host"
        return None

    def describe(self, now: float) -> str:
        return (f"host {self.host} pid {self.pid} ({self.command or 'longeval'}, run {self.run_id}, started "
                f"{_utc(self.started)}, last heartbeat {_ago(now - self.heartbeat)} ago)")


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _alive(pid: int, started: float) -> bool:
    """Whether the process `pid` that started at `started` still runs here (not a later one with its pid)."""
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.NoSuchProcess:  # zombies included: they have exited
        return False
    except psutil.AccessDenied:  # it runs, as another user
        return True


def current(root: RunRoot) -> Holder | None:
    """The run root's lease (its highest claim), released or not; None when no run ever took it."""
    return lease_and_claims(root)[0]


def lease_and_claims(root: RunRoot) -> tuple[Holder | None, list[int]]:
    """The run root's lease and the claim numbers listed with it (one listing, unless the top claim is deleted
    under it)."""
    for _ in range(3):
        claims = sorted(int(m.group(1)) for name in root.files(LEASE_DIR) if (m := _CLAIM.match(name)))
        if not claims:
            return None, []
        try:
            return Holder.from_json(claims[-1], root.read_bytes(claim_name(claims[-1]))), claims
        except StoreError:  # a losing claim, deleted between the listing and the read: look again
            continue
    raise StoreError(f"cannot read the lease of {root.uri} ({root.path(LEASE_DIR)}): its claims keep changing; "
                     "try again")


def _claim_owner(root: RunRoot, generation: int) -> str | None:
    """The run id of a claim, None when it is gone (its maker lost and deleted it)."""
    try:
        return Holder.from_json(generation, root.read_bytes(claim_name(generation))).run_id
    except StoreError:
        return None


def _this_process(generation: int, *, stale_s: float, command: str) -> Holder:
    now = time.time()
    return Holder(generation, run_id=uuid.uuid4().hex[:12], host=socket.gethostname(), pid=os.getpid(),
                  pid_started=psutil.Process().create_time(), started=now, heartbeat=now, stale_s=stale_s,
                  command=command)


def held_message(root: RunRoot, holder: Holder, now: float) -> str:
    """The one line a run refused by a held lease prints: who holds it and how to take over from a dead holder."""
    return (f"run root {root.uri} is being written by {holder.describe(now)}; wait for it to finish, or if that "
            f"process is dead rerun with store.take_over_lease=true (or wait until its heartbeat is "
            f"{_ago(holder.stale_s)} old)")


def acquire(root: RunRoot, *, heartbeat_s: float, stale_s: float, take_over: bool = False,
            command: str = "") -> Lease:
    """Take the run root's lease and start renewing it; a released, stale or dead holder's is taken over.

    Args:
        heartbeat_s: seconds between heartbeats.
        stale_s: the stale limit this claim promises; another process takes the lease over after it.
        take_over: take the lease even from a holder that looks alive.
        command: what this process runs, shown to a refused second run.

    Raises:
        LeaseHeldError: another live process holds the lease (the message names it and how to take over).
    """
    forced_from = None  # take_over is for the holder first seen, not for a process that won a race since
    for _ in range(CLAIM_TRIES):
        top, claims = lease_and_claims(root)
        now = time.time()
        why = top.free_because(now) if top is not None else None
        if top is not None and why is None:
            if not take_over or forced_from not in (None, top.run_id):
                raise LeaseHeldError(held_message(root, top, now))
            forced_from, why = top.run_id, "store.take_over_lease=true"
        mine = _this_process(top.generation + 1 if top else 1, stale_s=stale_s, command=command)
        name = claim_name(mine.generation)
        if not root.create_bytes(name, mine.to_json()) and _claim_owner(root, mine.generation) != mine.run_id:
            continue  # another process claimed this number first: look again (if our retried request did, go on)
        # A later claim won (ours came from old news): whoever made it saw ours, so it took the next number
        # (one HEAD request, not a listing: a command lists the claims once).
        if root.exists(claim_name(mine.generation + 1)):
            root.delete(name)
            continue
        if top is not None and why != "released":
            log.warning("taking over the lease of %s from %s: %s", root.uri, top.describe(now), why)
        for other in claims:  # tidy: claims below the lease are history (all listed: later ones are above ours)
            root.delete(claim_name(other))
        lease = Lease(root, mine, heartbeat_s=heartbeat_s, first=not claims)
        lease.start()
        return lease
    raise StoreError(f"could not take the lease of {root.uri}: other processes kept claiming it "
                     f"({CLAIM_TRIES} tries); try again")


class Lease:
    """A held lease: a thread renews its heartbeat every `heartbeat_s` until `release()`."""

    def __init__(self, root: RunRoot, holder: Holder, *, heartbeat_s: float, first: bool = False) -> None:
        self.root = RunRoot(root.uri)  # its own: the heartbeat thread shares no listing memory with the run's
        self.holder = holder
        self.heartbeat_s = heartbeat_s
        self.first = first
        """No claim was there before this one: no run had held the root's lease (`withdraw` may remove it)."""
        self.lost = False
        """Another process took the lease over (this one missed its stale limit)."""
        self.withdrawn = False
        """The claim was deleted (`withdraw`): nothing is left to release."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="longeval-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.renew()

    def _still_mine(self) -> bool:
        if not superseded(self.root, self.holder.generation):  # one HEAD per heartbeat
            return True
        latest = current(self.root)
        if latest is not None and latest.generation == self.holder.generation:
            return True
        if not self.lost:  # said before it is set: whoever sees `lost` finds the reason already logged
            log.error("lost the lease of %s: %s took it over (this run missed its heartbeat for longer than "
                      "%s); two runs may now write this root", self.root.uri,
                      latest.describe(time.time()) if latest else "another process", _ago(self.holder.stale_s))
            self.lost = True
        return False

    def renew(self) -> bool:
        """Write a fresh heartbeat; False when the lease was lost or released (or the store was unreachable)."""
        with self._lock:
            if self._stop.is_set() or self.lost:
                return False
            try:
                if not self._still_mine():
                    return False
                holder = replace(self.holder, heartbeat=time.time())
                self.root.write_bytes(claim_name(holder.generation), holder.to_json())
                self.holder = holder
                return True
            except StoreError as exc:
                log.warning("cannot renew the lease of %s (%s); trying again in %s", self.root.uri, exc,
                            _ago(self.heartbeat_s))
                return False

    def release(self) -> None:
        """Stop renewing and mark the claim released, so the next run takes the lease at once. A failure here
        is a warning: the lease then goes stale, or is taken over as a dead pid's."""
        self._stop.set()
        with self._lock:
            if self.lost or self.withdrawn:
                return
            try:
                if self._still_mine():
                    self.holder = replace(self.holder, released=True, heartbeat=time.time())
                    self.root.write_bytes(claim_name(self.holder.generation), self.holder.to_json())
            except StoreError as exc:
                log.warning("cannot release the lease of %s (%s); the next run takes it over once it is stale",
                            self.root.uri, exc)
        self._thread.join(timeout=5)

    def withdraw(self) -> None:
        """Stop renewing and delete the claim, as if this run had never taken the lease: for a run refused before
        it wrote anything, on a root whose lease it took first (`first`), so the root keeps no `_lease/` of a run
        that never happened. A lease taken over from an earlier holder is released instead (`release`): its claim
        numbers must keep growing. The `_lease` folder of a local root goes too when left empty."""
        if not self.first:
            return
        self._stop.set()
        with self._lock:
            if self.lost or self.withdrawn:
                return
            try:
                self.root.delete(claim_name(self.holder.generation))
            except StoreError as exc:
                log.warning("cannot remove the lease of %s (%s); it is released instead", self.root.uri, exc)
                return
            self.withdrawn = True
        self._thread.join(timeout=5)
        folder = self.root.local_path()
        if folder is not None:
            with contextlib.suppress(OSError):  # not empty: another run claimed it since
                (folder / LEASE_DIR).rmdir()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def writer_warning(root: RunRoot) -> str | None:
    """A one-line warning when another live process holds the root's lease: what is read may still change."""
    holder = current(root)
    now = time.time()
    if holder is None or holder.free_because(now) is not None:
        return None
    return (f"run root {root.uri} is being written by {holder.describe(now)}: its numbers may change until that "
            "run ends")


@contextmanager
def hold(root: RunRoot, store: StoreConfig, *, command: str, writer: bool = True) -> Iterator[Lease | None]:
    """The run root's lease for the block, given back when it ends (normally, by an error or a Ctrl-C).

    A `writer` (a run that generates or infers: GPU work) refuses a held root with `LeaseHeldError`; another
    (scoring, a report) warns that the root is being written and goes on without the lease.
    """
    try:
        lease = acquire(root, heartbeat_s=store.lease_heartbeat_s, stale_s=store.lease_stale_s,
                        take_over=store.take_over_lease, command=command)
    except LeaseHeldError:
        if writer:
            raise
        warning = writer_warning(root)
        if warning:
            log.warning("%s", warning)
        yield None
        return
    with lease:
        _HELD[root.uri] = lease.holder.generation
        try:
            yield lease
        finally:
            _HELD.pop(root.uri, None)
