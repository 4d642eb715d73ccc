"""The harness side of a Locust session: ``python -m loadtest.locust.live CONFIG.json``.

The Locust master (or the only Locust process) starts this process once. It starts a local broker and
sotw's pipeline (unless told of running ones, or given a team's job), then, for each Locust run
(``loadtest.locust.liverun.LocustRun``, the run ``sotw run`` makes, driven by ``loadtest.run.driver``), starts
a team's job with the run's placeholders, measures and verifies while the load goes on and gives the run's
verdict at the end, with the same parts and rules as ``sotw run``:

- the sampler (``loadtest.measure.samplers``: lag from the pipeline's checkpoint and Kafka's end offsets, per topic
  too; output rows; batches; CPU and memory), one row a second, each sent to the Locust side as it is taken;
- the live verifier (``loadtest.correctness.liveverify``) every few seconds: the verdict so far and the end-to-end
  latency by window;
- the phases: warm-up until the pipeline has caught up with the first load (``loadtest.run.runner``'s rule),
  steady until Locust stops the run, then drain and settle;
- incidents (``loadtest.gameday.incidents``) on a ``RunStage`` whose simulator controls are sent back to the Locust
  side (``fleet`` events), which passes them to the simulators of its processes;
- at the end, a team's job stopped, the verifier over the whole run (``loadtest.correctness.verify.verify_run``),
  ``loadtest.measure.figures.results`` (the same figures and verdict as ``sotw run``), ``results.json`` and the
  report.

Commands arrive as JSON lines on standard input (``loadtest.locust.commands``: ``Begin``, ``UpdateFleet``,
``FireIncident``, ``StopLoad``, ``Finish``, ``Quit``) and events leave as JSON lines on standard output
(``loadtest.locust.lines``). ``Finish`` runs in a thread of its own (the commands keep flowing) and reports its
steps as ``progress`` events, once a second while it waits (drain, settle), so the UI shows how far the
verification after a stop is. It imports nothing from Locust: Kafka's clients, Spark and the samplers' threads
need real threads, which Locust's gevent would replace.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.gameday.incidents import incident_from_mapping
from loadtest.locust.commands import (
    Begin,
    Command,
    Finish,
    FireIncident,
    Quit,
    StopLoad,
    UpdateFleet,
    from_wire,
    op_of,
)
from loadtest.locust.fleetplan import LiveConfig
from loadtest.locust.lines import Events, commands
from loadtest.locust.liverun import LocustRun
from loadtest.run.hostnet import pipeline_command, run_network
from loadtest.run.job import job_process
from loadtest.run.processes import AttachedPipeline, PipelineProcess
from loadtest.run.stage import LocalControl
from sotw.broker import LocalBroker, local_broker
from sotw.broker.local import BROKER_NODES
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig
from sotw.preflight import preflight

log = logging.getLogger(__name__)

#: How long a ``begin`` waits for the last run's verification thread to end (it sends the verdict last).
FINISHER_GRACE_S = 10.0


class Session:
    """The broker and pipeline of a Locust session, and its runs one after the other.

    sotw's own pipeline is started once for the session (its start costs a JVM) and a job attached to is
    watched by every run; a team's ``--pipeline-cmd`` is started by each run (``LocustRun``).
    """

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
        self.run: LocustRun | None = None
        self.finisher: threading.Thread | None = None
        self._runs = 0
        self.where: tuple[str, ...] = ()

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
            if config.security != "plaintext":
                raise HarnessError("--security is for the local broker: give a cluster's with --kafka-config")
            if config.netns:
                raise HarnessError(
                    "--netns puts the local broker's nodes on a network: it cannot take --bootstrap"
                )
            self._kafka = KafkaConfig(config.bootstrap, dict(config.kafka_settings))
            # The same pre-flight as ``sotw run``: bad credentials or a missing ACL stop here, before a run.
            lag_from = config.job.lag_from if config.job is not None else None
            groups = [lag_from.value] if lag_from is not None and lag_from.kind == "group" else []
            self.events.send("starting", what=f"the pre-flight check of {config.bootstrap}")
            preflight(self._kafka, self.prefix, groups)
        else:
            network = None
            if config.netns:
                network = run_network(BROKER_NODES[config.broker])
                self.stack.callback(network.close)
                self.where = pipeline_command(network)
            self.broker = self.stack.enter_context(
                local_broker(
                    config.broker, log_path=self.dir / "broker.log", security=config.security, network=network
                )
            )
            self.control = LocalControl(self.broker)
            admin = self.broker.kafka_config().settings
            self._kafka = KafkaConfig(self.broker.bootstrap, {**admin, **config.kafka_settings})
        job, root = config.job, self.dir / "pipeline"
        if config.netns and ((job is not None and job.attach) or profile.pipeline.master):
            raise HarnessError(
                "--netns starts the pipeline in a namespace of its own: it cannot take --attach, nor a Spark "
                "cluster's executors (--master), which would read Kafka from outside it"
            )
        if job is not None:
            job.check_policy(profile.pipeline.policy)
        if job is not None and job.attach:
            self.pipeline = job_process(job, profile, self.kafka, root, self.prefix, ())
        elif config.pipeline and (job is None or job.command is None):
            self.pipeline = job_process(
                job, profile, self.kafka, root, self.prefix, ("-q",), self.dir, self.where
            )
            self.events.send("starting", what=f"the pipeline ({profile.pipeline.policy} policy)")
            self.pipeline.start()
            self.pipeline.wait_ready(profile.run.pipeline_start_timeout_s)
        self.events.send(
            "ready",
            bootstrap=self.kafka.bootstrap,
            # Secrets stay in this process: the Locust side hands workers the names, never the values.
            kafka_settings=self.kafka.public_settings(),
            kafka_secrets=self.kafka.secret_names(),
            prefix=self.prefix,
            output=str(self.pipeline.config.output) if self.pipeline is not None else None,
            profile=self.profile.as_dict(),
        )

    def begin(self) -> None:
        """Start the next run: its job first, when the run owns one, then the measuring.

        The Locust side starts one only after the last run's verdict, which that run's thread sends last: it
        is given a moment to end rather than refusing a start that came right after the verdict.

        Raises
        ------
        HarnessError
            If the last run is still being verified, the run cannot be told apart from the last one in an
            attached job's table, or the run's job does not start.
        """
        finisher = self.finisher
        if finisher is not None:
            finisher.join(FINISHER_GRACE_S)
        if finisher is not None and finisher.is_alive():
            raise HarnessError(
                "the previous run is still being verified; start again once it has its verdict"
            )
        job = self.config.job
        if self._runs and job is not None and job.attach and job.contract == "tables":
            raise HarnessError(
                "the attached job's table holds the last run's sessions too, and the tables contract cannot tell "
                "runs apart by topic: start a new sotw locust session for each run, or give the job with "
                "--pipeline-cmd, which starts it with a new output for each run"
            )
        self._runs += 1
        run = LocustRun(self, f"run-{self._runs}")
        try:
            # The job before the load, as `sotw run` starts it: the run's first messages find it running.
            run.start_job()
        except BaseException:
            run.close()
            raise
        self.run = run
        self.events.send("run", run_dir=str(run.run_dir), prefix=run.prefix, index=self._runs)
        run.begin()  # its first event (the warm-up phase) comes after the run's

    def handle(self, command: Command) -> bool:
        """Carry out one command; False once the session is to end.

        Raises
        ------
        HarnessError
            If the command needs a run and none is going on.
        """
        run = self.run
        if isinstance(command, Quit):
            return False
        if isinstance(command, Begin):
            self.begin()
            return True
        if run is None:
            raise HarnessError(f"{op_of(command)}: no run is going on")
        match command:
            case UpdateFleet(load=load, users=users, stats=stats, pids=pids):
                run.relay.update(stats, load, users, pids)
            case FireIncident(incident=incident):
                run.fire(incident_from_mapping({**incident, "at_s": 0.0}, where="incident from the UI"))
            case StopLoad():
                run.stop_load()
            case Finish(interrupted=interrupted, command=line) if self.finisher is None:
                self.finisher = threading.Thread(
                    target=self._finish, args=(run, interrupted, line), daemon=True
                )
                self.finisher.start()
        return True

    def _finish(self, run: LocustRun, interrupted: bool, command: str) -> None:
        try:
            run.finish(interrupted, command)
        except Exception as exc:
            log.exception("the run's verdict failed")
            self.events.send("error", message=f"the run's verdict failed: {exc}", fatal=False, op="finish")
        finally:
            self.finisher = None

    def close(self) -> None:
        """Stop the run (its threads, incidents, measuring and job), the session's pipeline and the broker."""
        if self.run is not None:
            self.run.quit()
        if self.finisher is not None:
            self.finisher.join(120)
        if self.run is not None:
            self.run.close()
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
        for message in commands(stream):
            op = message.get("op")
            try:
                if not session.handle(from_wire(message)):
                    break
            except ValueError as exc:  # the message names no command, or a bad one: it says which
                events.send("error", message=str(exc), fatal=False, op=op)
            except SotwError as exc:
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
    """``python -m loadtest.locust.live CONFIG.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m loadtest.locust.live CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s live %(levelname)s %(name)s: %(message)s")
    # The Locust process ends the session (a Ctrl-C in its terminal reaches this process too): it is told to
    # quit, or its end of the pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    return serve(LiveConfig.read(Path(args[0])), Events())


if __name__ == "__main__":
    sys.exit(main())
