"""One exception family; every message says what was wrong and what to do about it."""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class LongevalError(Exception):
    """Base class: the CLI prints these as one clear line instead of a traceback."""


class ConfigError(LongevalError):
    """A config key, value or override is wrong."""


class UnknownTaskError(ConfigError):
    """A task name that is not in the registry."""


class RayStartError(LongevalError):
    """A private local Ray did not start (its node timed out, a port it needs was taken): Ray says so with a
    traceback that names neither the cause on this machine nor the fix."""


class DataFileError(LongevalError):
    """A user-supplied data file is missing or not in the expected format."""


class ModelPathError(LongevalError):
    """The model or tokenizer folder is missing or unusable."""


class LengthError(LongevalError):
    """A target length cannot hold the task's template, question and output budget."""


class StoreError(LongevalError):
    """A run root cannot be read or written."""


class DiskFullError(StoreError):
    """A local write found no space left (ENOSPC) or the user's quota spent (EDQUOT): the run stops, since every
    later write would fail the same way, and a rerun resumes once there is room."""


class OutputError(LongevalError):
    """A file the user asked for (`report -o`) cannot be written there."""


class DamagedShardError(StoreError):
    """A committed shard whose bytes no longer match its commit record; it has been set aside to be redone.

    `found` says what was found and where it went, without advice: a command that redoes the shard itself (a run
    retrying its stages) says so instead of asking for a rerun."""

    def __init__(self, found: str, advice: str = "rerun the same command (finished work is kept)") -> None:
        super().__init__(f"{found}; {advice}")
        self.found, self.advice = found, advice

    def __reduce__(self) -> tuple:  # raised in a Ray worker, it is pickled to reach the driver
        return type(self), (self.found, self.advice)


class StaleScoresError(StoreError):
    """Scores that no longer match their predictions (`longeval.run.consistency`): a report on them would be wrong."""


class LeaseHeldError(StoreError):
    """Another live process holds the run root's lease: two writers would do the same work twice."""


class LeaseLostError(StoreError):
    """A later run took this run's lease of the run root over (its driver died, or missed its stale limit): what
    this run still runs must not write the root."""


class ReplicaLostError(LongevalError):
    """The driver declared this replica lost (its node marked dead) and gave its prompts to others: a replica that
    lives on (a host whose link came back) must not write what they write again."""


def find_error(exc: BaseException, kind: type[E]) -> E | None:
    """The `kind` error in `exc`: itself, its causes, or the one a Ray worker raised. A Ray task error is an
    instance of its cause's class too but prints the whole remote traceback, so its `cause` is what is returned."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        inner = getattr(current, "cause", None)
        if isinstance(inner, BaseException):  # a Ray task error: the worker's own exception
            current = inner
        elif isinstance(current, kind):
            return current
        else:
            current = current.__cause__
    return None
