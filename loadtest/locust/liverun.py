"""One Locust run in the harness process: ``LocustRun``, the Locust host of ``loadtest.run.driver.RunDriver``.

A Locust run is the run ``sotw run`` makes (the driver's: the job's parts, sampler, phases, incidents, the
verification of the whole run, ``results.json`` and the report); what it supplies is what differs. The load
is the Locust fleet, whose controls and counters are relayed from the Locust processes
(``loadtest.locust.relay``); progress leaves as JSON events for the web UI (phases, samples with lag per
topic, the live verifier's running totals, the verification's steps after Stop, the verdict); and Locust's
Stop ends the load (``stop_load``, then ``finish``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from loadtest.correctness.liveverify import LiveVerifier
from loadtest.errors import HarnessError
from loadtest.locust.fleetplan import LiveConfig
from loadtest.locust.headless import CORRECTNESS_COUNTS
from loadtest.locust.lines import Events
from loadtest.locust.relay import FleetRelay, LocustStage
from loadtest.measure.lag import KafkaLagProbe
from loadtest.measure.samplers import Probe
from loadtest.reports.report import ReportPaths
from loadtest.reports.results import Results
from loadtest.run.driver import VERIFY, PidsOf, RunDriver, RunSetup
from loadtest.run.job import JobParts, job_parts
from loadtest.run.phases import DRAIN, SETTLE, STEADY
from loadtest.run.processes import AttachedPipeline, PipelineProcess
from loadtest.run.profile import Profile
from loadtest.run.stage import LocalControl, RunStage, SimulatorControls
from sotw.broker import LocalBroker
from sotw.kafka import KafkaConfig

#: How much later than its session's end a late copy may still be sent, besides the longest delay (ms).
LATE_MARGIN_MS = 2000

log = logging.getLogger(__name__)


class Session(Protocol):
    """What a run takes from the Locust session that holds it (``loadtest.locust.live.Session``).

    Named here so that the run does not import the session that imports it.
    """

    config: LiveConfig
    events: Events
    profile: Profile
    dir: Path
    prefix: str
    broker: LocalBroker | None
    control: LocalControl | None
    #: A process that serves every run of the session (sotw's own pipeline, or a job attached to), if any.
    pipeline: PipelineProcess | None
    #: The prefix that starts a job in the pipeline's namespace (``--netns``), else empty.
    where: tuple[str, ...]

    @property
    def kafka(self) -> KafkaConfig:
        """The cluster the session's broker serves."""


def run_job(session: Session, run_dir: Path, prefix: str) -> tuple[JobParts | None, bool]:
    """The run's job and whether the run starts and stops it.

    A team's command (``--pipeline-cmd``) is started for each run, with the run's placeholders, so its
    output holds only the run's data; sotw's own pipeline (a JVM to start) and a job attached to serve every
    run of the session, and the run reads only its own topics of their output. Without either, no job.
    """
    spec = session.config.job
    if session.pipeline is not None:
        return job_parts(spec, session.profile, session.kafka, run_dir, prefix, (), session.pipeline), False
    if spec is not None and spec.command is not None:
        return job_parts(spec, session.profile, session.kafka, run_dir, prefix, (), where=session.where), True
    return None, False


def drain_detail(row: Mapping[str, Any], elapsed_s: float, limit_s: float) -> str:
    """The drain's progress in words, from the sampler's last row."""
    offsets, age = row.get("lag_offsets"), row.get("lag_age_s")
    behind = "lag not measured yet" if offsets is None else f"{int(offsets):,} offsets behind"
    if offsets and age is not None:
        behind += f", the oldest {float(age):.1f} s old"
    return f"{behind}; {elapsed_s:.0f} s of at most {limit_s:g} s"


class LocustRun(RunDriver):
    """One Locust run (from its start to its stop): the driver's run, with the Locust fleet as its load."""

    reports_each_run = True

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.events = session.events
        run_dir = session.dir / name
        if run_dir.exists() and any(run_dir.iterdir()):
            raise HarnessError(f"run directory {run_dir} is not empty; choose a new one")
        run_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"{session.prefix}{name}-"
        self.relay = FleetRelay(self.events)
        self._ended = threading.Event()
        self._steady_load: list[float] = []
        job, owns = run_job(session, run_dir, prefix)
        broker = session.broker
        setup = RunSetup(
            session.profile,
            run_dir,
            session.kafka,
            prefix,
            job,
            owns_job=owns,
            incidents=session.profile.incidents,
            broker=session.control,
            broker_pids=lambda: (list(broker.pids.values()) or None) if broker else None,
        )
        super().__init__(setup)
        self.lag = job.probes.get("lag") if job is not None else None
        self.verifier = self._verifier()

    # ------------------------------------------------------------------------------------ the load

    def controls(self) -> SimulatorControls:
        """The fleet's controls, sent to the Locust processes' simulators."""
        return self.relay

    def load_probe(self) -> Probe:
        """The fleet's counters, as the Locust side reports them, with the users' load."""
        return self.relay

    def make_stage(self) -> RunStage:
        """The fleet, the job and the broker; a job the session did not start is out of incidents' reach."""
        return LocustStage(
            self.relay,
            self.pipe,
            self.setup.broker,
            self.profile,
            1.0,
            external=self.pipe is None or isinstance(self.pipe, AttachedPipeline),
            topic_prefix=self.prefix,
        )

    def process_pids(self) -> dict[str, PidsOf]:
        """The Locust process (its children are the simulators and this process) and the simulators."""
        master = self.session.config.master_pid
        return {"harness": lambda: master or None, "simulator": lambda: self.relay.pids or None}

    def load_factor(self) -> float:
        """The load the users made over the steady phase, on average."""
        load = self._steady_load
        return sum(load) / len(load) if load else self.relay.load

    def _verifier(self) -> LiveVerifier | None:
        """The verifier of the UI's running totals: it reads sotw's Parquet layout of the full contract."""
        if self.job is None or self.job.output.contract != "full" or self.job.output.format == "delta":
            return None
        faults = [self.profile.simulator.faults, *self.profile.simulator.sensor_faults.values()]
        p = self.profile.pipeline
        return LiveVerifier(
            self.run_dir,
            self.job.output.path,
            self.prefix,
            p.verifier_policy(timeouts_expire=True),
            self.kafka,
            late_ms=int(max(f.delay_max_ms for f in faults)) + LATE_MARGIN_MS,
            timeout_ms=p.session_timeout_ms + 3 * p.trigger_ms + 30_000,
        )

    # ------------------------------------------------------------------------------------ running

    def begin(self, first_sample_s: float = 0.0) -> None:
        """Start measuring and the warm-up; the phases and samples go out as events from here on."""
        super().begin(first_sample_s)
        threading.Thread(target=self._watch, name="sotw-live-watch", daemon=True).start()
        if self.verifier is not None:
            threading.Thread(target=self._verify_loop, name="sotw-live-verify", daemon=True).start()

    def _watch(self) -> None:
        """The driver's look at the run a few times a second; each new sample sent on."""
        sent = 0
        while not self._ended.wait(0.25):
            self.tick(may_steady=not self.relay.stopping)
            if self.life.current == STEADY and self.sampler.rows and not self.relay.stopping:
                self._steady_load.append(float(self.sampler.rows[-1].get("load", 0.0)))
            rows = self.sampler.rows
            if len(rows) > sent:
                topics = self.lag.topics if isinstance(self.lag, KafkaLagProbe) else {}
                self.events.send(
                    "sample",
                    row=rows[-1],
                    topics=[{"topic": t, "offsets": n, "age_s": age} for t, (n, age) in topics.items()],
                )
                sent = len(rows)

    def _verify_loop(self) -> None:
        while not self._ended.wait(self.session.config.verify_every_s):
            self.verify_now()

    def verify_now(self) -> None:
        """One pass of the live verifier, sent on as a ``correctness`` event."""
        if self.verifier is None:
            return
        try:
            totals = self.verifier.step()
        except Exception as exc:  # a pass that fails (a file moved under it) must not end the run
            log.warning("live verification pass failed: %s", exc)
            return
        self.events.send("correctness", live=totals.to_dict(), latency=self.verifier.latency_windows())

    # ------------------------------------------------------------------------------------ the end

    def stop_load(self) -> None:
        """Locust stops the users: the load is over and the drain begins (as when ``sotw run`` stops its simulator)."""
        self.relay.stop_load()
        self.life.end_load()

    def finish(self, interrupted: bool, command: str = "") -> Results:
        """The simulators have stopped: drain, settle, verify the whole run and write its results and report."""
        self._ended.set()
        self.setup = dataclasses.replace(self.setup, command=command)
        self.stop_load()
        return super().finish(interrupted)

    def quit(self) -> None:
        """The session ends: cut the waits after the load short and stop the run's threads."""
        self.stop.set()
        self._ended.set()

    # ------------------------------------------------------------------------------------ progress

    def on_phase(self, name: str) -> None:
        """A ``phase`` event."""
        self.events.send("phase", name=name, at_ms=int(time.time() * 1000))

    def on_pipeline_failed(self, message: str) -> None:
        """A ``pipeline_failed`` event: the Locust side ends the run."""
        self.events.send("pipeline_failed", message=message)

    def say(self, line: str) -> None:
        """A ``note`` event: the Locust side logs it and shows it in the UI's messages."""
        self.events.send("note", message=line)

    def on_step(self, step: str, detail: str) -> None:
        """Where the verification after the stop is (a ``progress`` event for the UI's Correctness tab)."""
        self.progress(step, detail)

    def progress(self, step: str, detail: str, **fields: Any) -> None:
        """A ``progress`` event: ``step`` of the end of the run, ``detail`` in words."""
        self.events.send("progress", step=step, detail=detail, **fields)

    def watch(self, phase: str, limit_s: float) -> AbstractContextManager[None]:
        """A ``progress`` event a second while the drain or the settle waits, saying how far it is."""
        p = self.profile.pipeline
        settle_s = (p.session_timeout_ms + 3 * p.trigger_ms) / 1000.0
        details: dict[str, Callable[[float], str]] = {
            DRAIN: lambda elapsed: drain_detail(
                self.sampler.rows[-1] if self.sampler.rows else {}, elapsed, limit_s
            ),
            SETTLE: lambda elapsed: (
                "sessions the load left open time out in the pipeline: "
                f"{max(0.0, settle_s - elapsed):.0f} s left"
            ),
        }
        return self.ticking(phase, details[phase], limit_s)

    @contextlib.contextmanager
    def ticking(self, step: str, detail: Callable[[float], str], limit_s: float) -> Iterator[None]:
        """A ``progress`` event for ``step`` once a second while the body runs (``detail`` of its seconds)."""
        done = threading.Event()
        begun = time.monotonic()

        def tick() -> None:
            while True:
                elapsed = time.monotonic() - begun
                self.progress(step, detail(elapsed), elapsed_s=round(elapsed, 1), limit_s=limit_s)
                if done.wait(1.0):
                    return

        thread = threading.Thread(target=tick, name=f"sotw-live-{step}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(2.0)

    def on_load_over(self) -> None:
        """The live verifier's last pass: the UI's and the CSV's latency windows up to the end."""
        if self.verifier is not None:
            self.progress(VERIFY, "the live verifier's last pass (latency up to the end)")
            self.verify_now()

    def on_results(self, results: Results, report: ReportPaths | None) -> None:
        """A ``results`` event: the verdict, its reasons and the final counts, for the UI and the CSV."""
        c = results.correctness
        self.events.send(
            "results",
            run_dir=str(self.run_dir),
            results=str(self.run_dir / "results.json"),
            report=str(report.html) if report is not None else None,
            verdict=results.verdict.verdict,
            reasons=results.verdict.reasons,
            # The final counts, for the UI's Correctness tab.
            correctness={k: getattr(c, k) for k in ("passed", *CORRECTNESS_COUNTS)} if c is not None else {},
        )
