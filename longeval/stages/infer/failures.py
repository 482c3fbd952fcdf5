"""What a replica died of: the errors no restart helps (they stop the run), and the one line that names a cause."""

from __future__ import annotations

from longeval.errors import DiskFullError, LeaseLostError, find_error

__all__ = ["cause_of", "stop_on_fatal"]


def stop_on_fatal(exc: BaseException) -> None:
    """Raise the DiskFullError or LeaseLostError a replica died of, if that is what it died of: no restart helps,
    and the run stops with its one line."""
    for kind in (DiskFullError, LeaseLostError):
        found = find_error(exc, kind)
        if found is not None:
            raise kind(str(found)) from exc  # a fresh one, raised here: the Ray error prints its traceback


def cause_of(exc: BaseException) -> str:
    """The innermost message of a Ray error, on one line."""
    cause, seen = exc, {id(exc)}
    while (following := getattr(cause, "cause", None) or cause.__cause__) is not None and id(following) not in seen:
        cause = following
        seen.add(id(cause))
    text = [line.strip() for line in f"{type(cause).__name__}: {cause}".splitlines() if line.strip()]
    return text[-1][:500] if text else type(cause).__name__
