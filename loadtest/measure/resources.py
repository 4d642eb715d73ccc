"""CPU and memory in the steady phase: each part's (broker, pipeline, harness) and the harness's own overhead (simulator, samplers, verifier), from the sampler's rows."""

from __future__ import annotations

import math

import pandas as pd

from loadtest.reports.results import (
    ResourceUsage,
)

COMPONENTS = ("broker", "pipeline", "harness")


def resources(steady: pd.DataFrame) -> list[ResourceUsage]:
    """CPU and memory of each component over the steady phase."""
    out = []
    for c in COMPONENTS:
        cpu, rss = f"cpu_{c}", f"rss_mb_{c}"
        if cpu not in steady or steady.empty:
            continue
        out.append(
            ResourceUsage(
                c,
                float(steady[cpu].mean()),
                float(steady[cpu].max()),
                float(steady[rss].mean()),
                float(steady[rss].max()),
            )
        )
    return out


#: Counters a Locust run's simulators report a hop or two late, with the time they were read (``counters_ts``).
RELAYED_COUNTERS = frozenset({"planned", "sent", "acked", "failed"})


def span_of(steady: pd.DataFrame, column: str) -> tuple[float, float]:
    """(increase of a cumulative column, seconds) between the first and last steady samples.

    A relayed counter is timed by when it was read, not when the sample was taken: a reading one report late at
    either end of a 10 s phase would move the rate by a tenth.
    """
    if column not in steady or len(steady) < 2:
        return math.nan, math.nan
    values = steady[column].ffill()
    clock = steady["ts"]
    if column in RELAYED_COUNTERS and "counters_ts" in steady and steady["counters_ts"].notna().all():
        read = steady["counters_ts"].astype(float)
        if read.iloc[-1] > read.iloc[0]:  # no new reading during the phase: the sample times are all there is
            clock = read
    return (
        float(values.iloc[-1] - values.iloc[0]),
        float(clock.iloc[-1] - clock.iloc[0]),
    )


def per_second(steady: pd.DataFrame, column: str) -> float:
    """How fast a counter column grew over the steady phase, per second (NaN over no time)."""
    gained, seconds = span_of(steady, column)
    return gained / seconds if seconds > 0 else math.nan


def harness_overhead(steady: pd.DataFrame, verify_cpu_s: float) -> dict[str, float]:
    """The harness process's own CPU over the steady phase, in % of one core, by part.

    ``simulator`` is the simulator's threads (its loop, ledger writer and producer's librdkafka threads),
    ``sampler`` the sampler thread with its probes' Kafka clients, ``other`` the rest (the main loop);
    ``harness`` is everything but the simulator. ``probe_*`` split the sampler thread's own time by probe.
    The verifier runs after the load: its CPU is in seconds.
    """
    out: dict[str, float] = {}
    _, seconds = span_of(steady, "threads_cpu_s_process")
    if seconds > 0:
        out["steady_s"] = seconds
        for column in steady.columns:
            if column.startswith(("threads_cpu_s_", "probe_cpu_s_")):
                name = column.removeprefix("threads_cpu_s_").removeprefix("probe_cpu_s_")
                key = f"probe_{name}" if column.startswith("probe_") else name
                out[f"{key}_cpu_percent"] = 100.0 * per_second(steady, column)
        out["harness_cpu_percent"] = out.get("process_cpu_percent", math.nan) - out.get(
            "simulator_cpu_percent", math.nan
        )
    out["verifier_cpu_s"] = verify_cpu_s
    out["samples"] = float(len(steady))
    return out
