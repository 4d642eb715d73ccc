"""``sotw nightly``: the candidate measured beside its baseline in one run, judged on the ratios, recorded.

Each benchmark runs on the baseline (the last good night's commit, or ``--baseline REF``, checked out beside
the candidate by ``loadtest.regressions.sidebyside``) and on the candidate in turn, A B, B A, A B ..., each as its own
process with its own log: the pytest-benchmark micro benchmarks, ``benchmarks/simulator_vs_bare.py``,
``benchmarks/pipeline_vs_bare.py``, load-test runs at 1x (and 10x) and, in the full set, a game-day drill.
Every metric is judged on the ratio candidate / baseline of its pairs with a confidence bound
(``loadtest.regressions.paired``), so a busy machine slows both sides alike instead of raising an alarm. The night, with
its baseline's values and the judgements, goes into the history (``loadtest.regressions.history.Entry``) and the trend
page. The command exits 1 when a metric regressed or a benchmark failed, naming which.

Layout under the history root (default ``runs/nightly``)::

    history/<night>-<commit>.json     one entry per night and commit (the part CI keeps)
    nights/<night>-<commit>-<time>/   raw outputs and logs of that night, baseline/ and candidate/
    baselines/<commit>/               the baselines' worktrees, kept for the next night
    comparison.md                     the latest night: candidate against baseline
    trend.html                        every night, one chart per headline metric
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from loadtest.errors import HarnessError
from loadtest.regressions.config import BENCHMARKS, FULL, QUICK, NightlyConfig
from loadtest.regressions.history import (
    BenchmarkRun,
    Entry,
    load_history,
)
from loadtest.regressions.paired import PairedJudgement, judgement_lines, judgement_rows
from loadtest.regressions.sidebyside import BASELINE, CANDIDATE, Side, install_baseline, resolve
from loadtest.regressions.sides import Paired, SideRuns
from loadtest.regressions.trend import write_trend
from loadtest.reports.results import EXIT_CODES, FAIL, INCONCLUSIVE
from sotw.cliargs import add_kafka_args, kafka_settings
from sotw.clientfiles import SettingsFiles
from sotw.kafka import KafkaConfig
from sotw.processgroup import TIMED_OUT

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    """The machine's description: what must match for nights to be drawn together, and its load."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count() or 0,
        "cpu_model": model,
        "memory_gb": round(psutil.virtual_memory().total / 2**30),
        "platform_machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "loadavg_start": round(os.getloadavg()[0], 2),
    }


def choose_baseline(config: NightlyConfig, history: Sequence[Entry]) -> str:
    """The baseline commit: ``--baseline``, else the last unplanted night of the suite that passed.

    With no such night, the candidate's own commit: the gate then measures its own noise.
    """
    if config.baseline:
        return resolve(REPO, config.baseline)
    good = [e for e in history if e.verdict == "pass" and not e.planted and e.suite == config.sizes.name]
    if good and resolve_quietly(good[-1].commit):
        return good[-1].commit
    return resolve(REPO, config.commit or "HEAD")


def resolve_quietly(commit: str) -> bool:
    """Whether the repository has ``commit`` (a history may name commits of another clone)."""
    try:
        resolve(REPO, commit)
    except HarnessError:
        return False
    return True


def run_night(config: NightlyConfig, say: Callable[[str], None] = lambda _: None) -> Entry:
    """Measure baseline and candidate side by side, judge the pairs, write the history entry; return it.

    Without ``config.bootstrap`` one broker is started for the night and every benchmark uses it.
    """
    if not config.bootstrap:
        from sotw.broker import KafkaBroker

        config.root.mkdir(parents=True, exist_ok=True)
        with KafkaBroker(log_path=config.root / "broker.log") as broker:
            say(f"nightly: the night's broker at {broker.bootstrap}")
            return run_night(dataclasses.replace(config, bootstrap=broker.bootstrap, kafka_settings={}), say)
    if config.kafka_settings and not config.kafka_config_file:
        # Every command of both sides reads the settings from one private file, deleted when the night ends.
        files = SettingsFiles(config.root)
        path = files.write("kafka_config", KafkaConfig(config.bootstrap, config.kafka_settings))
        try:
            return run_night(dataclasses.replace(config, kafka_config_file=str(path)), say)
        finally:
            files.remove()
    started = time.gmtime()
    night = time.strftime("%Y-%m-%d", started)
    directory = (
        config.root
        / "nights"
        / f"{night}-{config.commit[:10] or 'nocommit'}-{time.strftime('%H%M%S', started)}"
    )
    description = machine()
    base_commit = choose_baseline(config, load_history(config.history_dir))
    say(f"nightly: baseline {base_commit[:12]}, candidate {config.commit[:12] or 'the working tree'}")
    sides = {
        BASELINE: SideRuns(config, install_baseline(REPO, config.root, base_commit, config.python, say), directory / BASELINE, say),
        CANDIDATE: SideRuns(config, Side(CANDIDATE, config.commit, REPO, config.python), directory / CANDIDATE, say),
    }  # fmt: skip
    paired = Paired.empty()
    clock = time.monotonic()
    done: dict[str, int] = {}
    seconds: dict[str, float] = {}
    produced: dict[str, set[str]] = {}

    def hung(name: str) -> bool:
        return any(s.hung(name) for s in sides.values())

    def pair(name: str) -> None:
        # A B, then B A: neither side always runs first, so a machine that warms up or slows down over the
        # night does not favour one.
        i, start = done.get(name, 0), time.monotonic()
        for side in (BASELINE, CANDIDATE) if i % 2 == 0 else (CANDIDATE, BASELINE):
            metrics = getattr(sides[side], name)(i)
            paired.add(side, i, metrics)
            produced.setdefault(name, set()).update(m.name for m in metrics)
            if hung(name):  # once is enough: each hang costs the whole time limit, and the night has failed
                say(f"nightly: {name} hung on the {side}: its other runs are skipped")
                break
        done[name] = i + 1
        seconds[name] = seconds.get(name, 0.0) + time.monotonic() - start

    for name in config.benchmarks:
        for _ in range(
            min(config.repeats, config.sizes.drill_repeats) if name == "drill" else config.repeats
        ):
            if not hung(name):
                pair(name)
    # Then more pairs of the benchmarks with a metric too noisy to judge, while the night's budget lasts.
    for name in config.benchmarks:
        while done[name] < config.most_repeats and name != "drill" and not hung(name):
            noisy = [j for j in paired.judge(produced.get(name, set())) if j.reason.startswith("too noisy")]
            left = config.sizes.budget_s - (time.monotonic() - clock)
            if not noisy or seconds[name] / done[name] > left:
                break
            say(
                f"nightly: {len(noisy)} metric(s) of {name} too noisy after {done[name]} pairs: one pair more"
            )
            pair(name)
    description["loadavg_end"] = round(os.getloadavg()[0], 2)
    judgements = paired.judge()
    runs = sides[BASELINE].runs + sides[CANDIDATE].runs
    entry = Entry(
        night=night,
        commit=config.commit,
        started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", started),
        machine=description,
        benchmarks=runs,
        metrics=paired.metrics(CANDIDATE),
        branch=config.branch,
        planted=config.planted,
        suite=config.sizes.name,
        baseline_commit=base_commit,
        baseline_metrics=paired.metrics(BASELINE),
        paired=judgements,
        verdict=night_verdict(judgements, runs),
    )
    path = entry.write(config.history_dir)
    say(f"nightly: history entry {path}")
    return entry


def night_verdict(judgements: Sequence[PairedJudgement], runs: Sequence[BenchmarkRun]) -> str:
    """``failed`` when a benchmark did not measure, ``regression`` when a metric regressed, else ``pass``."""
    if failed_benchmarks(runs):
        return "failed"
    return "regression" if any(j.status == "regression" for j in judgements) else "pass"


def failed_benchmarks(runs: Sequence[BenchmarkRun]) -> list[BenchmarkRun]:
    """Benchmarks that did not produce their measurements (a load test's FAIL or INCONCLUSIVE still measured)."""
    verdicts = {EXIT_CODES[FAIL], EXIT_CODES[INCONCLUSIVE]}
    return [
        b
        for b in runs
        if b.exit_code != 0
        and not (b.exit_code in verdicts and b.name.split("/")[-1].startswith(("bench-", "drill-")))
    ]


def how_it_ended(run: BenchmarkRun) -> str:
    """A failed command's end as the night reports it: its exit code, or that it was stopped as hung."""
    return (
        f"hung, stopped after {run.seconds:.0f} s" if run.exit_code == TIMED_OUT else f"exit {run.exit_code}"
    )


def comparison_text(entry: Entry) -> str:
    """The night as a CI log shows it: regressions first, each with its ratio, bound and both values."""
    head = (
        f"nightly {entry.label}: {len(entry.paired)} metrics, candidate {entry.commit[:10] or '-'} against "
        f"baseline {entry.baseline_commit[:10] or '-'}, side by side"
    )
    return "\n".join([head, *judgement_lines(entry.paired)])


def write_comparison(config: NightlyConfig, entry: Entry) -> Path:
    """``comparison.md`` for ``entry`` and the trend page over the whole history; return the former."""
    from loadtest.reports.pages import md_table

    text = [
        f"# sotw nightly {entry.label}",
        "",
        "```",
        comparison_text(entry),
        "```",
        "",
        md_table(judgement_rows(entry.paired)),
    ]
    failed = failed_benchmarks(entry.benchmarks)
    if failed:
        text += ["", "Failed benchmarks: " + ", ".join(f"{b.name} ({how_it_ended(b)})" for b in failed)]
    path = config.root / "comparison.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    write_trend(load_history(config.history_dir), config.root / "trend.html")
    return path


def git(*args: str) -> str:
    """One line of git's output in the repository, or "" outside a checkout."""
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=REPO, check=False, timeout=30
        )
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw nightly`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sotw nightly",
        description="Measure the candidate (this checkout) beside its baseline, benchmark by benchmark, "
        "judge each metric on the ratio of the pairs, add the night to the history and draw the trend page; "
        "exit 1 on a regression or a failed benchmark (docs/nightly.md).",
    )
    p.add_argument("--history", type=Path, default=Path("runs/nightly"), help="history root (runs/nightly)")
    p.add_argument("--repeats", type=int, default=3, help="pairs of each benchmark (3)")
    p.add_argument(
        "--max-repeats",
        type=int,
        default=0,
        help="the most pairs of a benchmark with a metric too noisy to judge, within the budget (2 x --repeats)",
    )
    p.add_argument(
        "--only", action="append", choices=BENCHMARKS, default=[], help="run only this benchmark (repeatable)"
    )
    p.add_argument(
        "--quick", action="store_true", help="small sizes and the smoke profile, no drill: minutes"
    )
    p.add_argument(
        "--drill", default="", help="the drill to run (default pipeline-kill-1x; --quick: its own)"
    )
    p.add_argument(
        "--baseline",
        default="",
        metavar="REF",
        help="the baseline commit, tag or branch (default: the last night that passed; with no history, "
        "the candidate's own commit)",
    )
    add_kafka_args(p)
    p.add_argument(
        "--command-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stop a benchmark command that runs longer, as hung (default: half the night's budget)",
    )
    p.add_argument("--compare-only", action="store_true", help="print the latest entry again; run nothing")
    p.add_argument("--plant-batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--plant-simulator-slowdown", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: Sequence[str]) -> int:
    """``sotw nightly``: 0 when every benchmark ran and nothing regressed, 1 otherwise."""
    args = build_parser().parse_args(list(argv))
    logging.basicConfig(level=logging.WARNING)

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    config = NightlyConfig(
        root=args.history,
        commit=git("rev-parse", "HEAD"),
        branch=git("rev-parse", "--abbrev-ref", "HEAD"),
        repeats=args.repeats,
        max_repeats=args.max_repeats,
        only=tuple(args.only),
        sizes=QUICK if args.quick else FULL,
        drill=args.drill,
        baseline=args.baseline,
        plant_batch_delay_s=args.plant_batch_delay,
        plant_simulator_slowdown=args.plant_simulator_slowdown,
        bootstrap=args.bootstrap or "",
        command_timeout_s=args.command_timeout,
        kafka_settings=kafka_settings(args),
    )
    if args.compare_only:
        history = load_history(config.history_dir)
        if not history:
            raise HarnessError(f"no history in {config.history_dir}: run `sotw nightly` first")
        entry = history[-1]
    else:
        entry = run_night(config, say)
    path = write_comparison(config, entry)
    print(comparison_text(entry))
    failed = failed_benchmarks(entry.benchmarks)
    for b in failed:
        print(f"FAILED benchmark {b.name}: {how_it_ended(b)} (log {b.log})")
    print(f"trend: {config.root / 'trend.html'}\ncomparison: {path}")
    return 1 if entry.verdict != "pass" else 0
