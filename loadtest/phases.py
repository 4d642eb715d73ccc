"""The steps of a run's phases, shared by ``sotw run`` (loadtest.runner) and a Locust run (loadtest.live).

Both walk the same phases -- warm-up, steady, drain, settle -- and take these steps the same way: when the
pipeline counts as warm, when the schedule's fault windows switch, when the drain has caught up, how long quiet
sessions are given to time out, how many data-loss reports the pipeline's log holds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.processes import PipelineProcess
from loadtest.profile import Profile
from loadtest.results import Phase
from loadtest.samplers import Sampler
from loadtest.stage import SimulatorControls

log = logging.getLogger(__name__)


@dataclass
class PhaseClock:
    """Phase boundaries in epoch ms, filled in as the run goes; ``current`` names the phase samples are tagged with."""

    started_ms: int = 0
    phases: list[Phase] = field(default_factory=list)
    current: str = "setup"

    def enter(self, name: str) -> None:
        """End the phase under way now and start ``name``."""
        now = int(time.time() * 1000)
        if self.phases and self.phases[-1].end_ms == 0:
            last = self.phases[-1]
            self.phases[-1] = Phase(last.name, last.start_ms, now)
        self.phases.append(Phase(name, now, 0))
        self.current = name

    def close(self) -> None:
        """End the last phase now (the run is over)."""
        if self.phases and self.phases[-1].end_ms == 0:
            last = self.phases[-1]
            self.phases[-1] = Phase(last.name, last.start_ms, int(time.time() * 1000))


def pipeline_warm(sampler: Sampler, elapsed: float, settings: Any) -> bool:
    """True once the pipeline has consumed data and caught up with the warm-up's backlog.

    Its first batches compile and start Python workers, so it falls behind first; measuring from there would
    count that backlog against the steady phase.
    """
    if elapsed >= settings.warmup_s + settings.pipeline_start_timeout_s:
        return True  # measure anyway; the lag will tell
    if not sampler.rows:
        return False
    last = sampler.rows[-1]
    return bool(last.get("consumed", 0) > 0 and last.get("lag_age_s", 0.0) <= settings.max_lag_s / 2)


def data_loss_reports(log_path: Path) -> int:
    """How many times the pipeline reported data the broker no longer had (its "Kafka data lost" lines)."""
    try:
        with log_path.open(errors="replace") as lines:
            return sum(1 for line in lines if "Kafka data lost" in line)
    except OSError:
        return 0


def apply_schedule(profile: Profile, simulator: SimulatorControls, elapsed: float, applied: set[int]) -> None:
    """Switch scheduled fault windows on and off (each edge once)."""
    for i, window in enumerate(profile.schedule):
        if elapsed >= window.start_s and 2 * i not in applied:
            applied.add(2 * i)
            log.info("fault window %d on: %s", i, window.faults)
            simulator.set_faults(window.faults)
        if elapsed >= window.end_s and 2 * i + 1 not in applied:
            applied.add(2 * i + 1)
            simulator.set_faults(profile.simulator.faults)


def drain(sampler: Sampler, pipe: PipelineProcess, limit_s: float, stop: threading.Event) -> float | None:
    """Seconds until the pipeline had consumed everything (two samples in a row at zero lag), or None."""
    start = time.monotonic()
    seen = len(sampler.rows)
    zero_in_a_row = 0
    while time.monotonic() - start < limit_s and not stop.is_set() and pipe.alive():
        time.sleep(0.5)
        for row in sampler.rows[seen:]:
            zero_in_a_row = zero_in_a_row + 1 if row.get("lag_offsets", 1) == 0 else 0
        seen = len(sampler.rows)
        if zero_in_a_row >= 2:
            return time.monotonic() - start
    return None


def settle(profile: Profile, pipe: PipelineProcess, stop: threading.Event) -> None:
    """Wait for the session timeout plus two triggers, so sessions left open by the load are closed."""
    timeout_ms = profile.pipeline.session_timeout_ms
    trigger_ms = profile.pipeline.trigger_ms
    deadline = time.monotonic() + (timeout_ms + 3 * trigger_ms) / 1000.0
    while time.monotonic() < deadline and not stop.is_set() and pipe.alive():
        time.sleep(0.25)
