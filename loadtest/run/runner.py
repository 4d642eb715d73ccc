"""One load-test run, end to end: broker, pipeline process, simulator, samplers, verdict, report.

The phases are those of a game day: a **warm-up** (the JVM compiles, the first batches are slow), a measured
**steady** phase at the profile's rate times the load factor, and a **drain** (the load stops; how long until the
pipeline has caught up). Then the harness waits for quiet sessions to time out, stops the pipeline gracefully,
verifies its output against the ledger and writes ``results.json`` and the report. Ctrl-C at any point stops
every part cleanly and still writes a partial report, marked as interrupted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.correctness.verify import verify_run
from loadtest.errors import HarnessError
from loadtest.gameday.incident import BrokerControl, Incident
from loadtest.gameday.incidents import Schedule
from loadtest.measure import figures
from loadtest.measure.figures import Outcome
from loadtest.measure.samplers import ResourceProbe, Sampler, ThreadCpuProbe
from loadtest.reports.results import Results
from loadtest.run.job import JobSpec, job_parts
from loadtest.run.phases import DRAIN, SETTLE, STEADY, WARMUP, Lifecycle, PhaseClock, data_loss_reports
from loadtest.run.profile import Profile
from loadtest.run.stage import BrokerCommands, CommandControl, LocalControl, RunStage
from simulator.producer import Simulator
from sotw.broker import local_broker
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunRequest:
    """What to run.

    Parameters
    ----------
    profile
        The 1x baseline (fleet, faults, pipeline settings, phases, criteria).
    load_factor
        Multiplier of the profile's rate.
    run_dir
        Everything the run writes goes here (must not exist yet, or be empty).
    kafka
        A running cluster; None starts a local broker (``broker``) for this run.
    pipeline_args
        Extra ``sotw pipeline`` flags (the harness's self-tests use ``--drop-batch``).
    command
        The command line that asked for this run, for the report.
    incidents
        Game-day incidents during the steady phase, besides the profile's own.
    broker
        The local broker to start when ``kafka`` is None: ``kafka`` (one Apache Kafka node, the default) or
        ``kafka-3`` (three nodes; ``sotw.broker.BROKERS``).
    broker_settings
        ``server.properties`` settings for every node of that local broker, after sotw's own (a cluster set
        up for an unclean election, say).
    broker_commands
        How to stop, start, freeze and thaw the broker of a cluster given with ``kafka``, for incidents.
    job
        The job under test when it is not ``sotw pipeline`` (``--pipeline-cmd``, ``--attach``), or how
        its output is read (``loadtest.run.job``); None runs ``sotw pipeline`` with its full output.
    """

    profile: Profile
    load_factor: float
    run_dir: Path
    kafka: KafkaConfig | None = None
    pipeline_args: tuple[str, ...] = ()
    command: str = ""
    incidents: tuple[Incident, ...] = ()
    broker: str = "kafka"
    broker_settings: Mapping[str, str] = field(default_factory=dict)
    broker_commands: BrokerCommands | None = None
    job: JobSpec | None = None

    @property
    def all_incidents(self) -> tuple[Incident, ...]:
        """The profile's incidents and the request's."""
        return (*self.profile.incidents, *self.incidents)

    @property
    def target_rate(self) -> float:
        """Messages per second the simulator is asked for."""
        return self.profile.simulator.rate * self.load_factor


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def execute(request: RunRequest, stop: threading.Event | None = None, progress: Progress = _quiet) -> Results:
    """Run the whole system once and return its results (also written to ``run_dir/results.json``).

    Raises
    ------
    HarnessError
        If the run directory is in use or a part cannot be started.
    """
    stop = stop or threading.Event()
    run_dir = request.run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        raise HarnessError(f"run directory {run_dir} is not empty; choose a new one")
    if request.job is not None:
        request.job.check_incidents(request.all_incidents)
    run_dir.mkdir(parents=True, exist_ok=True)
    span = max((i.at_s + i.duration for i in request.all_incidents), default=0.0)
    if span and request.profile.run.steady_s < span + 10:
        raise HarnessError(
            f"the steady phase ({request.profile.run.steady_s:g} s) must outlast the incidents ({span:g} s) by "
            "10 s at least, so their recovery can be seen: raise run.steady_s"
        )
    clock = PhaseClock(started_ms=int(time.time() * 1000))
    with contextlib.ExitStack() as stack:
        control: BrokerControl | None
        if request.kafka is None:
            progress(f"starting the local broker ({request.broker})")
            broker = stack.enter_context(
                local_broker(
                    request.broker, log_path=run_dir / "broker.log", overrides=request.broker_settings
                )
            )
            kafka = KafkaConfig(broker.bootstrap)
            broker_pids: Callable[[], list[int] | None] = lambda: list(broker.pids.values()) or None  # noqa: E731
            control = LocalControl(broker)
        else:
            kafka = request.kafka
            broker_pids = lambda: None  # noqa: E731 - a remote broker's CPU is not ours to measure
            control = CommandControl(request.broker_commands) if request.broker_commands else None
        return _run(request, kafka, broker_pids, control, clock, stop, progress)
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow exceptions here


def _run(
    request: RunRequest,
    kafka: KafkaConfig,
    broker_pids: Callable[[], list[int] | None],
    control: BrokerControl | None,
    clock: PhaseClock,
    stop: threading.Event,
    progress: Progress,
) -> Results:
    profile, run_dir = request.profile, request.run_dir
    tag = secrets.token_hex(3)
    # A run-specific topic prefix: runs sharing a cluster (bench, capacity, --bootstrap) never read each other.
    # A job the harness attached to subscribed before the run, to the profile's own prefix.
    attached = request.job is not None and request.job.attach
    prefix = profile.simulator.topic_prefix if attached else f"{profile.simulator.topic_prefix}{tag}-"
    settings = profile.run
    sim_config = profile.simulator.replace(
        topic_prefix=prefix,
        load_factor=request.load_factor,
        # The harness ends the load itself: the warm-up lasts until the pipeline has finished a batch.
        duration_s=None,
        max_messages=None,
    )
    job = job_parts(
        request.job, profile, kafka, run_dir, prefix, ("-q", *_kafka_flags(kafka), *request.pipeline_args)
    )
    pipe = job.process
    simulator = Simulator(sim_config, kafka, run_dir)
    sampler = Sampler(
        {
            "simulator": _SimulatorProbe(simulator),
            **job.probes,
            "resources": ResourceProbe(
                {
                    "broker": broker_pids,
                    "pipeline": lambda: pipe.pid if pipe.proc is not None and pipe.alive() else None,
                    "harness": os.getpid,
                },
                alone=("harness",),  # the harness's children are the broker and the pipeline
            ),
            # Last: after the probes above have closed their short-lived Kafka clients.
            "threads": ThreadCpuProbe(simulator_thread="sotw-simulator"),
        },
        run_dir / "samples.jsonl",
        phase=lambda: clock.current,
    )
    stage = RunStage(simulator, pipe, control, profile, request.load_factor, topic_prefix=prefix)
    schedule = Schedule(request.all_incidents, stage, progress)
    sim_stop = threading.Event()
    announce = {
        WARMUP: f"warm-up: {request.target_rate:,.0f} msg/s ({request.load_factor:g}x) for {settings.warmup_s:g} s",
        STEADY: f"steady: measuring for {settings.steady_s:g} s",
    }
    waits = {
        DRAIN: "drain: load stopped; waiting up to {:g} s for the pipeline to catch up",
        SETTLE: "settle: waiting {:g} s for the sessions the load left open to time out in the pipeline",
    }

    def said(line: str) -> None:
        if line:
            progress(line)

    @contextlib.contextmanager
    def waiting(phase: str, limit_s: float) -> Iterator[None]:
        progress(waits[phase].format(limit_s))
        yield

    def failed(message: str) -> None:
        progress(message)
        sim_stop.set()  # nothing left to measure; the verdict says why

    life = Lifecycle(
        profile,
        sampler,
        simulator,
        stage,
        pipe,
        on_phase=lambda name: said(announce.get(name, "")),
        on_pipeline_failed=failed,
        clock=clock,
    )
    interrupted = False
    drain_s: float | None = None
    sim_error: list[BaseException] = []
    try:
        progress(
            f"starting the pipeline ({profile.pipeline.policy} policy, trigger {profile.pipeline.trigger})"
        )
        pipe.start()
        pipe.wait_ready(settings.pipeline_start_timeout_s)
        sampler.start()
        # The probes' Kafka clients start their threads in the first sample: before the simulator's, which
        # the harness-overhead figures tell apart by when they start.
        sampler.wait_first_row(10.0)

        def produce() -> None:
            try:
                simulator.run(sim_stop)
            except BaseException as exc:  # reported by the main thread
                sim_error.append(exc)

        producer = threading.Thread(target=produce, name="sotw-simulator", daemon=True)
        life.start_load()
        producer.start()
        while producer.is_alive():
            if life.tick() and schedule.incidents:
                schedule.start()
            if life.steady_over() and (not schedule.is_alive() or schedule.done()):
                sim_stop.set()
            if stop.is_set():
                interrupted = True
                sim_stop.set()
            producer.join(0.25)
        if sim_error:
            raise HarnessError(f"the simulator failed: {sim_error[0]}") from sim_error[0]
        if interrupted:
            life.end_load()
        else:
            drain_s = life.wind_down(stop, waiting)
            interrupted = stop.is_set()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        schedule.stop()
        life.finish()
        sampler.stop()
        code = pipe.stop()
        progress(f"pipeline stopped (exit code {code})")
    pipeline_failed, stopped = life.pipeline_failed, life.stopped
    progress("verifying the output against the ledger")
    policy = profile.pipeline.verifier_policy(timeouts_expire=not interrupted and drain_s is not None)
    verify_cpu0 = time.process_time()
    correctness = verify_run(
        run_dir, job.output, policy, kafka, pipeline_stopped=pipeline_failed is not None, progress=progress
    )
    outcome = Outcome(
        profile=profile,
        load_factor=request.load_factor,
        run_dir=run_dir,
        command=request.command,
        bootstrap=kafka.bootstrap,
        started_ms=clock.started_ms,
        phases=clock.phases,
        samples=sampler.rows,
        correctness=correctness,
        drain_s=drain_s,
        pipeline_failed=pipeline_failed,
        interrupted=interrupted,
        verify_cpu_s=time.process_time() - verify_cpu0,
        incidents=schedule.records,
        stopped=stopped,
        data_loss_reports=data_loss_reports(pipe.log_path),
        output_spec=job.output,
    )
    results = figures.results(outcome)
    results.to_json(run_dir / "results.json")
    return results


def _kafka_flags(kafka: KafkaConfig) -> list[str]:
    flags: list[str] = []
    for key, value in kafka.settings.items():
        flags += ["-X", f"{key}={value}"]
    return flags


class _SimulatorProbe:
    """The simulator's counters as sampler columns."""

    def __init__(self, simulator: Simulator) -> None:
        self._sim = simulator

    def sample(self) -> dict[str, Any]:
        s = self._sim.stats()
        return {
            "planned": s.planned,
            "sent": s.sent,
            "acked": s.acked,
            "failed": s.failed,
            "lateness_p99_ms": s.lateness_p99_ms,
            "faults_injected": sum(s.faults.values()),
        }
