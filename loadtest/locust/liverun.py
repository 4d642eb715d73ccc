"""One Locust run in the harness, from Start to Stop: its lifecycle, sampler, live verifier, incidents and, after the stop, drain, settle and the verdict over the whole run."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from loadtest.correctness.expect import build_expectation, read_ledger, read_truth
from loadtest.correctness.liveverify import LiveVerifier
from loadtest.correctness.output import PipelineOutput, read_output
from loadtest.correctness.outputspec import OutputSpec
from loadtest.correctness.triage import Triager
from loadtest.correctness.values import read_snapshots
from loadtest.correctness.verify import verify
from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident
from loadtest.gameday.incidents import IncidentRecord, Schedule, incident_from_mapping
from loadtest.gameday.recovery import Stop
from loadtest.locust.fleetplan import LiveConfig
from loadtest.locust.headless import CORRECTNESS_COUNTS
from loadtest.locust.lines import Events
from loadtest.locust.relay import FleetRelay, LocustStage
from loadtest.measure import figures
from loadtest.measure.figures import Outcome
from loadtest.measure.lag import KafkaLagProbe
from loadtest.measure.outputs import OutputProbe, ProgressProbe
from loadtest.measure.samplers import ResourceProbe, Sampler
from loadtest.reports.report import write_report
from loadtest.reports.results import Correctness, Results
from loadtest.run.phases import DRAIN, SETTLE, STEADY, Lifecycle, PhaseClock, data_loss_reports
from loadtest.run.processes import AttachedPipeline, PipelineProcess
from loadtest.run.profile import Profile
from loadtest.run.stage import LocalControl
from sotw.broker import LocalBroker
from sotw.kafka import KafkaConfig, topic_pattern

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
    pipeline: PipelineProcess | None
    output: Path | None
    checkpoint: Path | None

    @property
    def kafka(self) -> KafkaConfig:
        """The cluster the session's broker serves."""


def run_output(output: PipelineOutput, prefix: str) -> PipelineOutput:
    """The part of a (shared) pipeline output that is about topics starting with ``prefix``."""

    def mine(frame: Any) -> Any:
        if frame.empty or "topic" not in frame:
            return frame
        return frame[frame["topic"].astype(str).str.startswith(prefix)].reset_index(drop=True)

    return dataclasses.replace(
        output,
        changes=mine(output.changes),
        sessions=mine(output.sessions),
        integrity=mine(output.integrity),
        dead_letters=mine(output.dead_letters),
    )


def verify_locust_run(
    run_dir: Path,
    output_root: Path,
    prefix: str,
    profile: Profile,
    kafka: KafkaConfig,
    timeouts_expire: bool,
    pipeline_stopped: bool,
    note: Callable[[str], None] | None = None,
) -> Correctness:
    """``loadtest.correctness.verify.verify_run`` over the union of the run's parts, restricted to the run's topics.

    ``note`` hears each step in words (the UI's progress).
    """
    say = note or (lambda _: None)
    say("reading the ledger and the truth")
    ledger = read_ledger(run_dir)
    expectation = build_expectation(
        profile.pipeline.verifier_policy(timeouts_expire=timeouts_expire),
        ledger,
        read_truth(run_dir),
        read_snapshots(run_dir),
    )
    say("reading the pipeline's output")
    output = run_output(read_output(output_root), prefix)
    say(f"checking {len(ledger):,} ledger rows against {len(output.changes):,} output rows, triage included")
    with Triager(ledger, kafka) as triager:
        return verify(expectation, output, triager, pipeline_stopped)


def drain_detail(row: Mapping[str, Any], elapsed_s: float, limit_s: float) -> str:
    """The drain's progress in words, from the sampler's last row."""
    offsets, age = row.get("lag_offsets"), row.get("lag_age_s")
    behind = "lag not measured yet" if offsets is None else f"{int(offsets):,} offsets behind"
    if offsets and age is not None:
        behind += f", the oldest {float(age):.1f} s old"
    return f"{behind}; {elapsed_s:.0f} s of at most {limit_s:g} s"


class Run:
    """One Locust run (from its start to its stop): phases, sampler, live verifier, incidents, verdict."""

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.events = session.events
        self.profile = session.profile
        self.run_dir = session.dir / name
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise HarnessError(f"run directory {self.run_dir} is not empty; choose a new one")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = f"{session.prefix}{name}-"
        self.clock = PhaseClock(started_ms=int(time.time() * 1000))
        self.relay = FleetRelay(self.events)
        self.stop = threading.Event()  # the session is quitting: cut the drain short
        self.stage = LocustStage(
            self.relay,
            session.pipeline,
            session.control,
            self.profile,
            1.0,
            external=isinstance(session.pipeline, AttachedPipeline),
            topic_prefix=self.prefix,
        )
        self._lock = threading.Lock()
        self.schedules: list[Schedule] = []
        self._ended = threading.Event()
        self._steady_load: list[float] = []
        self.lag = (
            KafkaLagProbe(session.kafka, topic_pattern(self.prefix), session.checkpoint)
            if session.checkpoint is not None
            else None
        )
        self.sampler = self._sampler()
        self.verifier = self._verifier()
        self.life = Lifecycle(
            self.profile,
            self.sampler,
            self.relay,
            self.stage,
            session.pipeline,
            on_phase=lambda name: self.events.send("phase", name=name, at_ms=int(time.time() * 1000)),
            on_pipeline_failed=lambda message: self.events.send("pipeline_failed", message=message),
            clock=self.clock,
        )

    @property
    def pipeline_failed(self) -> str | None:
        """Why the pipeline failed, if it exited on its own."""
        return self.life.pipeline_failed

    @property
    def stopped(self) -> Stop | None:
        """When the pipeline stopped on its own, and its last words."""
        return self.life.stopped

    def _sampler(self) -> Sampler:
        s, pipe = self.session, self.session.pipeline
        probes: dict[str, Any] = {"simulator": self.relay}
        if self.lag is not None:
            probes["lag"] = self.lag
        if s.output is not None:
            probes["output"] = OutputProbe(s.output)
            probes["progress"] = ProgressProbe(s.output / "progress.jsonl")
        probes["resources"] = ResourceProbe(
            {
                "broker": lambda: (list(s.broker.pids.values()) or None) if s.broker else None,
                "pipeline": lambda: (
                    pipe.pid if pipe is not None and pipe.proc is not None and pipe.alive() else None
                ),
                "harness": lambda: s.config.master_pid or None,
                "simulator": lambda: self.relay.pids or None,
            },
            alone=("harness",),  # the Locust process: its children are the simulators and this process
        )
        return Sampler(probes, self.run_dir / "samples.jsonl", phase=lambda: self.clock.current)

    def _verifier(self) -> LiveVerifier | None:
        s = self.session
        if s.output is None:
            return None
        faults = [self.profile.simulator.faults, *self.profile.simulator.sensor_faults.values()]
        return LiveVerifier(
            self.run_dir,
            s.output,
            self.prefix,
            self.profile.pipeline.verifier_policy(timeouts_expire=True),
            s.kafka,
            late_ms=int(max(f.delay_max_ms for f in faults)) + LATE_MARGIN_MS,
            timeout_ms=self.profile.pipeline.session_timeout_ms
            + 3 * self.profile.pipeline.trigger_ms
            + 30_000,
        )

    # ------------------------------------------------------------------------------------------ running

    def begin(self) -> None:
        """Start measuring: the sampler, the live verifier and the phase clock."""
        self.sampler.start()
        self.life.start_load()
        threading.Thread(target=self._watch, name="sotw-live-watch", daemon=True).start()
        if self.verifier is not None:
            threading.Thread(target=self._verify_loop, name="sotw-live-verify", daemon=True).start()

    def _watch(self) -> None:
        """Phases, the profile's fault windows and incidents, pipeline health; each new sample sent on."""
        sent = 0
        while not self._ended.wait(0.25):
            if self.life.tick(may_steady=not self.relay.stopping) and self.profile.incidents:
                self._schedule(self.profile.incidents)
            if self.life.current == STEADY and self.sampler.rows and not self.relay.stopping:
                self._steady_load.append(float(self.sampler.rows[-1].get("load", 0.0)))
            rows = self.sampler.rows
            if len(rows) > sent:
                topics = self.lag.topics if self.lag is not None else {}
                self.events.send(
                    "sample",
                    row=rows[-1],
                    topics=[{"topic": t, "offsets": n, "age_s": age} for t, (n, age) in topics.items()],
                )
                sent = len(rows)

    def _verify_loop(self) -> None:
        assert self.verifier is not None
        while not self._ended.wait(self.session.config.verify_every_s):
            self.verify_now()

    def verify_now(self) -> None:
        """One pass of the live verifier, sent on as a ``correctness`` event."""
        assert self.verifier is not None
        try:
            totals = self.verifier.step()
        except Exception as exc:  # a pass that fails (a file moved under it) must not end the run
            log.warning("live verification pass failed: %s", exc)
            return
        self.events.send("correctness", live=totals.to_dict(), latency=self.verifier.latency_windows())

    def _schedule(self, incidents: Sequence[Incident]) -> None:
        def note(line: str) -> None:
            self.events.send("incident", message=line)

        schedule = Schedule(incidents, self.stage, note)
        with self._lock:
            self.schedules.append(schedule)
        schedule.start()

    def fire(self, spec: Mapping[str, Any]) -> None:
        """Start one incident now (from the UI's controls)."""
        incident = incident_from_mapping({**spec, "at_s": 0.0}, where="incident from the UI")
        self._schedule([incident])

    @property
    def incident_records(self) -> list[IncidentRecord]:
        """Every incident so far, the profile's and the UI's."""
        with self._lock:
            return [r for s in self.schedules for r in s.records]

    # ------------------------------------------------------------------------------------------ the end

    def stop_load(self) -> None:
        """Locust stops the users: the load is over and the drain begins (as when ``sotw run`` stops its simulator)."""
        self.relay.stop_load()
        self.life.end_load()

    def progress(self, step: str, detail: str, **fields: Any) -> None:
        """Where the verification after the stop is (a ``progress`` event for the UI's Correctness tab)."""
        self.events.send("progress", step=step, detail=detail, **fields)

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

    def finish(self, interrupted: bool, command: str) -> Results:
        """Drain, settle, stop measuring, verify the whole run and write its results and report."""
        settings = self.profile.run
        self._ended.set()
        for schedule in list(self.schedules):
            schedule.stop()
        self.stop_load()
        p = self.profile.pipeline
        details: dict[str, Callable[[float], str]] = {
            DRAIN: lambda elapsed: drain_detail(
                self.sampler.rows[-1] if self.sampler.rows else {}, elapsed, settings.drain_max_s
            ),
            SETTLE: lambda elapsed: (
                "sessions the load left open time out in the pipeline: "
                f"{max(0.0, (p.session_timeout_ms + 3 * p.trigger_ms) / 1000.0 - elapsed):.0f} s left"
            ),
        }
        drain_s = None
        if not interrupted:
            drain_s = self.life.wind_down(
                self.stop, lambda phase, limit_s: self.ticking(phase, details[phase], limit_s)
            )
            interrupted = self.stop.is_set()
        if self.verifier is not None:
            self.progress("verify", "the live verifier's last pass (latency up to the end)")
            self.verify_now()  # the latency windows up to the end, for the UI and the CSV
        self.life.finish()
        self.sampler.stop()
        self.events.send("phase", name="verify", at_ms=int(time.time() * 1000))
        return self._results(interrupted, drain_s, command)

    def _results(self, interrupted: bool, drain_s: float | None, command: str) -> Results:
        s = self.session
        cpu0 = time.process_time()
        if s.output is not None:
            correctness = verify_locust_run(
                self.run_dir,
                s.output,
                self.prefix,
                self.profile,
                s.kafka,
                timeouts_expire=not interrupted and drain_s is not None,
                pipeline_stopped=self.pipeline_failed is not None,
                note=lambda detail: self.progress("verify", detail),
            )
        else:
            correctness = Correctness(
                policy=self.profile.pipeline.policy,
                passed=False,
                sessions_expected=0,
                sessions_exact_required=0,
                sessions_exact=0,
                exact_match_rate=float("nan"),
                rows_expected=0,
                rows_written=0,
                rows_lost=0,
                rows_repeated=0,
                rows_unexpected=0,
                malformed_sent=0,
                malformed_quarantined=0,
                reasons=["the pipeline's output was not given (--pipeline-output): nothing was verified"],
            )
        load = sum(self._steady_load) / len(self._steady_load) if self._steady_load else self.relay.load
        log_path = s.pipeline.log_path if s.pipeline is not None else Path("/nonexistent")
        outcome = Outcome(
            profile=self.profile,
            load_factor=load,
            run_dir=self.run_dir,
            command=command,
            bootstrap=s.kafka.bootstrap,
            started_ms=self.clock.started_ms,
            phases=self.clock.phases,
            samples=self.sampler.rows,
            correctness=correctness,
            drain_s=drain_s,
            pipeline_failed=self.pipeline_failed,
            interrupted=interrupted,
            verify_cpu_s=time.process_time() - cpu0,
            incidents=self.incident_records,
            stopped=self.stopped,
            data_loss_reports=data_loss_reports(log_path),
            output_spec=OutputSpec(s.output) if s.output is not None else None,
        )
        self.progress("report", "the figures, results.json and the report")
        results = figures.results(outcome)
        results.to_json(self.run_dir / "results.json")
        paths = write_report([results], self.run_dir, "report")
        c = results.correctness
        self.events.send(
            "results",
            run_dir=str(self.run_dir),
            results=str(self.run_dir / "results.json"),
            report=str(paths.html),
            verdict=results.verdict.verdict,
            reasons=results.verdict.reasons,
            # The final counts, for the UI's Correctness tab.
            correctness={k: getattr(c, k) for k in ("passed", *CORRECTNESS_COUNTS)} if c is not None else {},
        )
        return results
