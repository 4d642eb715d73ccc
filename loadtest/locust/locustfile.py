"""Locust drives the sensor fleet: ``locust -f loadtest/locust/locustfile.py`` (or ``sotw locust``).

Users, load and sensors (``loadtest.locust.fleetplan``): a ``SensorLoad`` user is a share of the profile's 1x load,
``--users-per-x`` users (10) make 1x, and a spawn rate of 10 users/s raises the load by 1x a second. The
simulator (``simulator.producer.Simulator``, as ``sotw simulate`` runs it) does the sending in a process of its
own per Locust process (``loadtest.locust.feeder``); the users set its rate. With ``--master``/``--worker`` each
worker owns a disjoint part of the fleet and writes its own ledger; the run is verified as their union.

What Locust shows: ``kafka``/``publish ack`` request events (aggregated: one per bucket of response time per
second, counting every message), and sotw's own tabs and panel (``loadtest.locust.webui``): consumer lag per topic,
end-to-end latency over time, the pipeline's batches, injected versus detected faults, the live verifier's
verdict so far, fault-rate controls and incident buttons. The harness process (``loadtest.locust.live``) starts a
local broker and the pipeline unless ``--bootstrap``/``--no-pipeline`` say otherwise, or a team's job for each
run (``--pipeline-cmd`` and the other job flags of ``sotw run``: ``loadtest.run.jobargs``), and ends each run
the way ``sotw run`` does (drain, settle, verify, ``results.json`` and report).

Load shapes by name (``--shape steady|step|spike|soak``, ``loadtest.locust.shapes``); without one, users and spawn
rate are set in the UI (or with ``-u``/``-r``). Headless runs (``--headless``) add sotw's figures to ``--csv``
and ``--html``, and ``--check-*`` thresholds set the exit code.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import locust.argument_parser
import locust.runners
from locust import LoadTestShape, User, constant, events, task
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from loadtest.errors import HarnessError
from loadtest.locust.conductor import ASSIGN, CONTROL, STATS, STOP, STOPPED, Conductor
from loadtest.locust.driver import ProcessSide, count_aggregated
from loadtest.locust.fleetplan import USERS_PER_X, LiveConfig, users_for
from loadtest.locust.headless import Gates
from loadtest.locust.settings import LOOPBACK_HOST, LocustSettings, exposure_warnings
from loadtest.locust.shapes import SHAPES, make_shape
from loadtest.locust.webui import install
from loadtest.run.controls import from_wire
from loadtest.run.job import JobSpec
from loadtest.run.jobargs import add_job_args, add_min_judged, add_source_arg, job_from_args
from loadtest.run.profile import parse_load
from sotw.broker.local import BROKERS
from sotw.broker.security import SECURITY_MODES
from sotw.cliargs import kafka_settings
from sotw.errors import SotwError

log = logging.getLogger("sotw.locust")

#: Heartbeats a worker may miss before the master calls it missing (Locust's default is 3, one a second). A
#: worker starting its simulator on a busy two-core machine can miss a few; Locust's maintainers point to this
#: module constant as the knob (locustio/locust issue 1897).
HEARTBEAT_LIVENESS = 10

#: This process's users and simulator (None on a master, which runs no users).
SIDE: ProcessSide | None = None
#: The run's conductor on the master or the lone process (None on a worker).
CONDUCTOR: Conductor | None = None


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    """Add the sotw options to Locust's own parser (``locust -f loadtest/locust/locustfile.py --help`` lists them)."""

    def option(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*names, include_in_web_ui=False, **kwargs)

    option(
        "--bootstrap",
        metavar="HOST:PORT",
        help="sotw: a running Kafka cluster (default: start a local broker, --broker)",
    )
    option(
        "--kafka-config",
        metavar="FILE",
        type=Path,
        default=None,
        help="sotw: librdkafka settings file, key=value lines",
    )
    option(
        "-X",
        dest="kafka_settings",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="sotw: one librdkafka setting; repeatable; secrets are refused here: put them in --kafka-config",
    )
    option(
        "--sotw-profile",
        metavar="NAME",
        default="baseline",
        help="sotw: the load-test profile (`sotw locust --profile` sets it too)",
    )
    option(
        "--scenario",
        metavar="FILE",
        default=None,
        help="sotw: scenario TOML with the profile (default: the shipped one)",
    )
    option("--policy", metavar="NAME", default=None, help="sotw: override the profile's integrity policy")
    option(
        "--warmup", metavar="SECONDS", type=float, default=None, help="sotw: override the profile's warm-up"
    )
    option(
        "--steady",
        metavar="SECONDS",
        type=float,
        default=None,
        help="sotw: override the profile's steady phase (the shapes share it)",
    )
    option(
        "--shape",
        choices=SHAPES,
        default=None,
        help="sotw: load shape (default: users set in the UI or with -u/-r)",
    )
    option(
        "--load",
        metavar="FACTOR",
        default=None,
        help="sotw: the level a shape holds (steady, soak: 1x) or reaches (step, spike: 10x)",
    )
    option(
        "--stage-s",
        metavar="SECONDS",
        type=float,
        default=None,
        help="sotw: seconds per stage of the shape (default: the steady phase shared; soak: 3600)",
    )
    option(
        "--users-per-x",
        metavar="USERS",
        type=float,
        default=float(USERS_PER_X),
        help="sotw: users that make the profile's 1x load (10)",
    )
    option(
        "--no-pipeline",
        action="store_true",
        default=False,
        help="sotw: do not start the pipeline (one runs already)",
    )
    option(
        "--pipeline-output",
        metavar="DIR",
        default=None,
        help="sotw: the running pipeline's output (with --no-pipeline), for lag and verification; "
        "as --attach --output DIR",
    )
    option(
        "--pipeline-checkpoint",
        metavar="DIR",
        default=None,
        help="sotw: the running pipeline's checkpoint (with --no-pipeline); as --lag-from checkpoint:DIR",
    )
    option(
        "--broker",
        choices=BROKERS,
        default="kafka",
        help="sotw: the local broker (one Kafka node, or kafka-3)",
    )
    option(
        "--security",
        choices=SECURITY_MODES,
        default="plaintext",
        help="sotw: the local broker's security (docs/broker.md); its admin's settings reach every client",
    )
    option(
        "--netns",
        action="store_true",
        default=False,
        help="sotw: each node of the local broker and the pipeline in a network namespace, for the network "
        "incidents (partition, flaky_link, link_cap); needs root and nftables",
    )
    option(
        "--run-dir",
        metavar="DIR",
        default=None,
        help="sotw: where runs are written (default runs/locust-<time>)",
    )
    option(
        "--verify-every",
        metavar="SECONDS",
        type=float,
        default=5.0,
        help="sotw: seconds between two passes of the live verifier",
    )
    option(
        "--check-lag-age",
        metavar="SECONDS",
        type=float,
        default=None,
        help="sotw: exit 3 if the steady phase's max lag age is not below this",
    )
    option(
        "--check-e2e-p99",
        metavar="SECONDS",
        type=float,
        default=None,
        help="sotw: exit 3 if the steady phase's end-to-end p99 is not below this",
    )
    option(
        "--check-correct",
        action="store_true",
        default=False,
        help="sotw: exit 3 unless the output matches the ledger",
    )
    option(
        "--check-verdict",
        action="store_true",
        default=False,
        help="sotw: exit 3 unless sotw's verdict is PASS (as `sotw run` exits 0)",
    )
    # The UI's incident buttons and a master's worker socket stay on this machine unless asked otherwise.
    parser.set_defaults(web_host=LOOPBACK_HOST, master_bind_host=LOOPBACK_HOST)
    # The job under test, as `sotw run` takes it; in groups, so they stay out of the UI's start form.
    group = add_job_args(parser)
    add_source_arg(group)
    add_min_judged(group)


def settings_from(options: Any) -> LocustSettings:
    """The sotw options as typed settings.

    Raises
    ------
    SotwError
        For a bad load, file or combination of options.
    """
    job = job_of(options)
    session = Path(options.run_dir or Path("runs") / f"locust-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    try:
        settings = kafka_settings(options)
    except ValueError as exc:
        raise SotwError(str(exc)) from None
    live = LiveConfig(
        session_dir=str(session),
        profile=options.sotw_profile,
        scenario=options.scenario,
        policy=options.policy,
        warmup_s=options.warmup,
        steady_s=options.steady,
        min_judged=options.min_judged,
        source=options.source,
        bootstrap=options.bootstrap,
        kafka_settings=settings,
        broker=options.broker,
        security=options.security,
        netns=options.netns,
        job=job,
        pipeline=not options.no_pipeline,
        tag=secrets.token_hex(3),
        verify_every_s=options.verify_every,
        master_pid=os.getpid(),
    )
    if options.users_per_x <= 0:
        raise SotwError(f"--users-per-x must be > 0, got {options.users_per_x:g}")
    return LocustSettings(
        live=live,
        shape=options.shape,
        load=parse_load(options.load) if options.load is not None else None,
        stage_s=options.stage_s,
        users_per_x=options.users_per_x,
        gates=Gates(
            options.check_lag_age, options.check_e2e_p99, options.check_correct, options.check_verdict
        ),
        headless=bool(options.headless),
        csv_prefix=options.csv_prefix,
        html_file=options.html_file,
        command=shlex.join(["locust", *sys.argv[1:]]),
    )


def job_of(options: Any) -> JobSpec | None:
    """The job under test the options name, as ``sotw run``'s flags name it (``loadtest.run.jobargs``).

    ``--no-pipeline --pipeline-output DIR --pipeline-checkpoint DIR`` is ``--attach --output DIR --lag-from
    checkpoint:DIR``.

    Raises
    ------
    SotwError
        For flags that do not make a job, or contradict each other (the message names them).
    """
    args = argparse.Namespace(**vars(options))
    if args.pipeline_output or args.pipeline_checkpoint:
        if not args.no_pipeline:
            raise SotwError(
                "--pipeline-output and --pipeline-checkpoint are for a pipeline that runs already: add --no-pipeline"
            )
        if (
            not (args.pipeline_output and args.pipeline_checkpoint)
            or args.attach
            or args.output
            or args.lag_from
        ):
            raise SotwError(
                "--pipeline-output and --pipeline-checkpoint go together, and in place of --attach --output DIR "
                "--lag-from checkpoint:DIR"
            )
        args.attach, args.output = True, Path(args.pipeline_output)
        args.lag_from = f"checkpoint:{args.pipeline_checkpoint}"
    if args.no_pipeline and args.pipeline_cmd:
        raise SotwError(
            "--no-pipeline and --pipeline-cmd exclude each other: the command is the pipeline to start"
        )
    return job_from_args(args)


class SensorLoad(User):
    """A share of the fleet's load: ``--users-per-x`` users make the profile's 1x (``loadtest.locust.fleetplan``).

    The sending is the simulator's, in a process of its own; a user adds its share to its process's
    simulator when it starts and takes it back when it stops.
    """

    wait_time = constant(1.0)

    def on_start(self) -> None:
        """Add this user's share to the process's load."""
        if SIDE is not None:
            SIDE.join()

    def on_stop(self) -> None:
        """Take it back."""
        if SIDE is not None:
            SIDE.leave()

    @task
    def hold(self) -> None:
        """Keep the share while the user runs (the simulator sends on its own schedule)."""


class SotwShape(LoadTestShape):
    """The shape named by ``--shape`` (``loadtest.locust.shapes``), its clock started by the steady phase."""

    def tick(self) -> tuple[int, float] | None:
        """Users and spawn rate now; None once the shape is over."""
        return CONDUCTOR.shape_tick() if CONDUCTOR is not None else None


def cache_locust_defaults() -> bool:
    """Build Locust's option defaults once per worker process instead of once per option of every spawn message.

    A worker handles each spawn message by building Locust's whole argument parser once per option the master
    sent (``locust.argument_parser.default_args_dict`` in a loop: about 80 parsers), which holds the worker's
    greenlets for seconds on a busy machine, long enough to miss heartbeats at every shape step. The defaults
    never change within a process. That function is not Locust's public API: where a Locust release no longer
    has it, the worker runs without the cache and says so once (returns False).
    """
    build = getattr(locust.argument_parser, "default_args_dict", None)
    if not callable(build):
        log.warning(
            "this Locust (%s) has no argument_parser.default_args_dict: workers build its option defaults per "
            "spawn message, which may miss heartbeats on a busy machine",
            getattr(locust, "__version__", "?"),
        )
        return False
    if not hasattr(build, "cache_info"):
        locust.argument_parser.default_args_dict = functools.cache(build)
    return True


def _worker(environment: Any, runner: Any) -> None:
    cache_locust_defaults()
    # The secrets the master's assignments name come from the worker's own --kafka-config (never the wire).
    side = ProcessSide(environment, kafka_settings(environment.parsed_options))

    def assign(environment: Any, msg: Any, **_: Any) -> None:
        try:
            side.assign(msg.data)
        except HarnessError as exc:
            log.error("sotw: %s", exc)
            side.errors.append(str(exc))
            runner.send_message(STOPPED, {"part": str(msg.data.get("part"))})

    def control(environment: Any, msg: Any, **_: Any) -> None:
        side.control(from_wire(msg.data))

    def stop(environment: Any, msg: Any, **_: Any) -> None:
        side.stop()
        runner.send_message(STOPPED, {"part": side.part})

    def report() -> None:
        while True:
            gevent.sleep(1.0)
            if side.part:
                runner.send_message(
                    STATS,
                    {"part": side.part, "stats": side.stats, "faults": side.faults, "users": side.users},
                )

    runner.register_message(ASSIGN, assign, concurrent=True)
    runner.register_message(CONTROL, control)
    runner.register_message(STOP, stop, concurrent=True)
    gevent.spawn(report)
    environment.events.quitting.add_listener(lambda **_: side.stop())
    global SIDE
    SIDE = side


def _conductor(environment: Any, runner: Any, web_ui: Any) -> None:
    global SIDE, CONDUCTOR
    options = environment.parsed_options
    settings = settings_from(options)
    profile = settings.live.load_profile()
    shape = (
        make_shape(settings.shape, profile.run.steady_s, settings.load, settings.stage_s)
        if settings.shape
        else None
    )
    if shape is None:
        environment.shape_class = None  # users and spawn rate by hand, in the UI or with -u/-r
        if options.num_users is None:
            # The UI's start form and a bare --headless begin at 1x, ramped up within a second.
            options.num_users = users_for(1.0, settings.users_per_x)
            options.spawn_rate = float(options.num_users)
    for warning in exposure_warnings(
        options.web_host,
        bool(getattr(options, "web_login", False)),
        web_ui is not None,
        options.master_bind_host,
        isinstance(runner, MasterRunner),
    ):
        log.warning("sotw: %s", warning)
    side = ProcessSide(environment) if isinstance(runner, LocalRunner) else None
    conductor = Conductor(environment, settings, side, shape)
    SIDE, CONDUCTOR = side, conductor
    if isinstance(runner, MasterRunner):
        locust.runners.HEARTBEAT_LIVENESS = HEARTBEAT_LIVENESS
        runner.register_message(
            STATS, lambda environment, msg, **_: conductor.worker_stats(msg.node_id, msg.data)
        )
        runner.register_message(
            STOPPED, lambda environment, msg, **_: conductor.worker_stopped(msg.node_id, msg.data)
        )
        environment.events.worker_connect.add_listener(
            lambda client_id, **_: conductor.worker_joined(client_id)
        )
    # Locust runs these listeners inside its runner's start and stop (the runner stays SPAWNING, CLEANUP or
    # STOPPING until they return), so none of them waits: begin only asks the harness for a run, stopping
    # only tells it, and in the UI the verification after a stop goes on in a greenlet of its own while the
    # runner is already STOPPED (its progress and verdict show in the Correctness tab).
    environment.events.test_start.add_listener(lambda **_: conductor.begin())
    environment.events.test_stopping.add_listener(lambda **_: conductor.stopping())

    def on_stop(**_: Any) -> None:
        if settings.headless:
            conductor.finish(wait=True)  # Locust writes its --html report right after: the verdict goes in it
        else:
            gevent.spawn(conductor.finish, wait=False)

    environment.events.test_stop.add_listener(on_stop)
    environment.events.quitting.add_listener(lambda **_: conductor.quit())
    if web_ui is not None:
        install(web_ui, conductor, options.web_base_path or "")
    conductor.start()
    # Locust's UI asks for a host when none is set; the fleet's "host" is the Kafka cluster it writes to.
    environment.host = f"kafka://{conductor.info['bootstrap']}"


@events.init.add_listener
def on_init(environment: Any, runner: Any = None, web_ui: Any = None, **_: Any) -> None:
    """Set this process up as a worker (users and a simulator) or as the conductor (harness and verdict)."""
    if runner is None:
        return
    environment.events.request.add_listener(count_aggregated(environment))
    try:
        if isinstance(runner, WorkerRunner):
            _worker(environment, runner)
            return
        _conductor(environment, runner, web_ui)
    except SotwError as exc:
        log.error("sotw: %s", exc)
        if CONDUCTOR is not None and CONDUCTOR.live is not None:
            CONDUCTOR.live.end(timeout=30)
        raise SystemExit(1) from None
