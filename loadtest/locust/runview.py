"""What the Locust side keeps of a run and of each process with users.

The run's samples, correctness and progress for the web UI, and each part's counters.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gevent.event import Event

#: Samples kept for the web UI (five minutes).
SAMPLES_KEPT = 300


@dataclass
class Part:
    """One process's simulator, as the master knows it."""

    name: str
    client_id: str | None  # None: this process
    stats: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    users: int = 0
    stopped: Event = field(default_factory=Event)


@dataclass
class RunView:
    """What the UI shows of the current (or last) run."""

    index: int
    run_dir: str
    prefix: str
    started_ms: int
    phase: str = "warmup"
    steady_started: float | None = None  # monotonic
    samples: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    topics: list[dict[str, Any]] = field(default_factory=list)
    correctness: dict[str, Any] = field(default_factory=dict)
    latency: list[dict[str, Any]] = field(default_factory=list)
    messages: deque[str] = field(default_factory=lambda: deque(maxlen=50))
    finishing: bool = False
    finished: Event = field(default_factory=Event)
    verdict: dict[str, Any] = field(default_factory=dict)
    gate_failures: list[str] = field(default_factory=list)
    stopped_ms: int | None = None  # when Locust stopped the run: its verification begins
    # The verification's step after the stop, as the conductor and the harness report it.
    progress: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the verification ended without a verdict

    def note_progress(self, step: str, detail: str, **fields: Any) -> None:
        """The verification after the stop is at ``step`` (``detail`` says what it does there, in words)."""
        self.progress = {"step": step, "detail": detail, "at_ms": int(time.time() * 1000), **fields}

    def verification(self) -> dict[str, Any]:
        """What the UI shows of the verification after the stop: its state, step, detail and timing."""
        if self.stopped_ms is None:
            state = "not stopped"
        elif self.error is not None:
            state = "failed"
        elif self.verdict.get("verdict"):
            state = "done"
        else:
            state = "running"
        now = int(time.time() * 1000)
        return {
            "state": state,
            **self.progress,
            "since_stop_s": (now - self.stopped_ms) / 1000.0 if self.stopped_ms is not None else None,
            "error": self.error,
        }
