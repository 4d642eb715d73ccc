"""``sotw run``, ``sotw bench``, ``sotw capacity`` and ``sotw drill``: the harness's commands.

The first argument is the command name (the dispatcher passes it on), so they share one parser builder and one
way of turning flags into a ``Profile`` and a run directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtest.errors import HarnessError
from loadtest.gameday.drills import Drill, DrillOutcome, load_drill, scorecard_text, shipped
from loadtest.planning.capacity import (
    SEARCH_BROKER_SETTINGS,
    SearchSettings,
    Targets,
    search,
    step_of,
    steps,
    with_capacity,
)
from loadtest.reports.report import markdown_summary, write_report
from loadtest.reports.results import (
    EXIT_CODES,
    FAIL,
    INCONCLUSIVE,
    Capacity,
    Results,
    Verdict,
    exit_code,
)
from loadtest.run.job import JobSpec
from loadtest.run.jobargs import add_job_args, add_min_judged, add_source_arg, job_from_args
from loadtest.run.profile import Profile, changed, load_profile, parse_load
from loadtest.run.runner import RunRequest, execute
from loadtest.run.stage import BrokerCommands
from loadtest.run.topicargs import (
    add_netns_arg,
    add_security_arg,
    add_topic_args,
    security_from_args,
    topics_from_args,
)
from sotw.cliargs import add_kafka_args, add_logging_args, cluster_config, setup_logging
from sotw.kafka import KafkaConfig
from sotw.topics import TopicSettings


def _parser(command: str, prog: str | None = None) -> argparse.ArgumentParser:
    descriptions = {
        "run": "One load-test run: warm-up, steady phase at the profile's rate x LOAD, drain; verdict and report.",
        "bench": "1x and 10x back to back on the same profile, reported side by side.",
        "capacity": "Find the highest rate the pipeline sustains within the lag bound and the end-to-end p99 "
        "target: one run whose load a controller raises and lowers (or whole runs per step with --method steps); "
        "exit 1 when not even the lowest level is sustained (docs/capacity.md).",
    }
    p = argparse.ArgumentParser(prog=prog or f"sotw {command}", description=descriptions[command])
    if command == "run":
        p.add_argument("--load", default="1x", help="load factor: 1x, 10x, 2.5x (default 1x)")
        add_netns_arg(p)
    if command in ("run", "bench"):
        add_security_arg(p)
        add_topic_args(p)
    p.add_argument("--profile", default="baseline", help="profile name in the scenario file (baseline)")
    p.add_argument(
        "--scenario", type=Path, default=None, help="scenario TOML (default: the shipped scenarios.toml)"
    )
    p.add_argument(
        "--run-dir", type=Path, default=None, help="where to write (default runs/<command>-<time>)"
    )
    p.add_argument("--warmup", type=float, default=None, help="override the profile's warm-up seconds")
    p.add_argument("--steady", type=float, default=None, help="override the profile's steady-phase seconds")
    p.add_argument("--policy", default=None, help="override the profile's integrity policy")
    add_min_judged(p)
    # The nightly gate's self-test: sotw pipeline's micro-batches each wait this long (a planted regression).
    p.add_argument("--plant-batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument(
        "--master",
        default=None,
        help="Spark master of the pipeline under test: spark://HOST:PORT for a standalone cluster "
        "(`sotw cluster` starts one here); default the pipeline's local[2]",
    )
    add_source_arg(p)
    if command == "capacity":
        p.add_argument(
            "--method",
            choices=("search", "steps"),
            default="search",
            help="one controlled run, or a run per step",
        )
        p.add_argument("--start", default="1x", help="first load factor tried (1x)")
        p.add_argument("--min", default=None, help="lowest load factor tried (search: --start / 8)")
        p.add_argument("--max", default="64x", help="highest load factor tried (64x)")
        p.add_argument(
            "--p99", type=float, default=None, help="end-to-end p99 target in s (the profile's bound)"
        )
        p.add_argument("--hold", type=float, default=20.0, help="search: seconds each level is held (20)")
        p.add_argument(
            "--budget", type=float, default=240.0, help="search: seconds for the whole search (240)"
        )
        p.add_argument(
            "--tolerance", type=float, default=0.15, help="search: converged within this share (0.15)"
        )
        p.add_argument("--refine", type=int, default=2, help="steps: bisection steps after the doubling (2)")
        p.add_argument(
            "--check", action="store_true", help="search: then a whole run at the rate found, which must PASS"
        )
    add_job_args(p)
    add_kafka_args(p)
    add_logging_args(p)
    return p


def _drill_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sotw drill",
        description="Run a game-day drill (a shipped one by name, or a drill file) and score it: exit 0 only "
        "if every expectation is met, 1 if one is not, 4 (INCONCLUSIVE) if all are but the run judged too "
        "little. `sotw drill --list` shows the shipped drills.",
    )
    p.add_argument("drill", nargs="?", help="a shipped drill's name, or the path of a drill file (.toml)")
    p.add_argument("--list", action="store_true", help="list the shipped drills and exit")
    p.add_argument(
        "--master",
        default=None,
        help="Spark master of the pipeline under test (spark://HOST:PORT; the worker-kill drills need one)",
    )
    add_source_arg(p)
    add_min_judged(p)
    add_security_arg(p)
    add_netns_arg(p)
    add_topic_args(p)
    p.add_argument(
        "--run-dir", type=Path, default=None, help="where to write (default runs/drill-<name>-<time>)"
    )
    for which, what in (
        ("stop", "stop the broker of the --bootstrap cluster"),
        ("start", "start it again"),
        ("pause", "freeze it (e.g. `docker pause kafka`)"),
        ("resume", "thaw it"),
    ):
        p.add_argument(f"--broker-{which}-cmd", default=None, metavar="COMMAND", help=f"command to {what}")
    add_job_args(p)
    add_kafka_args(p)
    add_logging_args(p)
    return p


def parser(command: str) -> argparse.ArgumentParser:
    """The argument parser of ``sotw run``, ``bench``, ``capacity`` or ``drill``."""
    return _drill_parser() if command == "drill" else _parser(command)


def list_drills() -> str:
    """The shipped drills, one line each."""
    lines = []
    for name in shipped():
        lines.append(f"  {name:<26} {load_drill(name).description}")
    return "shipped drills (sotw drill NAME):\n" + "\n".join(lines)


def run_drill(
    drill: Drill,
    root: Path,
    kafka: KafkaConfig | None,
    commands: BrokerCommands | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = lambda _: None,
    command: str = "",
    job: JobSpec | None = None,
    topics: TopicSettings | None = None,
    cleanup: bool = False,
) -> Results:
    """Run one drill and return its results with the scorecard (also in ``root/results.json``).

    ``job`` is the job under test when it is not ``sotw pipeline`` (``--pipeline-cmd``); ``topics`` and
    ``cleanup`` are the run's topics' settings (``--replication-factor``, ``--cleanup``).

    Raises
    ------
    HarnessError
        If the drill sets ``broker_settings`` but runs on a cluster given with ``--bootstrap``, whose settings
        are its own.
    """
    if kafka is not None and drill.security != "plaintext":
        raise HarnessError(
            f"drill {drill.name} asks for a {drill.security} local broker: run it without --bootstrap, or drop "
            "security from a copy of the drill file (a cluster's own settings go in --kafka-config)"
        )
    if kafka is not None and drill.broker_settings:
        raise HarnessError(
            f"drill {drill.name} sets broker_settings ({', '.join(sorted(drill.broker_settings))}) for the local "
            "broker it starts: run it without --bootstrap, or set them on your cluster and drop them from a "
            "copy of the drill file"
        )
    profile = changed(
        load_profile(drill.profile, drill.scenario),
        f"drill {drill.name}",
        simulator=drill.simulator,
        pipeline=drill.pipeline,
        run=drill.run,
    )
    request = RunRequest(
        profile,
        parse_load(drill.load),
        root,
        kafka,
        command=command,
        incidents=drill.incidents,
        broker=drill.broker,
        broker_settings=drill.broker_settings,
        security=drill.security,
        netns=drill.netns,
        broker_commands=commands,
        job=job,
        topics=topics or TopicSettings(),
        cleanup=cleanup,
    )
    results = execute(request, stop, progress)
    outcome = DrillOutcome(
        verdict=results.verdict.verdict,
        correctness=results.correctness,
        recoveries=results.incidents,
        stopped=results.pipeline_stop is not None,
        stop_message=results.pipeline_stop or "",
        data_loss_reports=results.data_loss_reports,
    )
    results = dataclasses.replace(results, drill=drill.score(outcome))
    results.to_json(root / "results.json")
    return results


def drill_main(rest: Sequence[str]) -> int:
    """``sotw drill NAME|FILE`` and ``sotw drill --list``."""
    args = _drill_parser().parse_args(rest)
    if args.list:
        print(list_drills())
        return 0
    if not args.drill:
        raise HarnessError("name a drill (`sotw drill --list` shows the shipped ones) or give a drill file")
    setup_logging(args)
    drill = load_drill(args.drill)
    if args.master:
        drill = dataclasses.replace(drill, pipeline={**drill.pipeline, "master": args.master})
    if args.source:
        drill = dataclasses.replace(drill, pipeline={**drill.pipeline, "source": args.source})
    if args.min_judged is not None:
        drill = dataclasses.replace(drill, run={**drill.run, "min_judged": args.min_judged})
    drill = dataclasses.replace(
        drill, security=security_from_args(args, drill.security), netns=drill.netns or args.netns
    )
    kafka: KafkaConfig | None = cluster_config(args)
    commands = BrokerCommands(
        args.broker_stop_cmd, args.broker_start_cmd, args.broker_pause_cmd, args.broker_resume_cmd
    )
    root = args.run_dir or Path("runs") / f"drill-{drill.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    results = run_drill(
        drill,
        root,
        kafka,
        commands if kafka is not None else None,
        _stop_on_signals(),
        _say,
        "sotw " + shlex.join(["drill", *rest]),
        job_from_args(args),
        topics_from_args(args),
        args.cleanup,
    )
    paths = write_report([results], root, "report")
    assert results.drill is not None
    print(scorecard_text(results.drill))
    print(f"\nreport: {paths.html}")
    verdict = results.drill_verdict or FAIL
    if verdict == INCONCLUSIVE:
        print("drill INCONCLUSIVE: every expectation met, but " + "; ".join(results.verdict.reasons))
    return EXIT_CODES[verdict]


def _profile(args: argparse.Namespace) -> Profile:
    profile = load_profile(args.profile, args.scenario)
    run = profile.run
    if args.warmup is not None:
        run = dataclasses.replace(run, warmup_s=args.warmup)
    if args.steady is not None:
        run = dataclasses.replace(run, steady_s=args.steady)
    if args.min_judged is not None:
        run = dataclasses.replace(run, min_judged=args.min_judged)
    pipeline = profile.pipeline
    if args.policy is not None:
        pipeline = dataclasses.replace(pipeline, policy=args.policy)
    if args.master is not None:
        pipeline = dataclasses.replace(pipeline, master=args.master)
    if args.source is not None:
        pipeline = dataclasses.replace(pipeline, source=args.source)
    return dataclasses.replace(profile, run=run, pipeline=pipeline)


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        _say("stopping (Ctrl-C again to abort at once); a partial report will be written")
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _finish(results: list[Results], out_dir: Path, name: str) -> int:
    paths = write_report(results, out_dir, name)
    print(markdown_summary(results, paths.html))
    print(f"\nreport: {paths.html}\nsummary: {paths.markdown}")
    return exit_code(r.verdict.verdict for r in results)


def main(argv: Sequence[str], prog: str | None = None) -> int:
    """``sotw run|bench|capacity|drill ...``; exit code 0 for PASS, 1 for FAIL, 4 for INCONCLUSIVE.

    ``prog`` names the command in the usage line when another command runs through this one (``sotw demo``).
    """
    argv = list(argv)
    command = argv[0] if argv and argv[0] in ("run", "bench", "capacity", "drill") else "run"
    rest = argv[1:] if argv and argv[0] == command else argv
    if command == "drill":
        return drill_main(rest)
    args = _parser(command, prog).parse_args(rest)
    setup_logging(args)
    job = job_from_args(args)
    profile = _profile(args)
    kafka: KafkaConfig | None = cluster_config(args)
    root = args.run_dir or Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    stop = _stop_on_signals()
    cmdline = "sotw " + shlex.join([command, *rest])
    planted = ("--batch-delay", f"{args.plant_batch_delay:g}") if args.plant_batch_delay > 0 else ()
    if command == "run":
        factor = parse_load(args.load)
        request = RunRequest(
            profile,
            factor,
            root,
            kafka,
            command=cmdline,
            job=job,
            pipeline_args=planted,
            security=security_from_args(args),
            topics=topics_from_args(args),
            cleanup=args.cleanup,
            netns=args.netns,
        )
        result = execute(request, stop, _say)
        return _finish([result], root, "report")
    if command == "bench":
        results = []
        for factor in (1.0, 10.0):
            if stop.is_set():
                break
            _say(f"bench: {factor:g}x")
            results.append(
                execute(
                    RunRequest(
                        profile,
                        factor,
                        root / f"{factor:g}x",
                        kafka,
                        command=cmdline,
                        job=job,
                        pipeline_args=planted,
                        security=security_from_args(args),
                        topics=topics_from_args(args),
                        cleanup=args.cleanup,
                    ),
                    stop,
                    _say,
                )
            )
        if not results:
            raise HarnessError("bench was stopped before the first run")
        return _finish(results, root, "report")
    return capacity_main(args, profile, kafka, root, stop, job)


def capacity_main(
    args: argparse.Namespace,
    profile: Profile,
    kafka: KafkaConfig | None,
    root: Path,
    stop: threading.Event,
    job: JobSpec | None = None,
) -> int:
    """``sotw capacity``: 0 when a level was sustained (and, with ``--check``, confirmed), 1 otherwise."""
    targets = Targets.of(profile, args.p99)
    start, top = parse_load(args.start), parse_load(args.max)
    if args.method == "steps":
        found, results = steps(
            profile, root, kafka, start, top, args.refine, targets, stop=stop, progress=_say, job=job
        )
        if not results:
            raise HarnessError("capacity was stopped before the first step")
        best = max(results, key=lambda r: (r.verdict.verdict == "PASS", r.run.load_factor))
        summary = with_capacity(best, found)
        correct = True
    else:
        settings = SearchSettings(
            start=start,
            min_factor=parse_load(args.min) if args.min else start / 8,
            max_factor=top,
            hold_s=args.hold,
            budget_s=args.budget,
            tolerance=args.tolerance,
        )
        found, result = search(profile, root, kafka, settings, targets, stop, _say, job)
        correct = result.correctness is not None and result.correctness.passed
        if args.check and math.isfinite(found.max_sustained_factor) and not stop.is_set():
            _say(f"capacity: checking {found.max_sustained_factor:g}x with a whole run")
            check = execute(
                RunRequest(
                    dataclasses.replace(
                        profile,
                        run=dataclasses.replace(
                            profile.run,
                            max_lag_s=targets.max_lag_s,
                            max_end_to_end_p99_s=targets.max_e2e_p99_s,
                        ),
                    ),
                    found.max_sustained_factor,
                    root / "check",
                    kafka,
                    job=job,
                    broker_settings=SEARCH_BROKER_SETTINGS,
                ),
                stop,
                _say,
            )
            found = dataclasses.replace(
                found, steps=[*found.steps, step_of(check)], check_sustained=check.verdict.verdict == "PASS"
            )
        # The search breaks the run's bounds on purpose: its verdict is the capacity's, not the calm day's.
        reasons = [] if math.isfinite(found.max_sustained_factor) else [capacity_line(found)]
        if found.check_sustained is False:
            reasons.append("the whole run at the rate found did not PASS")
        if not correct:
            reasons += [
                f"correctness: {r}" for r in (result.correctness.reasons if result.correctness else [])
            ]
        summary = dataclasses.replace(
            with_capacity(result, found), verdict=Verdict("FAIL" if reasons else "PASS", reasons)
        )
    summary.to_json(root / "results.json")
    _finish([summary], root, "report")
    print(f"\ncapacity: {capacity_line(found)}")
    if not correct:
        print("capacity: the pipeline's output was not correct during the search; the rate is not a capacity")
    sustained = math.isfinite(found.max_sustained_factor) and found.check_sustained is not False
    return 0 if sustained and correct else 1


def capacity_line(found: Capacity) -> str:
    """The capacity in one sentence."""
    if not math.isfinite(found.max_sustained_factor):
        return f"not even the lowest level was sustained ({found.confidence})"
    check = {True: "; confirmed by a whole run", False: "; NOT confirmed by a whole run", None: ""}
    return (
        f"{found.max_sustained_rate:,.0f} msg/s ({found.max_sustained_factor:g}x), {found.confidence}"
        f"{check[found.check_sustained]}"
    )
