"""Starting and stopping real Locust processes with sotw's locustfile, for the Locust tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locust" / "locustfile.py"


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: Sequence[str], log: Path, sotw: bool = False) -> subprocess.Popen[bytes]:
    """``locust -f loadtest/locust/locustfile.py ARGS`` (or ``sotw locust ARGS``), its output to ``log``."""
    command = (
        [sys.executable, "-m", "sotw", "locust", *args]
        if sotw
        else [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args]
    )
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}  # Locust needs its patch
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[bytes], timeout: float = 180.0) -> int:
    """SIGTERM (Locust quits: the run is verified and the harness stopped), then SIGKILL if it must; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(30)


def get_json(url: str) -> Any:
    """GET ``url`` and parse its JSON body."""
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a local test server
        return json.loads(response.read())


def wait_for(predicate: Any, timeout: float, what: str, log: Path | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` (and the log's tail)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except OSError:
            last = None
        if last:
            return last
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what} within {timeout:g} s\n{tail}")
