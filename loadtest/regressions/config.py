"""A night's settings: its sizes (the full night's and --quick's), the benchmarks it runs, the baseline, the repeats and budget, the regressions planted by the gate's own tests."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.errors import HarnessError

BENCHMARKS = ("micro", "simulator_vs_bare", "pipeline_vs_bare", "bench", "drill")


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs: the full night, or ``--quick`` for a check that takes minutes.

    ``drill_repeats`` caps the drill's pairs (a drill is the longest benchmark: with one pair it is reported,
    not judged); ``benchmarks`` are the ones the set runs by default; ``budget_s`` is the time the night may
    take, baseline included, which the pairs added for noisy metrics may not exceed.
    """

    name: str
    simulator_messages: int
    pipeline_messages: int
    pipeline_max_offsets: int
    pipeline_sensors: int
    bench_profile: str
    bench_steady_s: float
    bench_loads: tuple[str, ...]
    benchmarks: tuple[str, ...]
    drill_repeats: int = 1
    budget_s: float = 1740.0


FULL = Sizes("full", 2_000_000, 200_000, 25_000, 24, "baseline", 20.0, ("1x", "10x"), BENCHMARKS)


QUICK = Sizes(
    "quick",
    2_000_000,
    16_000,
    4_000,
    4,
    "smoke",
    10.0,
    ("1x",),
    ("micro", "simulator_vs_bare", "pipeline_vs_bare", "bench"),
    budget_s=570.0,
)


@dataclass(frozen=True)
class NightlyConfig:
    """One night.

    Parameters
    ----------
    root
        The history root (``runs/nightly``).
    commit, branch
        What is measured, the candidate (the CLI reads them from git).
    repeats
        Pairs of each benchmark: baseline and candidate run this many times each, interleaved.
    only
        Run only these benchmarks (``BENCHMARKS``); empty for the set of ``sizes``.
    sizes
        ``FULL`` or ``QUICK``.
    drill
        The drill's name or file; empty for the quick night's own drill (with ``QUICK``) or the shipped
        ``pipeline-kill-1x``.
    baseline
        The baseline's ref; empty for the last good night's commit of the same suite, or the candidate's own
        commit when the history has none (the gate then checks its own noise).
    plant_batch_delay_s, plant_simulator_slowdown
        The self-test's planted regressions, on the candidate only: sotw pipeline's micro-batches each wait
        this long (in the pipeline benchmark and the load tests); the simulator sends this fraction slower.
    python
        The candidate's interpreter (this one).
    max_repeats
        The most pairs of a benchmark when a metric of it is too noisy to judge after ``repeats`` (0: twice
        ``repeats``); extra pairs stop when the night's budget (``Sizes.budget_s``) would be passed.
    bootstrap
        The Kafka cluster every benchmark of both sides uses; empty to start one broker for the night (both
        sides then meet the same broker, as they meet the same machine).
    command_timeout_s
        The longest one benchmark command may run before it is stopped as hung; 0 for half the night's budget.
    kafka_settings
        librdkafka settings for ``bootstrap`` (``--kafka-config``/``-X``). The night hands them to each
        command in a private file (``kafka_config_file``), never as arguments.
    kafka_config_file
        That file while the night runs (``run_night`` writes it, mode 0600, and deletes it at the end).
    """

    root: Path
    commit: str = ""
    branch: str = ""
    repeats: int = 3
    only: tuple[str, ...] = ()
    sizes: Sizes = FULL
    drill: str = ""
    baseline: str = ""
    plant_batch_delay_s: float = 0.0
    plant_simulator_slowdown: float = 0.0
    python: str = sys.executable
    bootstrap: str = ""
    max_repeats: int = 0
    command_timeout_s: float = 0.0
    kafka_settings: Mapping[str, str] = field(default_factory=dict)
    kafka_config_file: str = ""

    def __post_init__(self) -> None:
        # Each side's commands run in that side's own tree, so a path given relative to where the night was
        # started (``runs/nightly``, a drill file) would name another place, or nothing, on the baseline's side.
        object.__setattr__(self, "root", self.root.resolve())
        if Path(self.drill).suffix and Path(self.drill).is_file():  # a name without one is a shipped drill
            object.__setattr__(self, "drill", str(Path(self.drill).resolve()))
        unknown = sorted(set(self.only) - set(BENCHMARKS))
        if unknown:
            raise HarnessError(f"no benchmark {unknown[0]!r}: choose from {', '.join(BENCHMARKS)}")
        if not self.command_timeout_s >= 0:
            raise HarnessError(
                f"--command-timeout must be positive, or 0 for the default, got {self.command_timeout_s:g}"
            )
        if self.repeats < 1:
            raise HarnessError(f"--repeats must be at least 1, got {self.repeats}")
        if not 0.0 <= self.plant_simulator_slowdown < 1.0:
            raise HarnessError(
                f"--plant-simulator-slowdown must be in [0, 1), got {self.plant_simulator_slowdown}"
            )

    @property
    def history_dir(self) -> Path:
        """Where the entries are."""
        return self.root / "history"

    @property
    def benchmarks(self) -> tuple[str, ...]:
        """The benchmarks this night runs, in order."""
        return tuple(b for b in BENCHMARKS if b in self.only) if self.only else self.sizes.benchmarks

    @property
    def command_limit_s(self) -> float:
        """The longest one benchmark command may run before it is stopped as hung.

        By default half the night's budget: a command that long leaves no time for its other side, so it is
        hung (a broker that stopped answering, a process that never ends), and the night goes on without it
        instead of never ending.
        """
        return self.command_timeout_s or self.sizes.budget_s / 2

    @property
    def most_repeats(self) -> int:
        """The most pairs of one benchmark."""
        return max(self.repeats, self.max_repeats or 2 * self.repeats)

    @property
    def planted(self) -> dict[str, str]:
        """The regressions planted in the candidate, for its entry."""
        out = {}
        if self.plant_batch_delay_s > 0:
            out["batch_delay_s"] = f"{self.plant_batch_delay_s:g}"
        if self.plant_simulator_slowdown > 0:
            out["simulator_slowdown"] = f"{self.plant_simulator_slowdown:g}"
        return out
