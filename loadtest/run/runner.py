"""One load-test run, end to end: broker, pipeline process, simulator, samplers, verdict, report.

The phases are those of a game day: a **warm-up** (the JVM compiles, the first batches are slow), a measured
**steady** phase at the profile's rate times the load factor, and a **drain** (the load stops; how long until the
pipeline has caught up). Then the harness waits for quiet sessions to time out, stops the pipeline gracefully,
verifies its output against the ledger and writes ``results.json`` and the report. Ctrl-C at any point stops
every part cleanly and still writes a partial report, marked as interrupted.

The run itself is ``loadtest.run.driver.RunDriver``, which a Locust run drives too; ``LocalRun`` is its host
here: the load is the harness's own simulator thread, progress is lines, and the end of the steady phase ends
the load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.gameday.incident import BrokerControl, Incident
from loadtest.gameday.network_incidents import NetworkIncident
from loadtest.measure.samplers import Probe, ThreadCpuProbe
from loadtest.reports.results import Results
from loadtest.run.driver import PidsOf, RunDriver, RunSetup
from loadtest.run.hostnet import pipeline_command, run_network
from loadtest.run.job import JobSpec, groups_of, job_parts
from loadtest.run.phases import DRAIN, SETTLE, STEADY, WARMUP, PhaseClock
from loadtest.run.profile import Profile
from loadtest.run.stage import BrokerCommands, CommandControl, LocalControl, RunStage, SimulatorControls
from simulator.producer import Simulator
from sotw.broker import local_broker
from sotw.broker.local import BROKER_NODES
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig
from sotw.preflight import preflight
from sotw.topics import TopicSettings, check_replication, delete_topics, run_prefix

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
    security
        The local broker's security (``sotw.broker.SECURITY_MODES``); its admin's settings reach every client.
    topics
        The replication factor and ``min.insync.replicas`` the run's topics are created with.
    cleanup
        Delete the run's topics once it has been verified.
    topic_prefix
        The run's topic prefix; None: the profile's prefix and a random tag (``sotw.topics.run_prefix``).
    netns
        Each node of the local broker and the pipeline in a network namespace of its own, for the network
        incidents (``loadtest.run.hostnet``); needs root and nftables.
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
    security: str = "plaintext"
    topics: TopicSettings = field(default_factory=TopicSettings)
    cleanup: bool = False
    topic_prefix: str | None = None
    netns: bool = False

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
    PreflightError
        If a cluster given with ``kafka`` refuses the run's settings (``sotw.preflight``): before anything
        starts or is written.
    """
    stop = stop or threading.Event()
    run_dir = request.run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        raise HarnessError(f"run directory {run_dir} is not empty; choose a new one")
    if request.netns and request.kafka is not None:
        raise HarnessError(
            "--netns puts the local broker's nodes and the pipeline on a network of their own: it cannot "
            "take a cluster given with --bootstrap"
        )
    needs_network = sorted({i.kind for i in request.all_incidents if isinstance(i, NetworkIncident)})
    if needs_network and not request.netns:
        raise HarnessError(
            f"incident {needs_network[0]} needs the run on a network of hosts: netns = true in the drill file, "
            "or --netns"
        )
    for incident in request.all_incidents:
        if isinstance(incident, NetworkIncident):
            incident.check(BROKER_NODES[request.broker])
    if request.netns and request.profile.pipeline.master:
        raise HarnessError(
            "--netns starts the pipeline's driver in a namespace of its own, but a Spark cluster's executors "
            "(--master) would read Kafka from outside it: run the network drills on the pipeline's local Spark"
        )
    if request.netns and request.job is not None and request.job.attach:
        raise HarnessError("--netns starts the pipeline in a namespace of its own: it cannot take --attach")
    if request.job is not None:
        request.job.check_incidents(request.all_incidents)
        request.job.check_policy(request.profile.pipeline.policy)
    request = dataclasses.replace(
        request, topic_prefix=request.topic_prefix or run_prefix(request.profile.simulator.topic_prefix)
    )
    prefix = request.topic_prefix
    assert prefix is not None
    progress(f"the run's topics: {prefix}*")
    if request.kafka is not None:
        progress(f"pre-flight: can the settings log in to {request.kafka.bootstrap} and use them?")
        lag_from = request.job.lag_from if request.job is not None else None
        groups = [lag_from.value] if lag_from is not None and lag_from.kind == "group" else []
        checked = preflight(request.kafka, prefix, groups)
        check_replication(request.topics, checked.brokers, f"the cluster at {request.kafka.bootstrap}")
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
        where: tuple[str, ...] = ()
        if request.kafka is None:
            network = None
            if request.netns:
                network = run_network(BROKER_NODES[request.broker])
                stack.callback(network.close)
                where = pipeline_command(network)
                progress(
                    "network: "
                    + ", ".join(f"{name} {host.address}" for name, host in network.hosts.items())
                    + f"; the harness and the simulator at {network.gateway}"
                )
            progress(f"starting the local broker ({request.broker})")
            broker = local_broker(
                request.broker,
                log_path=run_dir / "broker.log",
                overrides=request.broker_settings,
                security=request.security,
                network=network,
            )
            stack.enter_context(broker)
            check_replication(request.topics, len(broker.node_ids), f"the local broker {request.broker!r}")
            kafka = broker.kafka_config()
            broker_pids: Callable[[], list[int] | None] = lambda: list(broker.pids.values()) or None  # noqa: E731
            control = LocalControl(broker)
        else:
            kafka = request.kafka
            broker_pids = lambda: None  # noqa: E731 - a remote broker's CPU is not ours to measure
            control = CommandControl(request.broker_commands) if request.broker_commands else None
        results = LocalRun(request, kafka, broker_pids, control, clock, stop, progress, where).run()
        if request.cleanup:
            try:
                deleted = delete_topics(kafka, prefix, streams_apps=groups_of(request.job))
                progress(f"cleanup: deleted the run's {len(deleted)} topics ({prefix}*)")
            except SotwError as exc:  # the run is done and reported: say how to finish the clean-up
                progress(f"cleanup failed ({exc}); later: sotw topics delete --prefix {prefix}")
        return results
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow exceptions here


class LocalRun(RunDriver):
    """A run whose load is the harness's own simulator thread, shown as progress lines (``execute``).

    The load ends when the steady phase has lasted its time and its incidents are over, or on ``stop``.
    """

    def __init__(
        self,
        request: RunRequest,
        kafka: KafkaConfig,
        broker_pids: Callable[[], list[int] | None],
        control: BrokerControl | None,
        clock: PhaseClock,
        stop: threading.Event,
        progress: Progress,
        where: tuple[str, ...] = (),
    ) -> None:
        profile, run_dir = request.profile, request.run_dir
        # A run-specific topic prefix: runs sharing a cluster (bench, capacity, --bootstrap) never read each
        # other; a job the harness attached to subscribes to the profile's prefix, which every run's extends.
        prefix = request.topic_prefix or run_prefix(profile.simulator.topic_prefix)
        self.request = request
        self.progress = progress
        self.simulator = Simulator(
            profile.simulator.replace(
                topic_prefix=prefix,
                replication_factor=request.topics.replication_factor,
                min_insync_replicas=request.topics.min_insync_replicas,
                load_factor=request.load_factor,
                # The harness ends the load itself: the warm-up lasts until the pipeline has finished a batch.
                duration_s=None,
                max_messages=None,
            ),
            kafka,
            run_dir,
        )
        self.sim_stop = threading.Event()
        job = job_parts(
            request.job, profile, kafka, run_dir, prefix, ("-q", *request.pipeline_args), where=where
        )
        setup = RunSetup(
            profile,
            run_dir,
            kafka,
            prefix,
            job,
            load_factor=request.load_factor,
            incidents=request.all_incidents,
            broker=control,
            broker_pids=broker_pids,
            command=request.command,
        )
        super().__init__(setup, stop, clock)

    # ------------------------------------------------------------------------------------ the load

    def controls(self) -> SimulatorControls:
        """The simulator's own controls."""
        return self.simulator

    def load_probe(self) -> Probe:
        """The simulator's counters."""
        return _SimulatorProbe(self.simulator)

    def make_stage(self) -> RunStage:
        """The simulator, the job and the broker."""
        assert self.pipe is not None
        return RunStage(
            self.simulator,
            self.pipe,
            self.setup.broker,
            self.profile,
            self.request.load_factor,
            topic_prefix=self.prefix,
        )

    def process_pids(self) -> dict[str, PidsOf]:
        """The harness process itself: the simulator and the samplers run in it."""
        return {"harness": os.getpid}

    def more_probes(self) -> dict[str, Probe]:
        """The CPU of this process's threads, the simulator's told apart from the sampler's."""
        return {"threads": ThreadCpuProbe(simulator_thread="sotw-simulator")}

    # ---------------------------------------------------------------------------------- progress

    def on_phase(self, name: str) -> None:
        """Announce the warm-up and the steady phase."""
        settings = self.profile.run
        if name == WARMUP:
            self.progress(
                f"warm-up: {self.request.target_rate:,.0f} msg/s ({self.request.load_factor:g}x) "
                f"for {settings.warmup_s:g} s"
            )
        elif name == STEADY:
            self.progress(f"steady: measuring for {settings.steady_s:g} s")

    def on_pipeline_failed(self, message: str) -> None:
        """Say so and end the load: nothing is left to measure; the verdict says why."""
        self.progress(message)
        self.sim_stop.set()

    def say(self, line: str) -> None:
        """A progress line."""
        self.progress(line)

    def watch(self, phase: str, limit_s: float) -> AbstractContextManager[None]:
        """Say what the wait is for."""
        self.progress(_WAITS[phase].format(limit_s))
        return contextlib.nullcontext()

    def on_step(self, step: str, detail: str) -> None:
        """A progress line."""
        self.progress(detail)

    # ------------------------------------------------------------------------------------- the run

    def run(self) -> Results:
        """Start the job, run the load until the steady phase is over (or ``stop``), then the verdict.

        Raises
        ------
        HarnessError
            If the job cannot be started or the simulator fails (every part is stopped first).
        """
        interrupted = False
        sim_error: list[BaseException] = []

        def produce() -> None:
            try:
                self.simulator.run(self.sim_stop)
            except BaseException as exc:  # reported by the main thread
                sim_error.append(exc)

        try:
            self.start_job()
            # The probes' Kafka clients start their threads in the first sample: before the simulator's, which
            # the harness-overhead figures tell apart by when they start.
            self.begin(first_sample_s=10.0)
            producer = threading.Thread(target=produce, name="sotw-simulator", daemon=True)
            producer.start()
            while producer.is_alive():
                self.tick()
                if self.load_done():
                    self.sim_stop.set()
                if self.stop.is_set():
                    interrupted = True
                    self.sim_stop.set()
                producer.join(0.25)
            if sim_error:
                raise HarnessError(f"the simulator failed: {sim_error[0]}") from sim_error[0]
        except KeyboardInterrupt:
            interrupted = True
        except BaseException:
            self.close()
            raise
        return self.finish(interrupted)


_WAITS = {
    DRAIN: "drain: load stopped; waiting up to {:g} s for the pipeline to catch up",
    SETTLE: "settle: waiting {:g} s for the sessions the load left open to time out in the pipeline",
}


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
