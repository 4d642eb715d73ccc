"""A helper process driven from a Locust process: JSON lines to its standard input, events from its output.

The Locust side of ``loadtest.lines``. It runs on gevent (Locust's), so reading the helper's output is a
greenlet and never holds up Locust's web UI or its stats loop.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gevent
from gevent import subprocess
from gevent.event import Event

from loadtest.lines import encode

log = logging.getLogger(__name__)

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
