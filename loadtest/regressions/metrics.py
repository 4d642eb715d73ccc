"""Each benchmark's output as a night's metrics: a run's results, benchmarks/simulator_vs_bare.py's and pipeline_vs_bare.py's JSON, pytest-benchmark's JSON."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.measure.figures import BATCH_STEP
from loadtest.regressions.history import Metric
from loadtest.reports.results import Results


def metrics_from_results(prefix: str, runs: Sequence[Results], drain: bool = True) -> list[Metric]:
    """The headline metrics of repeated load-test runs at one load (``sotw bench``'s 1x or 10x, a drill).

    Throughput as the consumed share of the rate asked for (a ratio within the run), lag and end-to-end
    latency of the steady phase, the micro-batch's duration, the drain time (unless ``drain`` is False), and
    each incident's recovery time.

    The nightly gate leaves the drain time out. At the loads the night runs the pipeline keeps up, so the
    drain is the wait for two sampler rows in a row at zero lag, a figure of the sampler's cadence rather than
    of the pipeline: in one night of unchanged code it read 1.5 s on all three baseline runs at 10x and
    2.5-3.0 s on the candidate's, a "regression" of x1.53. A pipeline that drains more slowly shows there in
    the lag and the batch duration. ``sotw compare`` keeps it: between two runs of an overloaded pipeline, the
    drain is what the backlog cost.
    """

    def values(read: Any) -> list[float]:
        return [float(read(r)) for r in runs]

    out = [
        Metric(
            f"{prefix}.consumed_per_target",
            "ratio",
            "higher",
            values(lambda r: r.figure("consumed_rate") / r.figure("target_rate")),
        ),
        Metric(f"{prefix}.lag_age_p95", "lag", "lower", values(lambda r: r.figure("lag_age_p95")), "s"),
        Metric(
            f"{prefix}.end_to_end_p99", "latency", "lower", values(lambda r: r.figure("end_to_end_p99")), "ms"
        ),
        Metric(
            f"{prefix}.batch_duration",
            "time",
            "lower",
            values(lambda r: r.figure(f"{BATCH_STEP}whole trigger")),
            "ms",
        ),
        Metric(
            f"{prefix}.verdict_pass", "ratio", "higher", values(lambda r: float(r.verdict.verdict == "PASS"))
        ),
    ]
    if drain:
        out.append(
            Metric(
                f"{prefix}.drain_time",
                "recovery",
                "lower",
                values(lambda r: r.figure("drain_time", "drain")),
                "s",
            )
        )
    labels = sorted({i.label for r in runs for i in r.incidents})
    for label in labels:

        def recovery(r: Results, label: str = label) -> float:
            found = next((i for i in r.incidents if i.label == label), None)
            return math.nan if found is None or found.recover_s is None else found.recover_s

        out.append(Metric(f"{prefix}.recover_s.{label}", "recovery", "lower", values(recovery), "s"))
    return [m for m in out if m.measured]


def metrics_from_simulator_vs_bare(doc: Mapping[str, Any]) -> list[Metric]:
    """``benchmarks/simulator_vs_bare.py --json``: the simulator's rate and CPU, the bare producer loop's rate.

    The benchmark's own ratio (simulator / bare loop in the same run) is not a metric of the night: pairing
    the sides already cancels what the machine does to both, and the ratio adds the bare loop's run-to-run
    swing (570,000-830,000 msg/s with 2,000,000 messages) to the simulator's own.
    """
    bare = [float(b["rate"]) for b in doc["bare"]]
    sim = [float(s["updates_per_s"]) for s in doc["simulator"]]
    cpu = [float(s["cpu_us_per_msg"]) for s in doc["simulator"]]
    return [
        Metric("simulator_vs_bare.simulator_rate", "throughput", "higher", sim, "msg/s"),
        # CPU per message moves with the code, far less with the neighbours than a rate does.
        Metric("simulator_vs_bare.simulator_cpu_per_msg", "time", "lower", cpu, "us"),
        Metric("simulator_vs_bare.bare_rate", "throughput", "higher", bare, "msg/s"),
    ]


def metrics_from_pipeline_vs_bare(doc: Mapping[str, Any]) -> list[Metric]:
    """``benchmarks/pipeline_vs_bare.py --json``: the pipeline / bare consumer ratio of each round.

    The first round's pipeline also pays for the JVM's first query (code compiled, Python workers started), so
    with more than one round it is its own metric (``cold_rate``) and the others make the ratio.
    """
    bare = [float(b["rate"]) for b in doc["bare"]]
    pipe = [float(p["rate"]) for p in doc["pipeline"]]
    warm = slice(1, None) if len(pipe) > 1 else slice(None)
    ratios = [p / b for p, b in zip(pipe, bare, strict=True)]
    return [
        Metric("pipeline_vs_bare.ratio", "ratio", "higher", ratios[warm]),
        Metric("pipeline_vs_bare.pipeline_rate", "throughput", "higher", pipe[warm], "msg/s"),
        Metric("pipeline_vs_bare.cold_rate", "throughput", "higher", pipe[:1], "msg/s"),
        Metric("pipeline_vs_bare.bare_rate", "throughput", "higher", bare, "msg/s"),
        Metric(
            "pipeline_vs_bare.peak_rss",
            "memory",
            "lower",
            [float(p["peak_rss_bytes"]) / 2**20 for p in doc["pipeline"]],
            "MiB",
        ),
    ]


def metrics_from_pytest_benchmark(doc: Mapping[str, Any]) -> list[Metric]:
    """pytest-benchmark's ``--benchmark-json``: each micro benchmark's median time of every round.

    pytest-benchmark keeps every round's time with ``--benchmark-save-data``; without it the median and the
    interquartile range are what it keeps, stated as three values (median and median +/- IQR / 2).
    """
    out = []
    for bench in doc.get("benchmarks", []):
        stats = bench["stats"]
        data = stats.get("data")
        if data:
            values = [float(v) for v in data]
        else:
            median, iqr = float(stats["median"]), float(stats.get("iqr", 0.0))
            values = [median - iqr / 2, median, median + iqr / 2]
        out.append(Metric(f"micro.{bench['name']}", "time", "lower", values, "s"))
    return out
