"""The record of one incident (a pause, a restart, a cut connection) that drills shade on their charts."""

from __future__ import annotations

import time
from dataclasses import dataclass


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds, as run phases are kept."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Outage:
    """One incident, with its window in epoch milliseconds.

    Attributes
    ----------
    kind
        ``"pause"`` (broker process frozen), ``"restart"`` (SIGTERM, then started again), ``"kill"`` (SIGKILL,
        then started again), ``"cut"`` (every proxied connection aborted, new ones refused) or ``"freeze"``
        (proxied connections held open with no byte passing).
    down_ms
        When the broker stopped serving: the signal was sent, the connections cut or frozen.
    up_ms
        When it served again: SIGCONT sent, the restarted broker answered a metadata request, the proxy
        accepted or passed bytes again.
    kept_data
        False if the broker came back without the records, topics, offsets and producer ids it had.
    """

    kind: str
    down_ms: int
    up_ms: int
    kept_data: bool = True

    @property
    def duration_s(self) -> float:
        """Seconds from down to up."""
        return (self.up_ms - self.down_ms) / 1000.0
