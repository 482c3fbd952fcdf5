"""Ctrl-C that always ends a run.

Python runs a SIGINT handler only in the main thread, between bytecodes, and Ray's Cython layer swaps in a
deferring handler around some calls that forgets the signal when the call raises: in CI a Ctrl-C during
inference was lost that way (the engines, in the same process group, shut down, were restarted, and the run
finished with exit 0). The C-level handler writes the signal number to the wakeup fd whatever Python handler is
installed, so a thread reading that fd always learns of the Ctrl-C; the stage loops call `check()` and stop.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_seen = threading.Event()


def interrupted() -> bool:
    return _seen.is_set()


def check() -> None:
    """Raise KeyboardInterrupt in the caller if a Ctrl-C arrived, even one some library swallowed."""
    if _seen.is_set():
        raise KeyboardInterrupt


@contextmanager
def watch() -> Iterator[None]:
    """Record every SIGINT while the block runs (main thread only; elsewhere a no-op); `check()` inside the block
    raises for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _seen.clear()
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous_handler = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: object) -> None:
        _seen.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
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
            if signal.SIGINT.value in data:
                _seen.set()

    thread = threading.Thread(target=read, name="longeval-sigint", daemon=True)
    thread.start()
    try:
        yield
    finally:
        _seen.clear()  # a Ctrl-C belongs to the block it ended: later work in this process runs normally
        stop.set()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous_handler)
        thread.join(timeout=2)
        reader.close()
        writer.close()

