"""One side of a night (the candidate or the baseline) running each benchmark as a process of its own, and the pairs of both sides' runs interleaved A, B, A, B."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.regressions.config import NightlyConfig
from loadtest.regressions.history import BenchmarkRun, Metric
from loadtest.regressions.metrics import (
    metrics_from_pipeline_vs_bare,
    metrics_from_pytest_benchmark,
    metrics_from_results,
    metrics_from_simulator_vs_bare,
)
from loadtest.regressions.paired import PairedJudgement, judge_pair
from loadtest.regressions.sidebyside import BASELINE, CANDIDATE, Side
from loadtest.reports.results import Results
from sotw.processgroup import TIMED_OUT, run_limited

#: How long a stopped command gets to end after SIGTERM before it is killed.
STOP_GRACE_S = 10.0

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


class SideRuns:
    """Runs one side's benchmarks, one repetition at a time, into its directory; records each command."""

    def __init__(
        self, config: NightlyConfig, side: Side, directory: Path, say: Callable[[str], None]
    ) -> None:
        self.config = config
        self.side = side
        self.dir = directory
        self.say = say
        self.runs: list[BenchmarkRun] = []
        self.planted = side.name == CANDIDATE
        directory.mkdir(parents=True, exist_ok=True)

    def command(self, name: str, argv: list[str], output: Path) -> bool:
        """Run one command with its log, in the side's tree and environment; record it; True if it exited 0.

        The command and every process it starts run in a process group of their own, which is killed when
        the command ends, or when the night does however it ends (``sotw.processgroup``). A command that runs
        past ``NightlyConfig.command_limit_s`` is stopped (SIGTERM, then SIGKILL) and recorded as
        ``TIMED_OUT``; a Ctrl-C or an error of the night stops it the same way.
        """
        self.say(f"nightly: {self.side.name} {name}: {' '.join(argv[1:])}")
        log_path = self.dir / f"{name}.log"
        limit = self.config.command_limit_s
        start = time.monotonic()
        code = run_limited(argv, self.side.environment(), log_path, limit, STOP_GRACE_S, cwd=self.side.tree)
        if code == TIMED_OUT:  # after the group is gone: nothing of the command writes to the log any more
            with log_path.open("a") as log:
                log.write(f"\nnightly: stopped at the limit of {limit:.0f} s a command may run\n")
        seconds = time.monotonic() - start
        self.runs.append(
            BenchmarkRun(
                f"{self.side.name}/{name}", argv, round(seconds, 1), code, str(output), str(log_path)
            )
        )
        ended = "was stopped (hung)" if code == TIMED_OUT else f"exited {code}"
        self.say(f"nightly: {self.side.name} {name} {ended} after {seconds:.0f} s")
        return code == 0

    def hung(self, benchmark: str) -> bool:
        """Whether a command of ``benchmark`` was stopped as hung on this side."""
        return any(
            r.exit_code == TIMED_OUT and r.name.split("/")[-1].startswith(f"{benchmark}-") for r in self.runs
        )

    def _script(self, name: str, *args: str) -> list[str]:
        # A baseline's script older than --kafka-config runs without it (and fails on a secured cluster).
        settings = self._kafka_config() if self._takes(name, "--kafka-config") else []
        return [
            self.side.python,
            str(self.side.tree / "benchmarks" / name),
            "--bootstrap",
            self.config.bootstrap,
            *settings,
            *args,
        ]

    def _kafka_config(self) -> list[str]:
        """``--kafka-config FILE`` when the night has settings: the file's path, never the settings."""
        return ["--kafka-config", self.config.kafka_config_file] if self.config.kafka_config_file else []

    def _takes(self, script: str, option: str) -> bool:
        """Whether this side's copy of a benchmark script has ``option``: a baseline older than it has not."""
        return f'"{option}"' in (self.side.tree / "benchmarks" / script).read_text()

    def _sotw(self, command: str, *args: str) -> list[str]:
        return [
            self.side.python, "-m", "sotw", command, "--bootstrap", self.config.bootstrap, *self._kafka_config(), *args
        ]  # fmt: skip

    def micro(self, i: int) -> list[Metric]:
        """Repetition ``i`` of the pytest-benchmark micro benchmarks."""
        out = self.dir / f"micro-{i + 1}.json"
        argv = [self.side.python, "-m", "pytest", "benchmarks", "--benchmark-only", f"--benchmark-json={out}",
                "-q", "-p", "no:cacheprovider", "--benchmark-min-rounds=5", "--benchmark-max-time=0.3"]  # fmt: skip
        if self.command(f"micro-{i + 1}", argv, out):
            return metrics_from_pytest_benchmark(json.loads(out.read_text()))
        return []

    def simulator_vs_bare(self, i: int) -> list[Metric]:
        """Repetition ``i`` of benchmarks/simulator_vs_bare.py (the simulator's rate against bare producer loops)."""
        out = self.dir / f"simulator_vs_bare-{i + 1}.json"
        argv = self._script("simulator_vs_bare.py", "--messages", str(self.config.sizes.simulator_messages),
                            "--repeats", "1", "--json", str(out))  # fmt: skip
        if self._takes("simulator_vs_bare.py", "--sides"):
            argv += ["--sides", "bare,simulator"]  # the two the night's metrics read
        if self.planted and self.config.plant_simulator_slowdown > 0:
            argv += ["--plant-slowdown", f"{self.config.plant_simulator_slowdown:g}"]
        if self.command(f"simulator_vs_bare-{i + 1}", argv, out):
            return metrics_from_simulator_vs_bare(json.loads(out.read_text()))
        return []

    def pipeline_vs_bare(self, i: int) -> list[Metric]:
        """Repetition ``i`` of benchmarks/pipeline_vs_bare.py (the pipeline's drain against a bare consumer)."""
        out = self.dir / f"pipeline_vs_bare-{i + 1}.json"
        sizes = self.config.sizes
        # Two rounds: the first pays for the JVM's first query (``cold_rate``), the second is the ratio.
        argv = self._script("pipeline_vs_bare.py", "--messages", str(sizes.pipeline_messages),
                            "--max-offsets", str(sizes.pipeline_max_offsets), "--sensors", str(sizes.pipeline_sensors),
                            "--repeats", "2", "--json", str(out))  # fmt: skip
        if self.planted and self.config.plant_batch_delay_s > 0:
            argv += ["--batch-delay", f"{self.config.plant_batch_delay_s:g}"]
        if self.command(f"pipeline_vs_bare-{i + 1}", argv, out):
            return metrics_from_pipeline_vs_bare(json.loads(out.read_text()))
        return []

    def bench(self, i: int) -> list[Metric]:
        """Repetition ``i`` of ``sotw run`` at each of the night's loads."""
        sizes = self.config.sizes
        metrics: list[Metric] = []
        for load in sizes.bench_loads:
            where = self.dir / f"bench-{load}-{i + 1}"
            argv = self._sotw("run", "--profile", sizes.bench_profile, "--load", load,
                              "--steady", f"{sizes.bench_steady_s:g}", "--run-dir", str(where), "-q")  # fmt: skip
            if self.planted and self.config.plant_batch_delay_s > 0:
                argv += ["--plant-batch-delay", f"{self.config.plant_batch_delay_s:g}"]
            # A FAIL verdict exits 1 and is a measurement too (its lag and latency are in the figures); a run
            # stopped as hung wrote the partial results of a run that measured nothing.
            self.command(f"bench-{load}-{i + 1}", argv, where)
            if self.runs[-1].exit_code != TIMED_OUT and (where / "results.json").is_file():
                results = Results.from_json(where / "results.json")
                metrics += metrics_from_results(f"bench_{load}", [results], drain=False)
        return metrics

    def drill(self, i: int) -> list[Metric]:
        """Repetition ``i`` of the night's drill."""
        drill = self.config.drill
        if not drill and self.config.sizes.name == "quick":
            path = self.dir / "quick-drill.toml"
            path.write_text(QUICK_DRILL)
            drill = str(path)
        where = self.dir / f"drill-{i + 1}"
        self.command(
            f"drill-{i + 1}",
            self._sotw("drill", drill or "pipeline-kill-1x", "--run-dir", str(where), "-q"),
            where,
        )
        if self.runs[-1].exit_code != TIMED_OUT and (where / "results.json").is_file():
            return metrics_from_results("drill", [Results.from_json(where / "results.json")], drain=False)
        return []


@dataclass
class Paired:
    """Each metric's values on both sides, by repetition (NaN where a repetition did not measure it)."""

    kinds: dict[str, tuple[str, str, str]]
    values: dict[str, dict[str, list[float]]]

    @classmethod
    def empty(cls) -> Paired:
        """No values yet."""
        return cls({}, {BASELINE: {}, CANDIDATE: {}})

    def add(self, side: str, repetition: int, metrics: Sequence[Metric]) -> None:
        """One side's metrics of one repetition; a metric with several values counts as their median."""
        for m in metrics:
            self.kinds.setdefault(m.name, (m.kind, m.better, m.unit))
            for each in (BASELINE, CANDIDATE):
                row = self.values[each].setdefault(m.name, [])
                row.extend([math.nan] * (repetition + 1 - len(row)))
            self.values[side][m.name][repetition] = m.median

    def metrics(self, side: str) -> list[Metric]:
        """One side's metrics, a value per repetition."""
        return [Metric(n, k, b, list(self.values[side][n]), u) for n, (k, b, u) in self.kinds.items()]

    def judge(self, names: set[str] | None = None) -> list[PairedJudgement]:
        """Every metric (or those ``names``) judged on its pairs."""
        return [
            judge_pair(n, k, b, self.values[BASELINE][n], self.values[CANDIDATE][n], u)
            for n, (k, b, u) in self.kinds.items()
            if names is None or n in names
        ]


# The drill of a quick night (``--quick --only drill``): kill -9 of the pipeline on the smoke profile.
