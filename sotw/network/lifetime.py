"""The networks this process has open, closed at exit and on SIGTERM, and the machine-wide start lock.

A ``with`` block closes its network on any exception, Ctrl-C's ``KeyboardInterrupt`` included. What else ends
a process is handled here: a normal exit (``atexit``) and SIGTERM, which by default ends Python without
running ``atexit``. A SIGKILL cannot be handled: the next start removes what it left (``sotw.network.names``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: Held while a network chooses its subnet and tag and removes leftovers, so two starting at once do not
#: take the same subnet or remove each other's half-made parts.
LOCK_PATH = "/run/sotw-network.lock"


class Closeable(Protocol):
    """What this module closes: a network."""

    def close(self) -> None:
        """Remove what it made (idempotent)."""


_open: set[Closeable] = set()
_lock = threading.Lock()
_at_exit = False
_on_term = False
_previous_sigterm: Any = None


def keep(network: Closeable) -> None:
    """Close ``network`` at exit or on SIGTERM unless it is released first."""
    global _at_exit
    with _lock:
        _open.add(network)
        if not _at_exit:
            atexit.register(close_all)
            _at_exit = True
    _handle_sigterm()


def release(network: Closeable) -> None:
    """Forget ``network`` (it was closed)."""
    with _lock:
        _open.discard(network)


def close_all() -> None:
    """Close every network this process has open; one failing does not keep the others open."""
    with _lock:
        networks = list(_open)
    for network in networks:
        try:
            network.close()
        except Exception:
            log.exception("closing a network failed")


def _handle_sigterm() -> None:
    """Close the open networks on SIGTERM, then do what the previous handler did (by default: die of it).

    Python installs signal handlers from the main thread only; a process that ignores SIGTERM keeps doing so.
    """
    global _on_term, _previous_sigterm
    if _on_term or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return
    _previous_sigterm = previous
    signal.signal(signal.SIGTERM, _on_sigterm)
    _on_term = True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    close_all()
    if callable(_previous_sigterm):
        _previous_sigterm(signum, frame)
        return
    # Die of SIGTERM, as the default would have: the exit status tells the parent what happened.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Hold the machine-wide lock of network starts (``LOCK_PATH``)."""
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
