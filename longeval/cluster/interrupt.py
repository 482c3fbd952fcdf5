"""Ctrl-C (and SIGTERM) that always ends a run.

Python runs a SIGINT handler only in the main thread, between bytecodes, and Ray's Cython layer swaps in a
deferring handler around some calls that forgets the signal when the call raises: in CI a Ctrl-C during
inference was lost that way (the engines, in the same process group, shut down, were restarted, and the run
finished with exit 0). The C-level handler writes the signal number to the wakeup fd whatever Python handler is
installed, so a thread reading that fd always learns of the Ctrl-C; the stage loops call `check()` and stop.

SIGTERM is what `scancel`, `ray job stop`, `kill` and a container's stop send. Python's default for it ends the
process on the spot, without running `finally` blocks, so the run root's lease stayed taken (the next run had to
wait out the heartbeat or pass `store.take_over_lease=true`). Inside `watch()` it ends the run as Ctrl-C does,
as `Terminated`, so the lease is given back and the command exits 143 (128 + 15).
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_seen = threading.Event()
_terminated = threading.Event()
"""The signal seen was SIGTERM (else SIGINT)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run ends as for Ctrl-C (what is finished is kept), with exit status 143."""


_handlers: dict[int, Callable[[int, Any], None]] = {}
"""What `watch()` installed, by signal (empty outside it)."""


def restore_sigterm() -> None:
    """Put back `watch()`'s SIGTERM handler after a library replaced it (`ray.init` installs one that calls
    `sys.exit` at once, so the run would end with status 15 and no word on what is kept)."""
    if signal.SIGTERM in _handlers and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handlers[signal.SIGTERM])


def interrupted() -> bool:
    return _seen.is_set()


def check() -> None:
    """Raise KeyboardInterrupt (`Terminated` for SIGTERM) in the caller if a Ctrl-C or SIGTERM arrived, even one
    some library swallowed."""
    if _seen.is_set():
        raise Terminated if _terminated.is_set() else KeyboardInterrupt


@contextmanager
def watch() -> Iterator[None]:
    """Record every SIGINT and SIGTERM while the block runs (main thread only; elsewhere a no-op); `check()` inside
    the block raises for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _seen.clear()
    _terminated.clear()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: object) -> None:
        if signum == signal.SIGTERM:
            _terminated.set()
        _seen.set()
        check()

    for sig in previous_handlers:
        signal.signal(sig, on_signal)
        _handlers[sig] = on_signal
    stop = threading.Event()

    def read() -> None:
        reader.settimeout(0.5)
        while not stop.is_set():
            try:
                data = reader.recv(64)
            except TimeoutError:
                continue
            except OSError:
                return
            if signal.SIGTERM.value in data:
                _terminated.set()
            if signal.SIGINT.value in data or signal.SIGTERM.value in data:
                _seen.set()

    thread = threading.Thread(target=read, name="longeval-sigint", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        _handlers.clear()
        thread.join(timeout=2)  # first: the reader may not have read the signal's byte yet, and would set the flag
        _seen.clear()  # a Ctrl-C belongs to the block it ended: later work in this process runs normally
        _terminated.clear()
        reader.close()
        writer.close()

