"""``sotw capacity``: the highest load factor the pipeline sustains on this machine.

Doubling steps find the first load that fails; a binary search between the last pass and that failure then
narrows it. Each step is a full (shorter) run with its own verdict, so "sustained" means the same as in any
run: kept up during the steady phase, drained afterwards, and correct.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path

from loadtest.figures import BATCH_STEP
from loadtest.job import JobSpec
from loadtest.profile import Profile
from loadtest.results import Capacity, CapacityStep, Results
from loadtest.runner import RunRequest, execute
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)


def step_of(result: Results) -> CapacityStep:
    """One capacity step from a run's results (its steady-phase figures)."""
    return CapacityStep(
        load_factor=result.run.load_factor,
        target_rate=result.figure("target_rate"),
        achieved_rate=result.figure("consumed_rate"),
        sustained=result.verdict.verdict == "PASS",
        lag_max=result.figure("lag_age_max"),
        latency_p99_ms=result.figure("end_to_end_p99"),
    )


def search(
    profile: Profile,
    root: Path,
    kafka: KafkaConfig | None = None,
    start: float = 1.0,
    max_factor: float = 64.0,
    refine: int = 2,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] = lambda _: None,
    job: JobSpec | None = None,
) -> tuple[Capacity, list[Results]]:
    """Search load factors from ``start`` (doubling, then ``refine`` bisection steps); return the capacity.

    ``job`` is the job under test when it is not ``sotw pipeline`` (``loadtest.job``).

    The time breakdown is the one of the highest sustained step: where a batch spends its time just below
    the limit is where the next optimisation should go.
    """
    stop = stop or threading.Event()
    results: list[Results] = []

    def attempt(factor: float) -> bool:
        progress(f"capacity: trying {factor:g}x ({profile.simulator.rate * factor:,.0f} msg/s)")
        request = RunRequest(profile, factor, root / f"step-{len(results):02d}-{factor:g}x", kafka, job=job)
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
    breakdown = (
        {f.name.removeprefix(BATCH_STEP): f.value for f in best.summary if f.name.startswith(BATCH_STEP)}
        if best
        else {}
    )
    capacity = Capacity(
        steps=[step_of(r) for r in results],
        max_sustained_factor=good if good else math.nan,
        max_sustained_rate=profile.simulator.rate * good if good else math.nan,
        baseline_rate=profile.simulator.rate,
        headroom=good if good else math.nan,
        time_breakdown_ms=breakdown,
    )
    return capacity, results


def with_capacity(result: Results, capacity: Capacity) -> Results:
    """A copy of ``result`` carrying ``capacity``."""
    return dataclasses.replace(result, capacity=capacity)
