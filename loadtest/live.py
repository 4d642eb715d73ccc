"""The harness side of a Locust session: ``python -m loadtest.live CONFIG.json``.

The Locust master (or the only Locust process) starts this process once. It starts a local broker and
the pipeline (unless told of running ones), then, for each Locust run, measures and verifies while the load
goes on and gives the run's verdict at the end, with the same parts and rules as ``sotw run``:

- the sampler (``loadtest.samplers``: lag from the pipeline's checkpoint and Kafka's end offsets, per topic
  too; output rows; batches; CPU and memory), one row a second, each sent to the Locust side as it is taken;
- the live verifier (``loadtest.liveverify``) every few seconds: the verdict so far and the end-to-end
  latency by window;
- the phases: warm-up until the pipeline has caught up with the first load (``loadtest.runner``'s rule),
  steady until Locust stops the run, then drain and settle;
- incidents (``loadtest.incidents``) on a ``RunStage`` whose simulator controls are sent back to the Locust
  side (``fleet`` events), which passes them to the simulators of its processes;
- at the end, the verifier over the whole run, ``loadtest.figures.results`` (the same figures and verdict
  as ``sotw run``), ``results.json`` and the report.

Commands arrive as JSON lines on standard input (``begin``, ``fleet``, ``incident``, ``stopping``, ``finish``,
``quit``) and events leave as JSON lines on standard output (``loadtest.lines``). ``finish`` runs in a thread
of its own (the commands keep flowing) and reports its steps as ``progress`` events, once a second while it
waits (drain, settle), so the UI shows how far the verification after a stop is. It imports nothing from
Locust: Kafka's clients, Spark and the samplers' threads need real threads, which Locust's gevent would
replace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest import figures
from loadtest.contracts import OutputSpec
from loadtest.errors import HarnessError
from loadtest.expect import build_expectation, read_ledger, read_truth
from loadtest.figures import Outcome
from loadtest.fleetplan import LiveConfig
from loadtest.headless import CORRECTNESS_COUNTS
from loadtest.incidents import Incident, IncidentRecord, Schedule, incident_from_mapping
from loadtest.lines import Events, commands
from loadtest.liveverify import LiveVerifier
from loadtest.processes import AttachedPipeline, PipelineProcess, PipelineProcessConfig
from loadtest.profile import Profile
from loadtest.recovery import Stop
from loadtest.report import write_report
from loadtest.results import Correctness, Results
from loadtest.runner import _apply_schedule, _Clock, _data_loss_reports, _drain, _pipeline_warm, _settle
from loadtest.samplers import KafkaLagProbe, OutputProbe, ProgressProbe, ResourceProbe, Sampler
from loadtest.stage import LocalControl, RunStage
from loadtest.triage import Triager
from loadtest.values import read_snapshots
from loadtest.verify import PipelineOutput, read_output, verify
from simulator.config import FaultConfig
from sotw.broker import LocalBroker, local_broker
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig, topic_pattern

log = logging.getLogger(__name__)

#: How much later than its session's end a late copy may still be sent, besides the longest delay (ms).
LATE_MARGIN_MS = 2000
#: How long a ``begin`` waits for the last run's verification thread to end (it sends the verdict last).
FINISHER_GRACE_S = 10.0


class FleetRelay:
    """The simulators of a Locust run as incidents see them: their controls go out as ``fleet`` events.

    The Locust side passes each one to the simulators of its processes, and sends back the fleet's counters
    and the load its users make (``update``), which the sampler records and load incidents return to.
    """

    def __init__(self, events: Events) -> None:
        self._events = events
        self._lock = threading.Lock()
        self.load = 1.0
        self.users = 0
        self.stats: dict[str, Any] = {}
        self.pids: list[int] = []
        self.stopping = False

    def update(self, stats: Mapping[str, Any], load: float, users: int, pids: Sequence[int]) -> None:
        """The fleet's latest counters, the load its users make and its local simulators' process ids.

        Once the load is stopping (``stop_load``) the load and users stay as they were: the users leave
        before the simulators have sent their last messages, and the run's load is the one asked for.
        """
        with self._lock:
            self.stats, self.pids = dict(stats), list(pids)
            if not self.stopping:
                self.load, self.users = float(load), int(users)

    def stop_load(self) -> None:
        """Locust is stopping the users: keep the load they made."""
        with self._lock:
            self.stopping = True

    def set_load_factor(self, factor: float) -> None:
        """Have the simulators send at ``factor`` (the users' own load again when it equals theirs)."""
        self._events.send("fleet", op="load", factor=factor)

    def set_faults(self, faults: FaultConfig, sensor: str | None = None) -> None:
        """Change fault rates on every simulator."""
        self._events.send("fleet", op="faults", faults=dataclasses.asdict(faults), sensor=sensor)

    def clear_faults(self, sensor: str | None = None) -> None:
        """Drop per-sensor rates on every simulator."""
        self._events.send("fleet", op="clear_faults", sensor=sensor)

    def add_sensors(self, count: int) -> None:
        """Have ``count`` sensors join, shared among the simulators."""
        self._events.send("fleet", op="add_sensors", count=count)

    def recreate_topics(self) -> None:
        """Have every simulator create its sensors' topics again."""
        self._events.send("fleet", op="recreate_topics")

    def sample(self) -> dict[str, Any]:
        """The fleet's counters as sampler columns (those ``sotw run`` records for its simulator)."""
        with self._lock:
            s, load, users = self.stats, self.load, self.users
        faults = s.get("faults") or {}
        return {
            "planned": s.get("planned", 0),
            "sent": s.get("sent", 0),
            "counters_ts": s.get("taken_s"),
            "acked": s.get("acked", 0),
            "failed": s.get("failed", 0),
            "lateness_p99_ms": s.get("lateness_p99_ms"),
            "faults_injected": sum(int(v) for v in faults.values()),
            "load": load,
            "users": users,
        }


class LocustStage(RunStage):
    """``RunStage`` of a Locust run: load incidents return to the users' load, not to a fixed factor."""

    def __init__(self, relay: FleetRelay, *args: Any, external: bool = False, topic_prefix: str = "") -> None:
        super().__init__(relay, *args)
        self._topic_prefix = topic_prefix
        self.relay = relay
        self.external = external

    @property
    def base_load_factor(self) -> float:
        """The load the users make now."""
        return self.relay.load

    def _ours(self) -> None:
        if self.external:
            raise HarnessError(
                "pipeline incidents need the pipeline this session started (not --no-pipeline)"
            )

    def kill_pipeline(self) -> None:
        """SIGKILL the pipeline's process tree."""
        self._ours()
        super().kill_pipeline()

    def stop_pipeline(self) -> int | None:
        """Stop the pipeline gracefully."""
        self._ours()
        return super().stop_pipeline()

    def start_pipeline(self, changes: Mapping[str, Any]) -> None:
        """Start the pipeline again on its checkpoint."""
        self._ours()
        super().start_pipeline(changes)


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
    """``loadtest.verify.verify_run`` over the union of the run's parts, restricted to the run's topics.

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
        self.clock = _Clock(started_ms=int(time.time() * 1000))
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
        self.pipeline_failed: str | None = None
        self.stopped: Stop | None = None
        self._ended = threading.Event()
        self._steady_load: list[float] = []
        self.lag = (
            KafkaLagProbe(session.kafka, topic_pattern(self.prefix), session.checkpoint)
            if session.checkpoint is not None
            else None
        )
        self.sampler = self._sampler()
        self.verifier = self._verifier()

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
        self.clock.enter("warmup")
        self.events.send("phase", name="warmup", at_ms=int(time.time() * 1000))
        threading.Thread(target=self._watch, name="sotw-live-watch", daemon=True).start()
        if self.verifier is not None:
            threading.Thread(target=self._verify_loop, name="sotw-live-verify", daemon=True).start()

    def _watch(self) -> None:
        """Phases, the profile's fault windows and incidents, pipeline health; each new sample sent on."""
        settings = self.profile.run
        begun = time.monotonic()
        sent, applied = 0, set[int]()
        while not self._ended.wait(0.25):
            elapsed = time.monotonic() - begun
            _apply_schedule(self.profile, self.relay, elapsed, applied)
            if self.clock.current == "warmup" and elapsed >= settings.warmup_s:
                if _pipeline_warm(self.sampler, elapsed, settings) and not self.relay.stopping:
                    self._enter_steady()
            if self.clock.current == "steady" and self.sampler.rows and not self.relay.stopping:
                self._steady_load.append(float(self.sampler.rows[-1].get("load", 0.0)))
            self._check_pipeline()
            rows = self.sampler.rows
            if len(rows) > sent:
                topics = self.lag.topics if self.lag is not None else {}
                self.events.send(
                    "sample",
                    row=rows[-1],
                    topics=[{"topic": t, "offsets": n, "age_s": age} for t, (n, age) in topics.items()],
                )
                sent = len(rows)

    def _enter_steady(self) -> None:
        with self._lock:
            self.clock.enter("steady")
        self.events.send("phase", name="steady", at_ms=int(time.time() * 1000))
        if self.profile.incidents:
            self._schedule(self.profile.incidents)

    def _check_pipeline(self) -> None:
        pipe = self.session.pipeline
        if pipe is None or pipe.alive() or self.stage.pipeline_down_on_purpose or self.pipeline_failed:
            return
        self.pipeline_failed = (
            f"the pipeline exited with code {pipe.returncode()} during the load: {pipe.tail(2)}"
        )
        self.stopped = Stop(int(time.time() * 1000), pipe.tail(2))
        self.events.send("pipeline_failed", message=self.pipeline_failed)

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
        with self._lock:
            if self.clock.current in ("warmup", "steady"):
                self.clock.enter("drain")
                self.events.send("phase", name="drain", at_ms=int(time.time() * 1000))

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
        pipe = self.session.pipeline
        self._ended.set()
        for schedule in list(self.schedules):
            schedule.stop()
        drain_s: float | None = None
        self.stop_load()
        if not interrupted and self.pipeline_failed is None and pipe is not None:

            def drained(elapsed: float) -> str:
                rows = self.sampler.rows
                return drain_detail(rows[-1] if rows else {}, elapsed, settings.drain_max_s)

            with self.ticking("drain", drained, settings.drain_max_s):
                drain_s = _drain(self.sampler, pipe, settings.drain_max_s, self.stop)
            interrupted = self.stop.is_set()
            if drain_s is not None and not interrupted:
                self.clock.enter("settle")
                self.events.send("phase", name="settle", at_ms=int(time.time() * 1000))
                p = self.profile.pipeline
                settle_s = (p.session_timeout_ms + 3 * p.trigger_ms) / 1000.0

                def settling(elapsed: float) -> str:
                    left = max(0.0, settle_s - elapsed)
                    return f"sessions the load left open time out in the pipeline: {left:.0f} s left"

                with self.ticking("settle", settling, settle_s):
                    _settle(self.profile, pipe, self.stop)
                interrupted = self.stop.is_set()
        if self.verifier is not None:
            self.progress("verify", "the live verifier's last pass (latency up to the end)")
            self.verify_now()  # the latency windows up to the end, for the UI and the CSV
        self.clock.close()
        self.sampler.stop()
        self.events.send("phase", name="verify", at_ms=int(time.time() * 1000))
        if pipe is not None and not pipe.alive() and self.pipeline_failed is None:
            self.pipeline_failed = f"the pipeline exited with code {pipe.returncode()}: {pipe.tail(2)}"
            self.stopped = Stop(int(time.time() * 1000), pipe.tail(2))
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
            data_loss_reports=_data_loss_reports(log_path),
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


class Session:
    """The broker and pipeline of a Locust session, and its runs one after the other."""

    def __init__(self, config: LiveConfig, events: Events) -> None:
        self.config = config
        self.events = events
        self.profile = config.load_profile()
        self.dir = Path(config.session_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.prefix = config.base_prefix(self.profile)
        self.stack = contextlib.ExitStack()
        self.broker: LocalBroker | None = None
        self.control: LocalControl | None = None
        self.pipeline: PipelineProcess | None = None
        self._kafka: KafkaConfig | None = None
        self.output: Path | None = Path(config.output) if config.output else None
        self.checkpoint: Path | None = Path(config.checkpoint) if config.checkpoint else None
        self.run: Run | None = None
        self.finisher: threading.Thread | None = None
        self._runs = 0

    @property
    def kafka(self) -> KafkaConfig:
        """The cluster (the local broker's once it runs)."""
        if self._kafka is None:
            raise HarnessError("the session has not started its broker")
        return self._kafka

    def start(self) -> None:
        """Start the broker and the pipeline as configured; announce them with a ``ready`` event."""
        config, profile = self.config, self.profile
        if config.bootstrap is not None:
            self._kafka = KafkaConfig(config.bootstrap, dict(config.kafka_settings))
        else:
            self.broker = self.stack.enter_context(
                local_broker(config.broker, log_path=self.dir / "broker.log")
            )
            self.control = LocalControl(self.broker)
            self._kafka = KafkaConfig(self.broker.bootstrap, dict(config.kafka_settings))
        if config.pipeline:
            root = self.dir / "pipeline"
            self.output, self.checkpoint = root / "output", root / "checkpoint"
            flags = [a for k, v in self.kafka.settings.items() for a in ("-X", f"{k}={v}")]
            self.pipeline = PipelineProcess(
                PipelineProcessConfig(
                    bootstrap=self.kafka.bootstrap,
                    output=self.output,
                    checkpoint=self.checkpoint,
                    pattern=topic_pattern(self.prefix),
                    settings=profile.pipeline,
                    extra_args=("-q", *flags),
                ),
                log_path=root / "pipeline.log",
            )
            self.events.send("starting", what=f"the pipeline ({profile.pipeline.policy} policy)")
            self.pipeline.start()
            self.pipeline.wait_ready(profile.run.pipeline_start_timeout_s)
        elif self.output is not None and self.checkpoint is not None:
            self.pipeline = AttachedPipeline(
                PipelineProcessConfig(self.kafka.bootstrap, self.output, self.checkpoint),
                log_path=self.dir / "pipeline.log",
            )
        self.events.send(
            "ready",
            bootstrap=self.kafka.bootstrap,
            kafka_settings=dict(self.kafka.settings),
            prefix=self.prefix,
            output=str(self.output) if self.output else None,
            profile=self.profile.as_dict(),
        )

    def begin(self) -> None:
        """Start the next run.

        The Locust side starts one only after the last run's verdict, which that run's thread sends last: it
        is given a moment to end rather than refusing a start that came right after the verdict.
        """
        finisher = self.finisher
        if finisher is not None:
            finisher.join(FINISHER_GRACE_S)
        if finisher is not None and finisher.is_alive():
            raise HarnessError(
                "the previous run is still being verified; start again once it has its verdict"
            )
        self._runs += 1
        self.run = Run(self, f"run-{self._runs}")
        self.events.send("run", run_dir=str(self.run.run_dir), prefix=self.run.prefix, index=self._runs)
        self.run.begin()  # its first event (the warm-up phase) comes after the run's

    def handle(self, command: Mapping[str, Any]) -> bool:
        """Carry out one command; False once the session is to end."""
        op, run = command["op"], self.run
        if op == "quit":
            return False
        if op == "begin":
            self.begin()
        elif op == "fleet" and run is not None:
            run.relay.update(
                command.get("stats") or {}, command["load"], command["users"], command.get("pids") or []
            )
        elif op == "incident" and run is not None:
            run.fire(command["incident"])
        elif op == "stopping" and run is not None:
            run.stop_load()
        elif op == "finish" and run is not None and self.finisher is None:
            interrupted = bool(command.get("interrupted"))
            self.finisher = threading.Thread(
                target=self._finish, args=(run, interrupted, str(command.get("command", ""))), daemon=True
            )
            self.finisher.start()
        elif op in ("fleet", "incident", "finish", "stopping"):
            raise HarnessError(f"{op}: no run is going on")
        else:
            raise HarnessError(f"unknown command {op!r}")
        return True

    def _finish(self, run: Run, interrupted: bool, command: str) -> None:
        try:
            run.finish(interrupted, command)
        except Exception as exc:
            log.exception("the run's verdict failed")
            self.events.send("error", message=f"the run's verdict failed: {exc}", fatal=False, op="finish")
        finally:
            self.finisher = None

    def close(self) -> None:
        """Stop the run's threads, the pipeline and the broker."""
        if self.run is not None:
            self.run.stop.set()
            self.run._ended.set()
            for schedule in list(self.run.schedules):
                schedule.stop()
        if self.finisher is not None:
            self.finisher.join(120)
        if self.run is not None and self.run.sampler.is_alive():
            self.run.sampler.stop()
        if self.pipeline is not None and not isinstance(self.pipeline, AttachedPipeline):
            self.pipeline.stop()
        self.stack.close()


def serve(config: LiveConfig, events: Events, stream: Any = None) -> int:
    """Run a session until ``quit`` or the end of standard input; 0 when it ended cleanly."""
    try:
        session = Session(config, events)
    except (SotwError, ValueError) as exc:
        events.send("error", message=str(exc), fatal=True)
        return 1
    try:
        session.start()
        for command in commands(stream):
            try:
                if not session.handle(command):
                    break
            except (SotwError, KeyError, TypeError, ValueError) as exc:
                op = command.get("op")
                events.send("error", message=f"{op}: {exc}", fatal=False, op=op)
    except SotwError as exc:
        events.send("error", message=str(exc), fatal=True)
        return 1
    finally:
        session.close()
    return 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the session's clean-up


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadtest.live CONFIG.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m loadtest.live CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s live %(levelname)s %(name)s: %(message)s")
    # The Locust process ends the session (a Ctrl-C in its terminal reaches this process too): it is told to
    # quit, or its end of the pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    return serve(LiveConfig.read(Path(args[0])), Events())


if __name__ == "__main__":
    sys.exit(main())
