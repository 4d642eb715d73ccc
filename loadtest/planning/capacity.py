"""``sotw capacity``: the highest rate the pipeline sustains on this machine, found in one run.

**Search** (the default), in the spirit of OpenMessaging Benchmark's rate controller for ``producerRate: 0``:
one run whose load a controller moves during the steady phase. Each level is held for ``hold_s`` seconds and
judged from the live samples: sustained while the age of the oldest unprocessed message stays within the
profile's lag bound and the end-to-end latency it implies (at worst that age plus the batch's duration) within
the p99 target, and the job reads what is sent (``keepup``). A sustained level doubles the rate (until a
level breaks) or moves it halfway up to the lowest broken one; a broken level moves it halfway down to the
highest sustained one (or halves it), after the backlog has drained. The search ends when the two are within
``tolerance`` of each other, and the rest of the run holds the highest sustained level as a confirmation.
After the run every level is judged again from what really happened: the lag and commit samples of its window
and the exact end-to-end p99 of the messages meant for it (from the ledger and the output's commit markers).
The result is that level's rate, with the bracket ``[highest sustained, lowest broken]`` as its confidence.

**Steps** (``--method steps``) keeps the older search as a check: each step is a whole run with its own verdict,
doubling until one fails, then bisecting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident, Stage
from loadtest.measure.figures import BATCH_STEP, LATENCY_FILE
from loadtest.planning.keepup import commit_to_commit, falls_behind
from loadtest.reports.results import Capacity, CapacityStep, Results
from loadtest.run.job import JobSpec
from loadtest.run.profile import Profile
from loadtest.run.runner import RunRequest, execute
from sotw.kafka import KafkaConfig

#: The local broker's settings for a search's runs. A search breaks levels on purpose and backs off only once
#: lag has grown past twice its bound; the local broker keeps 128 MiB a partition (docs/broker.md), which at
#: the rates a search reaches is seconds of the busiest partition, so it would delete records the pipeline
#: has not read and stop it with a data-loss error, a limit of the broker's settings and not of the pipeline.
#: Time retention (10 minutes) still bounds the disk. A cluster given with ``--bootstrap`` keeps its own.
SEARCH_BROKER_SETTINGS = {"log.retention.bytes": "-1"}


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Targets:
    """What "sustained" means: the lag bound and the end-to-end p99 target, in seconds."""

    max_lag_s: float
    max_e2e_p99_s: float

    @classmethod
    def of(cls, profile: Profile, p99_s: float | None = None) -> Targets:
        """The profile's lag bound and ``p99_s`` (default: the profile's end-to-end bound, else twice the lag)."""
        run = profile.run
        target = p99_s if p99_s is not None else run.max_end_to_end_p99_s
        return cls(run.max_lag_s, target if target is not None else 2 * run.max_lag_s)


@dataclass(frozen=True)
class SearchSettings:
    """How the controller moves the load.

    Parameters
    ----------
    start
        The first load factor.
    min_factor, max_factor
        The search stays within these; a search that breaks at ``min_factor`` has found nothing sustained.
    hold_s
        How long each level is held before it is judged (its first ``settle_s`` are not judged: the backlog of
        the level before is still draining).
    settle_s
        See ``hold_s``.
    budget_s
        The whole search; the run's steady phase lasts this long plus a margin.
    tolerance
        The search has converged when the lowest broken level is within this share above the highest
        sustained one.
    """

    start: float = 1.0
    min_factor: float = 0.125
    max_factor: float = 64.0
    hold_s: float = 20.0
    settle_s: float = 5.0
    budget_s: float = 240.0
    tolerance: float = 0.15

    def __post_init__(self) -> None:
        if not 0 < self.min_factor <= self.start <= self.max_factor:
            raise HarnessError(
                f"capacity needs 0 < --min <= --start <= --max, got {self.min_factor:g}, {self.start:g}, {self.max_factor:g}"
            )
        if self.hold_s <= self.settle_s or self.budget_s < self.hold_s:
            raise HarnessError(
                f"capacity needs --hold ({self.hold_s:g} s) above the settle time ({self.settle_s:g} s) and a "
                f"--budget ({self.budget_s:g} s) of at least one hold"
            )


@dataclass
class Level:
    """One load factor the controller held: its window (epoch seconds) and its live judgement."""

    factor: float
    start: float
    end: float = 0.0
    sustained: bool | None = None
    lag_p95_s: float = math.nan
    e2e_estimate_s: float = math.nan
    confirmation: bool = False


class Controller:
    """The search's state, moved by ``RateSearch.tick`` from the samples the run's sampler writes."""

    def __init__(self, samples: Path, targets: Targets, settings: SearchSettings) -> None:
        self.samples = samples
        self.targets = targets
        self.settings = settings
        self.rows: list[dict[str, Any]] = []
        self._pos = 0
        self.levels: list[Level] = []
        self.low = 0.0
        self.high = math.inf
        self.converged = False
        self.recovering_since: float | None = None

    def read(self) -> None:
        """Take the sampler's new rows (whole lines only)."""
        if not self.samples.is_file():
            return
        with self.samples.open() as f:
            f.seek(self._pos)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._pos += len(line.encode())
                try:
                    self.rows.append(json.loads(line))
                except ValueError:
                    continue

    def window(self, start: float, end: float) -> list[dict[str, Any]]:
        """The rows sampled between ``start`` and ``end`` (epoch seconds)."""
        return [r for r in self.rows if start <= float(r.get("ts", 0.0)) <= end]

    def judge(self, rows: list[dict[str, Any]]) -> tuple[bool, float, float]:
        """(sustained, lag age p95, end-to-end estimate) over ``rows``; a level that falls behind is not sustained.

        The estimate is the worst of the oldest unprocessed message's age plus the batch time then: a message
        is committed one batch after it was read. It is deliberately the worst and not a percentile: the exact
        p99 afterwards also counts the producer's lateness, which the live samples cannot see.
        """
        age = np.array([float(r.get("lag_age_s", 0.0)) for r in rows])
        batch = np.array([float(r.get("batch_duration_ms", 0.0)) / 1000.0 for r in rows])
        if not len(age):
            return False, math.nan, math.nan
        lag, e2e = float(np.percentile(age, 95)), float(np.max(age + batch))
        within = lag <= self.targets.max_lag_s and e2e <= self.targets.max_e2e_p99_s
        return within and not falls_behind(rows), lag, e2e

    def next_factor(self, factor: float, sustained: bool) -> float | None:
        """Where to go after ``factor`` was judged; None when the search is over."""
        s = self.settings
        if sustained:
            self.low = max(self.low, factor)
        else:
            self.high = min(self.high, factor)
        if math.isfinite(self.high) and self.low and self.high - self.low <= s.tolerance * self.low:
            return None
        if not math.isfinite(self.high):
            nxt = factor * 2
            return None if nxt > s.max_factor else nxt
        nxt = (self.low + self.high) / 2 if self.low else self.high / 2
        return None if nxt < s.min_factor else round(nxt, 4)

    def step(self, stage: Stage, now: float) -> None:
        """Judge the current level when its hold is over (or at once when it breaks badly); move on."""
        self.read()
        level = self.levels[-1]
        if self.recovering_since is not None:
            # Wait for the backlog of a broken level to drain before the next level's clock starts.
            recent = self.window(now - 3, now)
            drained = (
                recent and max(float(r.get("lag_age_s", 0.0)) for r in recent) <= self.targets.max_lag_s / 2
            )
            if drained or now - self.recovering_since > 2 * self.settings.hold_s:
                self.recovering_since = None
                level.start = now
            return
        if self.converged:
            return
        judged = self.window(level.start + self.settings.settle_s, now)
        age_now = float(judged[-1].get("lag_age_s", 0.0)) if judged else 0.0
        broke_badly = age_now > 2 * self.targets.max_lag_s
        if now - level.start < self.settings.hold_s and not broke_badly:
            return
        sustained, level.lag_p95_s, level.e2e_estimate_s = self.judge(judged)
        sustained = sustained and not broke_badly
        level.sustained, level.end = sustained, now
        nxt = self.next_factor(level.factor, sustained)
        if nxt is None:
            self.converged = True
            final = self.low or self.settings.min_factor
            self.levels.append(Level(final, now, confirmation=True))
            stage.set_load_factor(final)
            if not sustained:
                self.recovering_since = now
            return
        self.levels.append(Level(nxt, now))
        stage.set_load_factor(nxt)
        if not sustained:
            self.recovering_since = now


@dataclass(frozen=True)
class RateSearch(Incident):
    """The search as an incident of the run: it begins with the steady phase and moves the load each tick."""

    kind: ClassVar[str] = "rate_search"
    controller: Controller | None = field(default=None, compare=False)
    budget_s: float = 240.0

    @property
    def duration(self) -> float:
        """The search's budget."""
        return self.budget_s

    def begin(self, stage: Stage) -> str:
        """Start at the first level."""
        assert self.controller is not None
        start = self.controller.settings.start
        self.controller.levels.append(Level(start, _now()))
        stage.set_load_factor(start)
        return f"rate search from {start:g}x"

    def tick(self, stage: Stage, into_s: float) -> None:
        """Judge and move."""
        assert self.controller is not None
        self.controller.step(stage, _now())

    def end(self, stage: Stage) -> str:
        """Close the last level."""
        assert self.controller is not None
        last = self.controller.levels[-1]
        last.end = last.end or _now()
        c = self.controller
        return f"rate search over: highest sustained {c.low:g}x, lowest broken {c.high:g}x"


def _now() -> float:
    import time

    return time.time()


# ------------------------------------------------------------------------------------ after the run


def judge_levels(
    run_dir: Path,
    samples: list[dict[str, Any]],
    levels: list[Level],
    targets: Targets,
    settle_s: float,
    base_rate: float,
) -> list[CapacityStep]:
    """Each level judged again from what really happened in its window (after its first ``settle_s``).

    Sustained when the lag age p95 of its samples is within the bound, the job read what was sent in the
    window (``falls_behind``) and the exact end-to-end p99 of the messages meant for it is within the target:
    the latencies the run measured from its output, whatever its contract and format
    (``loadtest.measure.figures.LATENCY_FILE``).
    """
    path = run_dir / LATENCY_FILE
    e2e = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
    intended = e2e["intended_ts"].to_numpy(dtype=float) / 1000.0 if len(e2e) else np.zeros(0)
    latency = e2e["latency_ms"].to_numpy(dtype=float) if len(e2e) else np.zeros(0)
    steps = []
    for level in levels:
        if not level.end:
            continue
        start, end = level.start + settle_s, level.end
        rows = [r for r in samples if start <= float(r.get("ts", 0.0)) <= end]
        ages = [float(r.get("lag_age_s", 0.0)) for r in rows]
        mine = latency[(intended >= start) & (intended < end)]
        lag = float(np.percentile(ages, 95)) if ages else math.nan
        p99 = float(np.quantile(mine, 0.99, method="inverted_cdf")) if len(mine) else math.nan
        sustained = (
            math.isfinite(lag)
            and math.isfinite(p99)
            and lag <= targets.max_lag_s
            and p99 / 1000.0 <= targets.max_e2e_p99_s
            and not falls_behind(rows)
        )
        steps.append(
            CapacityStep(
                load_factor=level.factor,
                target_rate=base_rate * level.factor,
                achieved_rate=commit_to_commit(rows)[0],
                sustained=sustained,
                lag_max=float(max(ages)) if ages else math.nan,
                latency_p99_ms=p99,
                lag_p95=lag,
                confirmation=level.confirmation,
            )
        )
    return steps


def _breakdown(result: Results | None) -> dict[str, float]:
    if result is None:
        return {}
    return {f.name.removeprefix(BATCH_STEP): f.value for f in result.summary if f.name.startswith(BATCH_STEP)}


def search(
    profile: Profile,
    root: Path,
    kafka: KafkaConfig | None = None,
    settings: SearchSettings | None = None,
    targets: Targets | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = lambda _: None,
    job: JobSpec | None = None,
) -> tuple[Capacity, Results]:
    """One run whose load the controller moves; return the capacity found and the run's results.

    ``job`` is the job under test when it is not ``sotw pipeline`` (``loadtest.run.job``).

    Raises
    ------
    HarnessError
        If the run cannot be started.
    """
    settings = settings or SearchSettings()
    targets = targets or Targets.of(profile)
    controller = Controller(root / "samples.jsonl", targets, settings)
    # The steady phase outlasts the search by the 10 s the runner needs to see the end of an incident; the
    # run's own pass bounds are widened, since the search breaks them on purpose. The search ends on its
    # highest levels, and the backlog they leave is judged after the drain: a slow job needs about as long to
    # drain as the search took, or its table is judged before it is written.
    drain_s = max(profile.run.drain_max_s, 120, 2 * settings.budget_s)
    run = dataclasses.replace(profile.run, steady_s=settings.budget_s + 10, drain_max_s=drain_s)
    request = RunRequest(
        dataclasses.replace(profile, run=run),
        settings.start,
        root,
        kafka,
        command="sotw capacity",
        job=job,
        broker_settings=SEARCH_BROKER_SETTINGS,
        incidents=(
            RateSearch(at_s=0, name="rate search", controller=controller, budget_s=settings.budget_s),
        ),
    )
    progress(
        f"capacity: searching from {settings.start:g}x ({profile.simulator.rate * settings.start:,.0f} msg/s) for "
        f"up to {settings.budget_s:g} s; targets: lag <= {targets.max_lag_s:g} s, end-to-end p99 <= "
        f"{targets.max_e2e_p99_s:g} s"
    )
    result = execute(request, stop, progress)
    samples = [json.loads(line) for line in (root / "samples.jsonl").read_text().splitlines() if line.strip()]
    steps = judge_levels(root, samples, controller.levels, targets, settings.settle_s, profile.simulator.rate)
    return capacity_of(steps, profile.simulator.rate, targets, "search", _breakdown(result)), result


def capacity_of(
    steps: list[CapacityStep], base_rate: float, targets: Targets, method: str, breakdown: dict[str, float]
) -> Capacity:
    """The capacity the judged steps show: the highest sustained factor below the lowest broken one."""
    broken = [s.load_factor for s in steps if not s.sustained]
    lowest_broken = min(broken, default=math.nan)
    held = [s.load_factor for s in steps if s.sustained and not (s.load_factor >= lowest_broken)]
    best = max(held, default=math.nan)
    if math.isfinite(best) and math.isfinite(lowest_broken):
        confidence = (
            f"between {best:g}x and {lowest_broken:g}x ({base_rate * best:,.0f}-{base_rate * lowest_broken:,.0f} msg/s): "
            f"the true limit is at most {lowest_broken / best - 1:.0%} above the rate stated"
        )
    elif math.isfinite(best):
        confidence = f"at least {best:g}x: no level tried broke the targets (raise --max)"
    else:
        confidence = f"below {lowest_broken:g}x: even the lowest level tried broke the targets"
    return Capacity(
        steps=steps,
        max_sustained_factor=best,
        max_sustained_rate=base_rate * best,
        baseline_rate=base_rate,
        headroom=best,
        time_breakdown_ms=breakdown,
        method=method,
        lowest_broken_factor=lowest_broken,
        confidence=confidence,
        targets={"max_lag_s": targets.max_lag_s, "max_end_to_end_p99_s": targets.max_e2e_p99_s},
    )


def step_of(result: Results) -> CapacityStep:
    """One step of the stepped search from a whole run's results (its steady-phase figures and verdict)."""
    return CapacityStep(
        load_factor=result.run.load_factor,
        target_rate=result.figure("target_rate"),
        achieved_rate=result.figure("consumed_rate"),
        sustained=result.verdict.verdict == "PASS",
        lag_max=result.figure("lag_age_max"),
        latency_p99_ms=result.figure("end_to_end_p99"),
        lag_p95=result.figure("lag_age_p95"),
    )


def steps(
    profile: Profile,
    root: Path,
    kafka: KafkaConfig | None = None,
    start: float = 1.0,
    max_factor: float = 64.0,
    refine: int = 2,
    targets: Targets | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = lambda _: None,
    job: JobSpec | None = None,
) -> tuple[Capacity, list[Results]]:
    """The stepped search: whole runs from ``start``, doubling until one fails, then ``refine`` bisections.

    A step is sustained when its run PASSes (kept up, drained, correct) with the targets as its bounds.
    ``job`` is the job under test when it is not ``sotw pipeline`` (``loadtest.run.job``).
    """
    stop = stop or threading.Event()
    targets = targets or Targets.of(profile)
    bounded = dataclasses.replace(
        profile,
        run=dataclasses.replace(
            profile.run, max_lag_s=targets.max_lag_s, max_end_to_end_p99_s=targets.max_e2e_p99_s
        ),
    )
    results: list[Results] = []

    def attempt(factor: float) -> bool:
        progress(f"capacity: step {factor:g}x ({profile.simulator.rate * factor:,.0f} msg/s)")
        request = RunRequest(
            bounded,
            factor,
            root / f"step-{len(results):02d}-{factor:g}x",
            kafka,
            job=job,
            broker_settings=SEARCH_BROKER_SETTINGS,
        )
        result = execute(request, stop, progress)
        results.append(result)
        ok = result.verdict.verdict == "PASS"
        progress(f"capacity: {factor:g}x {'sustained' if ok else 'NOT sustained'}")
        return ok

    good, bad = 0.0, math.inf
    factor = start
    while factor <= max_factor and not stop.is_set():
        if attempt(factor):
            good = factor
            factor *= 2
        else:
            bad = factor
            break
    for _ in range(refine):
        if stop.is_set() or not math.isfinite(bad) or bad - good <= 0.1 * max(good, 1e-9):
            break
        middle = round((good + bad) / 2, 2) if good else round(bad / 2, 2)
        if attempt(middle):
            good = middle
        else:
            bad = middle
    best = max(
        (r for r in results if r.verdict.verdict == "PASS"), key=lambda r: r.run.load_factor, default=None
    )
    found = capacity_of(
        [step_of(r) for r in results], profile.simulator.rate, targets, "steps", _breakdown(best)
    )
    return found, results


def with_capacity(result: Results, capacity: Capacity) -> Results:
    """A copy of ``result`` carrying ``capacity``."""
    return dataclasses.replace(result, capacity=capacity)
