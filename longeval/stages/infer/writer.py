"""The prediction writer: a replica's finished predictions committed to the run root from a thread of its own."""

from __future__ import annotations

import queue
import threading
import time

from longeval.errors import DiskFullError, LeaseLostError, LongevalError, ReplicaLostError
from longeval.records import prediction_table
from longeval.store.lease import superseded
from longeval.store.run_root import RunRoot

__all__ = ["PredictionWriter", "lost_marker"]


def lost_marker(record: str) -> str:
    """Where the driver marks a replica lost, in the run root, by its engine record (`engines/<name>-<host>-<pid>-
    <started>.json`: one life of one actor; a replica name such as `pool0/r0` comes again in a later call)."""
    return f"dispatch/lost/{record.rsplit('/', 1)[-1]}"


class PredictionWriter:
    """Commits finished predictions from a thread of its own, so the engine never waits on the store.

    Rows are gathered for up to `interval_s` after the first of them finished (or `max_rows` of them), then
    committed as one part: a kill -9 loses at most that much finished work, and a long stage leaves one small
    file per interval per replica, not one per row (the stage merges them at its end, `longeval.store.compact`).

    `fence`: the generation of the root's lease its driver holds. Before each part the writer checks that no
    later claim exists (`lease.superseded`, one HEAD): a killed driver's replicas live on for about a second (Ray
    ends them once it sees the driver gone) and committed parts a rerun had already listed as not done, so it ran
    those prompts again; a driver taken over after missing its stale limit has replicas that would write on.

    `replica`: this replica's engine record (one life of it). Before each part the writer also checks that the
    driver has not marked it lost (`lost_marker`, one HEAD): a host cut off long enough for Ray to mark its node
    dead has its prompts given to other replicas, but its replica runs on, and when the link comes back it would
    commit what they commit too.
    """

    def __init__(self, root: RunRoot, *, extra: dict[str, str], interval_s: float = 30.0,
                 max_rows: int = 1024, fence: int | None = None, replica: str | None = None) -> None:
        self.root, self.extra, self.interval_s, self.max_rows = root, extra, interval_s, max_rows
        self.fence = fence
        self.lost = lost_marker(replica) if replica else None
        self.queue: queue.Queue[list[dict] | None] = queue.Queue()
        self.count = 0
        """Rows committed."""
        self.finished = 0
        """Rows handed over by the engine (what a progress bar shows: commits come every `interval_s`)."""
        self.names: list[str] = []
        """The parts committed."""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="longeval-writer", daemon=True)
        self.thread.start()

    @property
    def parts(self) -> int:
        """How many parts were committed."""
        return len(self.names)

    def put(self, rows: list[dict]) -> None:
        if self.error is not None:
            raise self._failed()
        self.finished += len(rows)
        self.queue.put(rows)

    def close(self) -> int:
        """Write what is left; returns how many rows were written in all."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self._failed()
        return self.count

    def _failed(self) -> BaseException:
        """The writer's error for the engine's thread: a full disk or a lost lease as itself (the driver stops the
        run on them: a restart cannot help)."""
        if isinstance(self.error, DiskFullError | LeaseLostError | ReplicaLostError):
            return self.error
        failed = LongevalError(f"writing predictions failed: {self.error}")
        failed.__cause__ = self.error
        return failed

    def _loop(self) -> None:
        closing = False
        while not closing:
            first = self.queue.get()
            if first is None:
                return
            rows, due = list(first), time.monotonic() + self.interval_s
            while len(rows) < self.max_rows:
                try:  # what is queued already goes in this part, even with no time left
                    more = self.queue.get(timeout=max(0.0, due - time.monotonic())) if time.monotonic() < due \
                        else self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                    break
                rows += more
            try:
                if self.fence is not None and superseded(self.root, self.fence):
                    raise LeaseLostError(
                        f"run root {self.root.uri}: a later run took this run's lease over (claim {self.fence + 1}); "
                        f"this replica stops without writing its last {len(rows)} predictions, which that run makes")
                if self.lost is not None and self.root.exists(self.lost):
                    raise ReplicaLostError(
                        f"this replica was declared lost ({self.lost}) and its prompts given to others; it stops "
                        f"without writing its last {len(rows)} predictions")
                table = prediction_table([{**row, **self.extra} for row in rows])
                self.names.append(self.root.write_part("predictions", table))
                self.count += len(rows)
            except BaseException as exc:  # surfaced by put/close in the engine's thread
                self.error = exc
                return
