"""A run's lifecycle: its phases as one small state machine, driven alike by ``sotw run`` and a Locust run.

``sotw run``, ``bench``, ``drill`` and ``capacity`` (loadtest.run.runner) and a Locust run (loadtest.locust.live) walk
the same phases (``PHASES``) through one ``Lifecycle``: the warm-up ends when the pipeline is warm, fault
windows switch on the profile's schedule, a pipeline that exits on its own is caught the same way, the drain
ends when the lag is zero twice in a row, and quiet sessions are given their timeout to close. What differs
is only who ends the load (the runner after the steady phase, Locust's Stop) and how progress is shown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.correctness.stops import JobExit, last_error
from loadtest.gameday.recovery import Stop
from loadtest.measure.samplers import Sampler
from loadtest.reports.results import Phase
from loadtest.run.processes import AttachedPipeline, PipelineProcess
from loadtest.run.profile import Profile
from loadtest.run.stage import RunStage, SimulatorControls

log = logging.getLogger(__name__)

SETUP, WARMUP, STEADY, DRAIN, SETTLE = "setup", "warmup", "steady", "drain", "settle"
PHASES = (SETUP, WARMUP, STEADY, DRAIN, SETTLE)
"""The phases in their order; samples are tagged with the one under way, results list each one's bounds."""


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
        return True  # measure anyway; the lag will tell (``behind`` says so)
    return caught_up(sampler, settings)


def caught_up(sampler: Sampler, settings: Any) -> bool:
    """Whether the last sample shows the pipeline consuming, its lag age within half the profile's ``max_lag_s``."""
    if not sampler.rows:
        return False
    last = sampler.rows[-1]
    return bool(last.get("consumed", 0) > 0 and last.get("lag_age_s", 0.0) <= settings.max_lag_s / 2)


def behind(sampler: Sampler, settings: Any, elapsed: float) -> str | None:
    """Why the steady phase begins with a backlog, or None when the pipeline caught up in the warm-up.

    A pipeline that never caught up (a machine shared with other work, a load beyond its capacity) turns a
    drill into a capacity test: its session timeouts run on processing time, so a lag past them closes
    sessions early and their later rows count as lost. The progress line says so before any incident.
    """
    if caught_up(sampler, settings):
        return None
    last = sampler.rows[-1] if sampler.rows else {}
    if not last.get("consumed", 0):
        return f"the pipeline had consumed nothing after {elapsed:.0f} s of load"
    return (
        f"the pipeline had not caught up after {elapsed:.0f} s of load (lag age {last.get('lag_age_s', 0.0):.0f} s,"
        f" over half the profile's max_lag_s of {settings.max_lag_s:g} s); measuring from a backlog"
    )


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


def _no_watch(step: str, limit_s: float) -> AbstractContextManager[None]:
    return nullcontext()


class Lifecycle:
    """One run's phases: setup, warm-up, steady, drain, settle, each entered once and in that order.

    The load starts with ``start_load`` (warm-up). While it runs, ``tick`` is called a few times a second: it
    switches the profile's fault windows, enters the steady phase once the warm-up has lasted its time and the
    pipeline is warm, and notices a pipeline that exited on its own. ``end_load`` enters the drain whoever
    ended the load; ``wind_down`` waits for the pipeline to catch up and then for quiet sessions to time out;
    ``finish`` closes the last phase and notices a pipeline that exited during it.

    Parameters
    ----------
    profile
        The run's profile: its phase lengths, fault windows, session timeout and trigger.
    sampler
        The run's sampler: the warm-up and the drain end on its lag figures.
    controls
        Where the fault windows are switched (the simulator, or a Locust run's fleet).
    stage
        The incidents' stage: a pipeline it took down on purpose has not failed.
    pipe
        The pipeline process the harness started, or None for one it only attached to.
    on_phase
        Called with each phase's name as it is entered (progress lines, the UI's events).
    on_pipeline_failed
        Called once with the message when the pipeline exits on its own during the load.
    clock
        The run's clock, when it started before the lifecycle (the broker's start counts as set-up).
    """

    def __init__(
        self,
        profile: Profile,
        sampler: Sampler,
        controls: SimulatorControls,
        stage: RunStage,
        pipe: PipelineProcess | None,
        on_phase: Callable[[str], None] = lambda name: None,
        on_pipeline_failed: Callable[[str], None] = lambda message: None,
        clock: PhaseClock | None = None,
    ) -> None:
        self.profile, self.sampler, self.controls, self.stage, self.pipe = (
            profile,
            sampler,
            controls,
            stage,
            pipe,
        )
        self.on_phase, self.on_pipeline_failed = on_phase, on_pipeline_failed
        self.clock = clock if clock is not None else PhaseClock(started_ms=int(time.time() * 1000))
        self.pipeline_failed: str | None = None
        self.stopped: Stop | None = None
        #: Why the steady phase began with a backlog (``behind``), or None.
        self.behind: str | None = None
        self._lock = threading.Lock()
        self._load_start = self._steady_start = 0.0
        self._windows: set[int] = set()

    @property
    def current(self) -> str:
        """The phase under way."""
        return self.clock.current

    def _enter(self, name: str, only_from: tuple[str, ...]) -> bool:
        with self._lock:
            if self.clock.current not in only_from:
                return False
            self.clock.enter(name)
        self.on_phase(name)
        return True

    def start_load(self) -> None:
        """The load starts: the warm-up begins."""
        self._load_start = time.monotonic()
        self._enter(WARMUP, (SETUP,))

    def tick(self, may_steady: bool = True) -> bool:
        """One look at the run while the load runs; True when the steady phase began at it.

        ``may_steady`` False holds the warm-up (a Locust run whose users are stopping).
        """
        elapsed = time.monotonic() - self._load_start
        apply_schedule(self.profile, self.controls, elapsed, self._windows)
        began = False
        settings = self.profile.run
        if self.current == WARMUP and elapsed >= settings.warmup_s and may_steady:
            if pipeline_warm(self.sampler, elapsed, settings):
                self.behind = behind(self.sampler, settings, elapsed)
                if self._enter(STEADY, (WARMUP,)):
                    self._steady_start = time.monotonic()
                    began = True
        if self.pipe is not None and not self.pipe.alive() and not self.stage.pipeline_down_on_purpose:
            self._pipeline_exited(" during the load")
        return began

    def steady_over(self) -> bool:
        """Whether the steady phase has lasted the profile's ``steady_s``."""
        return self.current == STEADY and time.monotonic() - self._steady_start >= self.profile.run.steady_s

    def end_load(self) -> None:
        """The load has stopped (the runner's steady phase is over, Locust's Stop, Ctrl-C): the drain begins."""
        self._enter(DRAIN, (WARMUP, STEADY))

    def wind_down(
        self,
        stop: threading.Event,
        watch: Callable[[str, float], AbstractContextManager[None]] = _no_watch,
    ) -> float | None:
        """Drain, then settle; the seconds the drain took, or None (not caught up, stopped, or no pipeline).

        ``watch(phase, limit_s)`` wraps each wait (the UI's progress ticks). Nothing is waited for once the
        pipeline has failed or ``stop`` is set.
        """
        self.end_load()
        pipe, settings = self.pipe, self.profile.run
        if pipe is None or self.pipeline_failed is not None or stop.is_set():
            return None
        with watch(DRAIN, settings.drain_max_s):
            drain_s = drain(self.sampler, pipe, settings.drain_max_s, stop)
        if drain_s is None or stop.is_set():
            return drain_s
        # Sessions without an ``end`` (abandoned) close only when their timeout passes: wait for it.
        self._enter(SETTLE, (DRAIN,))
        p = self.profile.pipeline
        with watch(SETTLE, (p.session_timeout_ms + 3 * p.trigger_ms) / 1000.0):
            settle(self.profile, pipe, stop)
        return drain_s

    def finish(self) -> None:
        """Close the last phase; a pipeline that exited on its own by now has failed (before it is stopped)."""
        self.clock.close()
        if self.pipe is not None and not self.pipe.alive():
            self._pipeline_exited("")

    def job_exit(self) -> JobExit | None:
        """How the job ended, for the verifier: on its own or stopped by the harness, its code, its last error.

        None for a job the harness attached to: it neither started nor stopped it.
        """
        pipe = self.pipe
        if pipe is None or isinstance(pipe, AttachedPipeline):
            return None
        return JobExit(self.pipeline_failed is not None, pipe.returncode(), last_error(pipe.log_path))

    def _pipeline_exited(self, when: str) -> None:
        if self.pipeline_failed is not None or self.pipe is None:
            return
        tail = self.pipe.tail(2)
        self.pipeline_failed = f"the pipeline exited with code {self.pipe.returncode()}{when}: {tail}"
        self.stopped = Stop(int(time.time() * 1000), tail)
        if when:
            self.on_pipeline_failed(self.pipeline_failed)
