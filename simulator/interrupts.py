"""Ctrl-C held back over the few lines that move delivery reports from the client into the ledger.

A KeyboardInterrupt lands between any two bytecodes of the main thread. Landing after reports were taken out of
the client's log and before the ledger has them, it would lose them: records on the topics that the ledger does
not show acknowledged. Inside ``held_interrupts()`` a SIGINT is remembered, and raised as the block ends, so the
reports reach the ledger first and the run still stops where the user asked.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_holding = False


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold SIGINT back until the block ends (in the main thread; elsewhere, and nested, it changes nothing)."""
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    _holding = True
    try:
        yield
    finally:
        _holding = False
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
