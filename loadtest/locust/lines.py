"""JSON lines between a Locust process and the helper processes it drives (``loadtest.locust.feeder``, ``loadtest.locust.live``).

Locust runs on gevent, which patches threads, locks and sockets; the simulator, Kafka's admin client and
Spark's helpers need real threads. So the Locust side only starts these helpers and talks to them through
their standard streams, one JSON object per line: commands in (``{"op": ...}``), events out
(``{"event": ...}``). Both halves are here: ``Events`` and ``commands`` for the helpers, ``Child`` for the
Locust side (gevent is imported, never patched in, so the helpers keep real threads).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import gevent
from gevent import subprocess
from gevent.event import Event

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


EventHandler = Callable[[dict[str, Any]], None]


class Child:
    """A running ``python -m MODULE ARGS...`` whose events go to ``on_event``, one call per line.

    Parameters
    ----------
    module, args
        What to run with the same Python.
    on_event
        Called (in a greenlet) with each event; an exception it raises is logged, not propagated.
    log_path
        Where the helper's standard error (its log) goes.
    """

    def __init__(self, module: str, args: Sequence[str], on_event: EventHandler, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.name = module.rsplit(".", 1)[-1]
        self.exited = Event()
        self._on_event = on_event
        with log_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        self._reader = gevent.spawn(self._read)

    @property
    def pid(self) -> int:
        """The helper's process id."""
        return int(self.proc.pid)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                text = line.strip()
                if not text.startswith("{"):
                    continue  # not an event (a library printing to standard output)
                try:
                    event = json.loads(text)
                except ValueError:
                    continue
                try:
                    self._on_event(event)
                except Exception:
                    log.exception("%s: handling %s failed", self.name, event.get("event"))
        finally:
            self.exited.set()

    def send(self, op: str, **fields: Any) -> None:
        """Send one command; a helper that is gone is not an error here (its exit is reported)."""
        self.send_message({"op": op, **fields})

    def send_message(self, message: Mapping[str, Any]) -> None:
        """Send a command already built."""
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.write(encode(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def close_input(self) -> None:
        """Close its standard input: the helper takes that as the end."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def wait(self, timeout: float) -> int | None:
        """Wait for it to exit (at most ``timeout`` seconds); its exit code, or None if it still runs."""
        try:
            return int(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return None

    def end(self, timeout: float) -> int | None:
        """Close its input, wait ``timeout`` seconds, then terminate it and, if it must, kill it."""
        self.close_input()
        code = self.wait(timeout)
        if code is None:
            log.warning("%s did not end within %g s; terminating it", self.name, timeout)
            self.proc.terminate()
            code = self.wait(10)
            if code is None:
                self.proc.kill()
                code = self.wait(10)
        self.exited.wait(5)
        return code
