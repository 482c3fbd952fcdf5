"""Scoring with a deadline per call: no scorer, present or future, may stall a run.

A runaway regex holds the GIL inside C code, where neither a thread nor a Python signal handler can stop it.
So the scorer runs in a child process that scores the rows one by one and sends each result back; the parent
waits at most `timeout_s` for each. A call over the deadline kills the child, is recorded as data (score 0,
error_type `scorer_timeout`) and a fresh child goes on with the rows after it.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from longeval.errors import ConfigError, LongevalError
from longeval.records import Instance, Prediction, Score
from longeval.scoring import score_prediction
from longeval.scoring.judgement import Judge

JudgeFor = Callable[[str, str], Judge]
"""(family, task) -> the task's judge: `longeval.tasks.judge_for`, handed in so scoring knows no task (a
module-level function, so the spawned child can unpickle it)."""

__all__ = ["SCORER_TIMEOUT", "DeadlineScorer", "import_plugins", "timeout_score"]

SCORER_TIMEOUT = "scorer_timeout"
_START_TIMEOUT_S = 120.0
"""A child's imports (the task registry, the plugins) may take a while on a loaded machine."""


def import_plugins(modules: Sequence[str]) -> None:
    """Import the `plugins` modules, which register families or tasks (`longeval.tasks.register`)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"plugins: cannot import {name!r} ({exc}); give importable module names, "
                              "e.g. plugins=[mypackage.judges], with the package on PYTHONPATH") from exc


def timeout_score(row: dict[str, Any]) -> dict[str, Any]:
    """The score row of a call that ran out of time: 0, labelled, like any other failure."""
    instance = Instance.from_row({**row, "prompt": "", "prompt_token_ids": []})
    prediction = Prediction.from_row(row)
    return Score(instance_id=instance.instance_id, model_id=prediction.model_id, family=instance.family,
                 task=instance.task, target_length=instance.target_length, depth=instance.depth,
                 metric=instance.metric, score=0.0, parsed_answer="", error_type=SCORER_TIMEOUT,
                 complexity=instance.complexity).to_row()


def _serve(conn: Connection, plugins: list[str], judge_for: JudgeFor) -> None:
    """The child: import the plugins, then score every row it is sent, one answer per row."""
    try:
        import_plugins(plugins)
    except LongevalError as exc:
        conn.send(("raise", exc))
        return
    conn.send(("ready", None))
    while True:
        try:
            rows = conn.recv()
        except EOFError:
            return
        for row in rows:
            try:
                instance = Instance.from_row({**row, "prompt": "", "prompt_token_ids": []})
                judge = judge_for(instance.family, instance.task)
                conn.send(("ok", score_prediction(instance, Prediction.from_row(row), judge).to_row()))
            except LongevalError as exc:  # a data fault (unknown task, broken meta): the run must stop
                conn.send(("raise", exc))
                break


class DeadlineScorer:
    """Score rows in a child process, each call within `timeout_s` seconds.

    Args:
        timeout_s: the deadline of one scorer call.
        judge_for: finds an instance's judge from its family and task.
        plugins: modules the child imports first (they may register tasks).
    """

    def __init__(self, timeout_s: float, judge_for: JudgeFor, plugins: Sequence[str] = ()) -> None:
        self.timeout_s = timeout_s
        self.judge_for = judge_for
        self.plugins = list(plugins)
        self._ctx = mp.get_context("spawn")  # no fork inside a threaded Ray worker
        self._proc: Any = None
        self._conn: Connection | None = None
        self.timeouts = 0

    def _start(self) -> Connection:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.plugins, self.judge_for), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(_START_TIMEOUT_S):
            self.close()
            raise LongevalError(f"the scoring process did not start within {_START_TIMEOUT_S:.0f} s")
        kind, value = parent.recv()
        if kind == "raise":
            self.close()
            raise value
        return parent

    @property
    def pid(self) -> int | None:
        """The scoring child's pid while it runs (it starts with the first rows)."""
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def score_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One score row per input row, in order; a call over the deadline gives a `scorer_timeout` row."""
        out: list[dict[str, Any]] = []
        while len(out) < len(rows):
            conn = self._conn or self._start()
            pending = rows[len(out):]
            conn.send(pending)
            for row in pending:
                try:
                    ready = conn.poll(self.timeout_s)
                except (EOFError, OSError):
                    ready = False
                if not ready:  # stalled (or died): record it, and start over after this row
                    self.close()
                    self.timeouts += 1
                    out.append(timeout_score(row))
                    break
                try:
                    kind, value = conn.recv()
                except EOFError:  # the child died on this row (a crash in C code): as good as a timeout
                    self.close()
                    self.timeouts += 1
                    out.append(timeout_score(row))
                    break
                if kind == "raise":
                    self.close()
                    raise value
                out.append(value)
        return out
