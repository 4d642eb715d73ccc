"""``sotw nightly``: the benchmark set, its history entry, the comparison with a baseline and the trend page.

One night runs, each as its own process with its own log: the pytest-benchmark micro benchmarks,
``benchmarks/simulator_vs_bare.py``, ``benchmarks/pipeline_vs_bare.py``, ``sotw bench`` (1x and 10x) and a
game-day drill, each repeated so its noise can be stated. Their raw outputs stay in the night's directory;
their headline metrics go into one history entry (``loadtest.history.Entry``), which is judged against the
nights before it. The command exits 1 when a metric regressed or a benchmark failed, naming which.

Layout under the history root (default ``runs/nightly``)::

    history/<night>-<commit>.json     one entry per night and commit (the part CI keeps)
    nights/<night>-<commit>/          raw outputs and logs of that night
    comparison.md                     the latest night against its baseline
    trend.html                        every night, one chart per headline metric
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from loadtest.errors import HarnessError
from loadtest.history import (
    BenchmarkRun,
    Comparison,
    Entry,
    Metric,
    Thresholds,
    baseline_of,
    compare,
    comparison_rows,
    comparison_text,
    load_history,
    metrics_from_pipeline_vs_bare,
    metrics_from_pytest_benchmark,
    metrics_from_results,
    metrics_from_simulator_vs_bare,
)
from loadtest.results import Results
from loadtest.trend import write_trend

log = logging.getLogger(__name__)

BENCHMARKS = ("micro", "simulator_vs_bare", "pipeline_vs_bare", "bench", "drill")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs: the full night, or ``--quick`` for a check that takes minutes."""

    name: str
    simulator_messages: int
    pipeline_messages: int
    pipeline_max_offsets: int
    pipeline_sensors: int
    bench_profile: str
    bench_steady_s: float


FULL = Sizes("full", 300_000, 200_000, 25_000, 24, "baseline", 30.0)
QUICK = Sizes("quick", 60_000, 16_000, 4_000, 4, "smoke", 10.0)

# The drill of a quick night: kill -9 of the pipeline on the smoke profile (the shipped drills use baseline).
QUICK_DRILL = """[drill]
description = "kill -9 of the pipeline on the smoke profile, restarted 3 s later (the quick nightly's drill)"
profile = "smoke"
load = "1x"
run = { steady_s = 20, max_lag_s = 600, drain_max_s = 300 }

[[incidents]]
kind = "pipeline_kill"
at_s = 5
restart_after_s = 3

[expect]
rows_lost = 0
rows_repeated = 0
"""


@dataclass(frozen=True)
class NightlyConfig:
    """One night.

    Parameters
    ----------
    root
        The history root (``runs/nightly``).
    commit, branch
        What was measured (the CLI reads them from git).
    repeats
        Repetitions of each benchmark (rounds inside the script where it has them).
    only
        Run only these benchmarks (``BENCHMARKS``); empty for all.
    sizes
        ``FULL`` or ``QUICK``.
    drill
        The drill's name or file; empty for the quick night's own drill (with ``QUICK``) or the shipped
        ``pipeline-kill-1x``.
    baseline_nights
        How many earlier nights make the baseline.
    thresholds
        How far a metric may move before it is a regression.
    plant_batch_delay_s
        The self-test's planted regression: the pipeline benchmark's micro-batches each wait this long.
    python
        The interpreter that runs the benchmarks (this one).
    """

    root: Path
    commit: str = ""
    branch: str = ""
    repeats: int = 3
    only: tuple[str, ...] = ()
    sizes: Sizes = FULL
    drill: str = ""
    baseline_nights: int = 7
    thresholds: Thresholds = field(default_factory=Thresholds)
    plant_batch_delay_s: float = 0.0
    python: str = sys.executable

    def __post_init__(self) -> None:
        unknown = sorted(set(self.only) - set(BENCHMARKS))
        if unknown:
            raise HarnessError(f"no benchmark {unknown[0]!r}: choose from {', '.join(BENCHMARKS)}")
        if self.repeats < 1:
            raise HarnessError(f"--repeats must be at least 1, got {self.repeats}")

    @property
    def history_dir(self) -> Path:
        """Where the entries are."""
        return self.root / "history"


def machine() -> dict[str, Any]:
    """The machine's description: what must match for nights to be compared, and its load."""
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


class _Night:
    """Runs one night's benchmarks into its directory and collects their metrics."""

    def __init__(
        self, config: NightlyConfig, night: str, directory: Path, say: Callable[[str], None]
    ) -> None:
        self.config = config
        self.night = night
        self.dir = directory
        self.say = say
        self.runs: list[BenchmarkRun] = []
        self.metrics: list[Metric] = []

    def command(self, name: str, argv: list[str], output: Path) -> bool:
        """Run one command with its log; record it; True if it exited 0."""
        self.say(f"nightly: {name}: {' '.join(argv[1:])}")
        log_path = self.dir / f"{name}.log"
        start = time.monotonic()
        with log_path.open("ab") as out:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False, cwd=REPO).returncode  # fmt: skip
        seconds = time.monotonic() - start
        self.runs.append(BenchmarkRun(name, argv, round(seconds, 1), code, str(output), str(log_path)))
        self.say(f"nightly: {name} exited {code} after {seconds:.0f} s (log {log_path})")
        return code == 0

    def micro(self) -> None:
        out = self.dir / "micro.json"
        argv = [self.config.python, "-m", "pytest", "benchmarks", "--benchmark-only", f"--benchmark-json={out}",
                "-q", "-p", "no:cacheprovider", f"--benchmark-min-rounds={max(5, self.config.repeats)}"]  # fmt: skip
        if self.command("micro", argv, out):
            self.metrics += metrics_from_pytest_benchmark(json.loads(out.read_text()))

    def simulator_vs_bare(self) -> None:
        out = self.dir / "simulator_vs_bare.json"
        argv = [self.config.python, str(REPO / "benchmarks" / "simulator_vs_bare.py"),
                "--messages", str(self.config.sizes.simulator_messages), "--repeats", str(self.config.repeats),
                "--json", str(out)]  # fmt: skip
        if self.command("simulator_vs_bare", argv, out):
            self.metrics += metrics_from_simulator_vs_bare(json.loads(out.read_text()))

    def pipeline_vs_bare(self) -> None:
        out = self.dir / "pipeline_vs_bare.json"
        sizes = self.config.sizes
        argv = [self.config.python, str(REPO / "benchmarks" / "pipeline_vs_bare.py"),
                "--messages", str(sizes.pipeline_messages), "--max-offsets", str(sizes.pipeline_max_offsets),
                "--sensors", str(sizes.pipeline_sensors), "--repeats", str(self.config.repeats),
                "--json", str(out)]  # fmt: skip
        if self.config.plant_batch_delay_s > 0:
            argv += ["--batch-delay", str(self.config.plant_batch_delay_s)]
        if self.command("pipeline_vs_bare", argv, out):
            self.metrics += metrics_from_pipeline_vs_bare(json.loads(out.read_text()))

    def _sotw(self, *args: str) -> list[str]:
        return [self.config.python, "-m", "sotw", *args]

    def bench(self) -> None:
        sizes = self.config.sizes
        by_load: dict[str, list[Results]] = {"1x": [], "10x": []}
        for i in range(self.config.repeats):
            where = self.dir / f"bench-{i + 1}"
            argv = self._sotw("bench", "--profile", sizes.bench_profile, "--steady", f"{sizes.bench_steady_s:g}",
                              "--run-dir", str(where), "-q")  # fmt: skip
            # A FAIL verdict exits 1 and is a measurement too (its lag and latency are in the figures).
            self.command(f"bench-{i + 1}", argv, where)
            for load in by_load:
                path = where / load / "results.json"
                if path.is_file():
                    by_load[load].append(Results.from_json(path))
        for load, runs in by_load.items():
            if runs:
                self.metrics += metrics_from_results(f"bench_{load}", runs)

    def drill(self) -> None:
        drill = self.config.drill
        if not drill and self.config.sizes is QUICK:
            path = self.dir / "quick-drill.toml"
            path.write_text(QUICK_DRILL)
            drill = str(path)
        drill = drill or "pipeline-kill-1x"
        runs = []
        for i in range(self.config.repeats):
            where = self.dir / f"drill-{i + 1}"
            self.command(f"drill-{i + 1}", self._sotw("drill", drill, "--run-dir", str(where), "-q"), where)
            if (where / "results.json").is_file():
                runs.append(Results.from_json(where / "results.json"))
        if runs:
            self.metrics += metrics_from_results("drill", runs)


def run_night(config: NightlyConfig, say: Callable[[str], None] = lambda _: None) -> Entry:
    """Run the benchmark set once and write its history entry; return it."""
    started = time.gmtime()
    night = time.strftime("%Y-%m-%d", started)
    directory = (
        config.root
        / "nights"
        / f"{night}-{config.commit[:10] or 'nocommit'}-{time.strftime('%H%M%S', started)}"
    )
    directory.mkdir(parents=True, exist_ok=True)
    description = machine()
    runner = _Night(config, night, directory, say)
    for name in config.only or BENCHMARKS:
        getattr(runner, name)()
    description["loadavg_end"] = round(os.getloadavg()[0], 2)
    planted = {"batch_delay_s": f"{config.plant_batch_delay_s:g}"} if config.plant_batch_delay_s > 0 else {}
    entry = Entry(
        night=night,
        commit=config.commit,
        started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", started),
        machine=description,
        benchmarks=runner.runs,
        metrics=runner.metrics,
        branch=config.branch,
        planted=planted,
        suite=config.sizes.name,
    )
    path = entry.write(config.history_dir)
    say(f"nightly: history entry {path}")
    return entry


def judge(config: NightlyConfig, entry: Entry) -> Comparison:
    """Compare ``entry`` with its baseline; write ``comparison.md`` and ``trend.html``."""
    from loadtest.report import _md_table

    history = load_history(config.history_dir)
    comparison = compare(entry, baseline_of(entry, history, config.baseline_nights), config.thresholds)
    failed = failed_benchmarks(entry)
    text = [
        f"# sotw nightly {entry.label}",
        "",
        "```",
        comparison_text(comparison),
        "```",
        "",
        _md_table(comparison_rows(comparison)),
    ]
    if failed:
        text += ["", "Failed benchmarks: " + ", ".join(f"{b.name} (exit {b.exit_code})" for b in failed)]
    (config.root / "comparison.md").write_text("\n".join(text) + "\n", encoding="utf-8")
    write_trend(history, config.root / "trend.html", config.baseline_nights, config.thresholds)
    return comparison


def failed_benchmarks(entry: Entry) -> list[BenchmarkRun]:
    """Benchmarks that did not produce their measurements (a load test's FAIL verdict still measured)."""
    return [
        b
        for b in entry.benchmarks
        if b.exit_code != 0 and not (b.exit_code == 1 and b.name.startswith(("bench-", "drill-")))
    ]


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
        description="Run the benchmark set, add the night to the history, compare it with the nights before "
        "it and draw the trend page; exit 1 on a regression or a failed benchmark (docs/nightly.md).",
    )
    p.add_argument("--history", type=Path, default=Path("runs/nightly"), help="history root (runs/nightly)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of each benchmark (3)")
    p.add_argument(
        "--only", action="append", choices=BENCHMARKS, default=[], help="run only this benchmark (repeatable)"
    )
    p.add_argument(
        "--quick", action="store_true", help="small sizes and the smoke profile: minutes, not an hour"
    )
    p.add_argument(
        "--drill", default="", help="the drill to run (default pipeline-kill-1x; --quick: its own)"
    )
    p.add_argument("--baseline", type=int, default=7, help="nights in the baseline (7)")
    p.add_argument("-k", type=float, default=3.0, help="threshold in multiples of the noise (3)")
    p.add_argument("--compare-only", action="store_true", help="judge the latest entry again; run nothing")
    p.add_argument("--plant-batch-delay", type=float, default=0.0, help=argparse.SUPPRESS)
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
        only=tuple(args.only),
        sizes=QUICK if args.quick else FULL,
        drill=args.drill,
        baseline_nights=args.baseline,
        thresholds=Thresholds(k=args.k),
        plant_batch_delay_s=args.plant_batch_delay,
    )
    if args.compare_only:
        history = load_history(config.history_dir)
        if not history:
            raise HarnessError(f"no history in {config.history_dir}: run `sotw nightly` first")
        entry = history[-1]
    else:
        entry = run_night(config, say)
    comparison = judge(config, entry)
    print(comparison_text(comparison))
    failed = failed_benchmarks(entry)
    for b in failed:
        print(f"FAILED benchmark {b.name}: exit code {b.exit_code} (log {b.log})")
    print(f"trend: {config.root / 'trend.html'}\ncomparison: {config.root / 'comparison.md'}")
    return 1 if comparison.regressions or failed else 0
