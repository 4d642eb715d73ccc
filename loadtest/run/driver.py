"""One run from its start to its report, whoever drives the load: ``RunDriver``, which its hosts extend.

``sotw run`` (and ``bench``, ``drill`` and ``capacity``) and a Locust run differ only in where the load comes
from (the runner's own simulator thread, or the Locust fleet relayed from the Locust processes), how progress
is shown (lines, or the web UI's JSON events) and who ends the load (the end of the steady phase, or
Locust's Stop). Everything else is done once, here, as Locust's ``LocalRunner`` and ``MasterRunner`` share
its ``Runner`` base: the job's parts (``loadtest.run.job``), the sampler, the phases
(``loadtest.run.phases.Lifecycle``), the incidents' schedules, the verification
(``loadtest.correctness.verify.verify_run``: either contract, Parquet or Delta, a long run a shard of sensors
at a time), the figures and verdict (``loadtest.measure.figures``), ``results.json`` and the report.

A host subclasses ``RunDriver``: it makes its load before calling ``RunDriver.__init__`` and supplies it
through ``controls``, ``load_probe``, ``make_stage`` and ``process_pids``; it shows progress by overriding
the ``on_*`` methods and ``say``/``watch``; it calls ``begin``, then ``tick`` while the load runs, ends the
load itself, and calls ``finish`` for the verdict.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadtest.correctness.shards import SHARD_ROWS
from loadtest.correctness.verify import verify_run
from loadtest.gameday.incident import BrokerControl, Incident
from loadtest.gameday.incidents import IncidentRecord, Schedule
from loadtest.measure import figures
from loadtest.measure.figures import Outcome
from loadtest.measure.samplers import Probe, ResourceProbe, Sampler
from loadtest.reports.report import ReportPaths, write_report
from loadtest.reports.results import Correctness, Results
from loadtest.run.job import JobParts
from loadtest.run.phases import Lifecycle, PhaseClock, data_loss_reports
from loadtest.run.profile import Profile
from loadtest.run.stage import RunStage, SimulatorControls
from sotw.kafka import KafkaConfig

#: The step after the load in which the output is checked against the ledger (shown as a phase by the UI).
VERIFY = "verify"
#: The step in which the figures, ``results.json`` and the report are written.
REPORT = "report"

#: A process tree's root process id, or several, or None while it does not run (``ResourceProbe``).
PidsOf = Callable[[], int | list[int] | None]


def _no_pids() -> list[int] | None:
    return None


@dataclass(frozen=True)
class RunSetup:
    """What one run is: its profile, directory, cluster, topics, job and incidents.

    Parameters
    ----------
    profile
        The run's profile (phases, criteria, the pipeline's settings, the fleet).
    run_dir
        Where the run writes; the simulators' ledgers are in it (or under ``parts/<name>`` in it).
    kafka
        The cluster the run's topics are on.
    prefix
        The run's topic prefix.
    job
        The job's process, probes and output (``loadtest.run.job.job_parts``); None when no job is watched
        (a Locust session told only that a pipeline runs somewhere): nothing is verified then.
    owns_job
        The run starts its job before the load and stops it before verifying (``sotw run``; a Locust run of a
        team's ``--pipeline-cmd``). False for a job that outlives the run: a Locust session's own pipeline.
    load_factor
        The load asked for, for the figures (a host whose load changes reports its own: ``load_factor``).
    incidents
        Game-day incidents, each at its time into the steady phase.
    broker
        The broker's controls for incidents, or None when the run cannot touch its broker.
    broker_pids
        The local broker's processes, for their CPU and memory (None for a cluster that is not ours).
    command
        The command line that asked for the run, for the report.
    shard_rows
        Ledger rows above which a full-contract Parquet output is verified a shard of sensors at a time.
    """

    profile: Profile
    run_dir: Path
    kafka: KafkaConfig
    prefix: str
    job: JobParts | None
    owns_job: bool = True
    load_factor: float = 1.0
    incidents: tuple[Incident, ...] = ()
    broker: BrokerControl | None = None
    broker_pids: Callable[[], list[int] | None] = _no_pids
    command: str = ""
    shard_rows: int = SHARD_ROWS


class RunDriver:
    """One run from the start of its job to its report; hosts supply the load and show the progress.

    Parameters
    ----------
    setup
        What the run is.
    stop
        Set when the run must end now (Ctrl-C, the Locust session quitting): the drain and settle are cut
        short and the run is verified as interrupted.
    clock
        The run's phase clock, when it started before the driver (a broker started for the run counts as
        set-up).
    """

    #: Whether ``finish`` writes the run's own report. ``sotw run``'s commands write theirs after the runs,
    #: several side by side (``bench``'s 1x and 10x); a Locust run is reported on its own.
    reports_each_run = False

    def __init__(
        self, setup: RunSetup, stop: threading.Event | None = None, clock: PhaseClock | None = None
    ) -> None:
        self.setup = setup
        self.profile = setup.profile
        self.run_dir = setup.run_dir
        self.kafka = setup.kafka
        self.prefix = setup.prefix
        self.job = setup.job
        self.pipe = setup.job.process if setup.job is not None else None
        self.stop = stop if stop is not None else threading.Event()
        self.clock = clock if clock is not None else PhaseClock(started_ms=int(time.time() * 1000))
        self.stage = self.make_stage()
        self.sampler = self._sampler()
        self.life = Lifecycle(
            self.profile,
            self.sampler,
            self.controls(),
            self.stage,
            self.pipe,
            on_phase=self.on_phase,
            on_pipeline_failed=self.on_pipeline_failed,
            clock=self.clock,
        )
        self._lock = threading.Lock()
        self.schedules = [Schedule(setup.incidents, self.stage, self.say)]
        self._measuring = True

    # ------------------------------------------------------------------------------ the host's load

    def controls(self) -> SimulatorControls:
        """The host's: what fault windows and incidents change (a simulator, or the Locust fleet's relay)."""
        raise NotImplementedError

    def load_probe(self) -> Probe:
        """The host's: the load's counters as sampler columns (``planned``, ``sent``, ``acked``, ...)."""
        raise NotImplementedError

    def make_stage(self) -> RunStage:
        """The host's: the running system as incidents see it."""
        raise NotImplementedError

    def process_pids(self) -> dict[str, PidsOf]:
        """The host's: processes whose CPU and memory are measured besides the broker and the job.

        ``harness`` is measured alone (its children are the broker and the job, measured on their own).
        """
        raise NotImplementedError

    def more_probes(self) -> dict[str, Probe]:
        """Probes the host adds last (the harness's own threads' CPU)."""
        return {}

    def load_factor(self) -> float:
        """The run's load factor, for its figures: the one asked for, unless the host's load varies."""
        return self.setup.load_factor

    # -------------------------------------------------------------------------- the host's display

    def on_phase(self, name: str) -> None:
        """A phase begins (``loadtest.run.phases.PHASES``, then ``VERIFY`` once the measuring is over)."""

    def on_pipeline_failed(self, message: str) -> None:
        """The job exited on its own during the load (``message`` says how)."""

    def say(self, line: str) -> None:
        """A line for the person watching: the job starting and stopping, an incident beginning or ending."""

    def watch(self, phase: str, limit_s: float) -> AbstractContextManager[None]:
        """Wraps each wait after the load (``drain``, ``settle``; at most ``limit_s`` seconds)."""
        return _nothing()

    def on_step(self, step: str, detail: str) -> None:
        """Where the verification after the load is (``VERIFY``, ``REPORT``), in words."""

    def on_load_over(self) -> None:
        """The drain and settle are over and the sampler still runs (a last look before measuring stops)."""

    def on_results(self, results: Results, report: ReportPaths | None) -> None:
        """The run's results are written (and its report, if it writes one)."""

    # ------------------------------------------------------------------------------------ the run

    def start_job(self) -> None:
        """Start the job the run owns and wait until it runs.

        Raises
        ------
        HarnessError
            If it exits while starting or does not start within the profile's ``pipeline_start_timeout_s``.
        """
        if not self.setup.owns_job or self.pipe is None:
            return
        p = self.profile.pipeline
        self.say(f"starting the pipeline ({p.policy} policy, trigger {p.trigger})")
        self.pipe.start()
        self.pipe.wait_ready(self.profile.run.pipeline_start_timeout_s)

    def begin(self, first_sample_s: float = 0.0) -> None:
        """Start measuring and the warm-up; with ``first_sample_s``, the first sample is taken first."""
        self.sampler.start()
        if first_sample_s > 0:
            self.sampler.wait_first_row(first_sample_s)
        self.life.start_load()

    def tick(self, may_steady: bool = True) -> None:
        """One look while the load runs: phases, fault windows, the incidents once the steady phase begins.

        ``may_steady`` False holds the warm-up (a Locust run whose users are stopping).
        """
        if not self.life.tick(may_steady):
            return
        if self.life.behind is not None:
            self.say(f"warning: {self.life.behind}")
        if self.schedules[0].incidents:
            self.schedules[0].start()

    def load_done(self) -> bool:
        """Whether the steady phase has lasted its time and its incidents are over: the load may end."""
        first = self.schedules[0]
        return self.life.steady_over() and (not first.is_alive() or first.done())

    def fire(self, incident: Incident) -> None:
        """Start one incident now, besides the schedule (the web UI's controls)."""
        schedule = Schedule([incident], self.stage, self.say)
        with self._lock:
            self.schedules.append(schedule)
        schedule.start()

    @property
    def incident_records(self) -> list[IncidentRecord]:
        """Every incident so far, scheduled or fired."""
        with self._lock:
            return [r for s in self.schedules for r in s.records]

    def finish(self, interrupted: bool) -> Results:
        """The load is over: drain, settle, stop measuring (and the job the run owns), verify, write results.

        An interrupted run (or one whose ``stop`` is set meanwhile) skips the waits and is verified as such.
        """
        drain_s: float | None = None
        try:
            self._stop_schedules()
            if interrupted:
                self.life.end_load()
            else:
                drain_s = self.life.wind_down(self.stop, self.watch)
                interrupted = self.stop.is_set()
            self.on_load_over()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self.close()
        return self._conclude(interrupted, drain_s)

    def close(self) -> None:
        """Stop the incidents, the measuring and the job the run owns (once; a run that failed to start too)."""
        with self._lock:
            measuring, self._measuring = self._measuring, False
        if not measuring:
            return
        self._stop_schedules()
        self.life.finish()
        self.sampler.stop()
        if self.setup.owns_job and self.pipe is not None:
            code = self.pipe.stop()
            self.say(f"pipeline stopped (exit code {code})")

    def _stop_schedules(self) -> None:
        with self._lock:
            schedules = list(self.schedules)
        for schedule in schedules:
            schedule.stop()

    # ------------------------------------------------------------------------------- the verdict

    def verify(self, interrupted: bool, drain_s: float | None) -> Correctness:
        """The output against the ledger, as every run is verified (``verify_run``)."""
        if self.job is None:
            return not_verified(self.profile)
        # Sessions the load left open close only once their timeout passes, which a run cut short never saw.
        policy = self.profile.pipeline.verifier_policy(
            timeouts_expire=not interrupted and drain_s is not None
        )
        self.on_step(VERIFY, "verifying the output against the ledger")
        return verify_run(
            self.run_dir,
            self.job.output,
            policy,
            self.kafka,
            self.life.job_exit(),
            progress=lambda detail: self.on_step(VERIFY, detail),
            shard_rows=self.setup.shard_rows,
        )

    def _conclude(self, interrupted: bool, drain_s: float | None) -> Results:
        self.on_phase(VERIFY)
        cpu0 = time.process_time()
        correctness = self.verify(interrupted, drain_s)
        outcome = Outcome(
            profile=self.profile,
            load_factor=self.load_factor(),
            run_dir=self.run_dir,
            command=self.setup.command,
            bootstrap=self.kafka.bootstrap,
            started_ms=self.clock.started_ms,
            phases=self.clock.phases,
            samples=self.sampler.rows,
            correctness=correctness,
            drain_s=drain_s,
            pipeline_failed=self.life.pipeline_failed,
            interrupted=interrupted,
            verify_cpu_s=time.process_time() - cpu0,
            incidents=self.incident_records,
            stopped=self.life.stopped,
            data_loss_reports=data_loss_reports(self.pipe.log_path) if self.pipe is not None else 0,
            output_spec=self.job.output if self.job is not None else None,
        )
        self.on_step(REPORT, "the figures, results.json and the report")
        results = figures.results(outcome)
        results.to_json(self.run_dir / "results.json")
        report = write_report([results], self.run_dir, "report") if self.reports_each_run else None
        self.on_results(results, report)
        return results

    # ------------------------------------------------------------------------------------ parts

    def _sampler(self) -> Sampler:
        pipe = self.pipe

        def pipeline() -> int | None:
            return pipe.pid if pipe is not None and pipe.proc is not None and pipe.alive() else None

        probes: dict[str, Probe] = {"simulator": self.load_probe()}
        if self.job is not None:
            probes.update(self.job.probes)
        probes["resources"] = ResourceProbe(
            {"broker": self.setup.broker_pids, "pipeline": pipeline, **self.process_pids()},
            alone=("harness",),
        )
        # Last: after the probes above have closed their short-lived Kafka clients.
        probes.update(self.more_probes())
        return Sampler(probes, self.run_dir / "samples.jsonl", phase=lambda: self.clock.current)


def not_verified(profile: Profile) -> Correctness:
    """The correctness of a run whose job's output nobody named: nothing checked, not passed."""
    return Correctness(
        policy=profile.pipeline.policy,
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
        reasons=[
            "the job's output was not given (--attach --output, --pipeline-output): nothing was verified"
        ],
    )


@contextmanager
def _nothing() -> Iterator[None]:
    yield
