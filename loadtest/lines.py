"""JSON lines between a Locust process and the helper processes it drives (``loadtest.feeder``, ``loadtest.live``).

Locust runs on gevent, which patches threads, locks and sockets; the simulator, Kafka's admin client and
Spark's helpers need real threads. So the Locust side only starts these helpers and talks to them through
their standard streams, one JSON object per line: commands in (``{"op": ...}``), events out
(``{"event": ...}``). This module is the helpers' half; it imports nothing from Locust or gevent.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import IO, Any

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None, so that any JSON parser (a browser's) reads it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def encode(message: Mapping[str, Any]) -> str:
    """One line of JSON (no newline)."""
    return json.dumps(plain(message), separators=(",", ":"), allow_nan=False)


class Events:
    """Writes events, one JSON object per line, from any thread.

    Parameters
    ----------
    stream
        Where to write (the helper's standard output).
    """

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        """Write ``{"event": event, **fields}``; a closed stream (the Locust process is gone) is ignored."""
        line = encode({"event": event, **fields})
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass


def commands(stream: IO[str] | None = None) -> Iterator[dict[str, Any]]:
    """The commands read from ``stream`` (standard input) until it closes; a line that is not one is logged."""
    for line in stream or sys.stdin:
        text = line.strip()
        if not text:
            continue
        try:
            message = json.loads(text)
        except ValueError:
            log.warning("ignoring a line that is not JSON: %.80s", text)
            continue
        if isinstance(message, dict) and isinstance(message.get("op"), str):
            yield message
        else:
            log.warning("ignoring a line without an op: %.80s", text)
