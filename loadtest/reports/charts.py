"""The report's charts: each figure over time with the run's phases and incidents shaded, lag, resources, latency percentiles and a capacity search, as PNG."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from loadtest.reports.display import PERCENTILE_FIELDS, PHASE_COLOURS, RUN_COLOURS, fmt, label, phase_window
from loadtest.reports.pages import png_bytes
from loadtest.reports.results import Results, Series

INCIDENT_COLOUR = "#d62728"


def _shade_phases(ax: Axes, result: Results) -> None:
    """Phases as background bands, each incident's window hatched in red over them, labelled.

    Incidents are shaded on every chart over time, as Jepsen shades its nemesis periods, so a climb in lag
    or latency can be read against what caused it.
    """
    start = result.run.started_ms
    for incident in result.incidents:
        lo = (incident.start_ms - start) / 1000.0
        hi = max(lo + 0.5, (incident.end_ms - start) / 1000.0)
        ax.axvspan(lo, hi, color=INCIDENT_COLOUR, alpha=0.15, hatch="//", zorder=0.5, lw=0)
        ax.text(
            lo,
            0.9,
            incident.label,
            transform=ax.get_xaxis_transform(),
            va="top",
            ha="left",
            fontsize=7,
            color=INCIDENT_COLOUR,
            rotation=90,
        )
    for phase in result.phases:
        window = phase_window(result, phase.name)
        if window is not None:
            ax.axvspan(*window, color=PHASE_COLOURS.get(phase.name, "#eeeeee"), zorder=0, lw=0)
            ax.text(
                (window[0] + window[1]) / 2,
                0.99,
                phase.name,
                transform=ax.get_xaxis_transform(),
                va="top",
                ha="center",
                fontsize=8,
                color="#555555",
            )


def _series_axes(ax: Axes, result: Results, series: Sequence[Series], title: str) -> None:
    _shade_phases(ax, result)
    for s in series:
        ax.plot(
            s.t,
            s.values,
            label=s.name if not s.component or s.component in s.name else f"{s.name} [{s.component}]",
            lw=1.4,
        )
    units = sorted({s.unit for s in series})
    ax.set_title(f"{title} — {label(result)}", fontsize=11)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(", ".join(units))
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _zero_based(axes: Sequence[Axes]) -> None:
    """Start every y axis at 0 and give panels of one row the same top, so runs compare at a glance."""
    top = 0.0
    for ax in axes:
        top = max(top, ax.get_ylim()[1])
    for ax in axes:
        ax.set_ylim(0, top if top > 0 else 1.0)


def chart_over_time(
    results: Sequence[Results], pick: Callable[[Results], list[Series]], title: str
) -> bytes | None:
    """One panel per run (side by side) of the series ``pick`` selects; None if no run has any."""
    if not any(pick(r) for r in results):
        return None
    fig = Figure(figsize=(6.5 * len(results), 3.6))
    # Each run keeps its own y scale: at 10x a shared axis would flatten the 1x panel into a line.
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    for ax, result in zip(axes, results, strict=True):
        _series_axes(ax, result, pick(result), title)
    for ax in axes:
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return png_bytes(fig)


def _panels(
    results: Sequence[Results],
    rows: Sequence[tuple[str, Callable[[Results], list[Series]]]],
    shared: bool,
) -> bytes | None:
    """One row of panels per (title, pick), one column per run, zero-based; ``shared``: one scale per row."""
    if not any(pick(r) for r in results for _, pick in rows):
        return None
    fig = Figure(figsize=(6.5 * len(results), 3.0 * len(rows)))
    axes = fig.subplots(len(rows), len(results), squeeze=False, sharex="col")
    for i, (title, pick) in enumerate(rows):
        for col, result in enumerate(results):
            _series_axes(axes[i][col], result, pick(result), title)
        if shared:
            _zero_based(axes[i])
        else:
            for ax in axes[i]:
                ax.set_ylim(bottom=0)
    fig.tight_layout()
    return png_bytes(fig)


def chart_lag(results: Sequence[Results]) -> bytes | None:
    """Lag in time (top) and in offsets (bottom), each on its own axis, one column per run."""
    return _panels(
        results,
        [
            ("Lag in time", lambda r: [s for s in r.lag if s.unit == "s"]),
            ("Lag in offsets", lambda r: [s for s in r.lag if s.unit != "s"]),
        ],
        # Each run keeps its own scale, as in ``chart_over_time``.
        shared=False,
    )


def chart_resources(results: Sequence[Results]) -> bytes | None:
    """CPU (% of one core) and memory (MB) per component over time, one column per run."""

    def cpu(r: Results) -> list[Series]:
        return [s for s in r.resource_series if s.unit.startswith("%") or "cpu" in s.name]

    return _panels(
        results,
        [("CPU", cpu), ("Memory", lambda r: [s for s in r.resource_series if s not in cpu(r)])],
        shared=True,
    )


def chart_percentiles(results: Sequence[Results]) -> bytes | None:
    """Grouped bars of p50 .. max for each latency, each run its colour, on a log scale."""
    names = sorted({lat.name for r in results for lat in r.latency})
    if not names:
        return None
    fig = Figure(figsize=(4.2 * len(names), 3.8))
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    width = 0.8 / len(results)
    for ax, name in zip(axes, names, strict=True):
        for i, result in enumerate(results):
            lat = next((x for x in result.latency if x.name == name), None)
            if lat is None:
                continue
            values = [getattr(lat, f) for _, f in PERCENTILE_FIELDS]
            xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(values))]
            bars = ax.bar(
                xs,
                [v if math.isfinite(v) and v > 0 else 0 for v in values],
                width,
                label=label(result),
                color=RUN_COLOURS[i % len(RUN_COLOURS)],
            )
            ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=7, rotation=90, padding=2)
        ax.set_xticks(range(len(PERCENTILE_FIELDS)), [n for n, _ in PERCENTILE_FIELDS])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.margins(y=0.25)
        scopes = sorted({lat.scope for r in results for lat in r.latency if lat.name == name})
        ax.set_title(f"{name.replace('_', ' ')} (ms), {' / '.join(scopes)} phase", fontsize=11)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


def chart_capacity(result: Results) -> bytes | None:
    """Achieved against offered rate per load factor: where the pipeline stops keeping up."""
    cap = result.capacity
    if cap is None or not cap.steps:
        return None
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    steps = sorted(cap.steps, key=lambda s: s.load_factor)
    xs = [s.load_factor for s in steps]
    ax.plot(xs, [s.target_rate for s in steps], "--", color="#888888", label="offered")
    ax.plot(xs, [s.achieved_rate for s in steps], "-", color=RUN_COLOURS[0], label="achieved")
    for s in steps:
        ax.plot(s.load_factor, s.achieved_rate, "o", color="#2ca02c" if s.sustained else "#d62728")
    if math.isfinite(cap.max_sustained_factor):
        ax.axvline(
            cap.max_sustained_factor,
            color="#2ca02c",
            lw=1,
            ls=":",
            label=f"max sustained {cap.max_sustained_factor:g}x",
        )
    ax.set_xlabel("load factor (x baseline)")
    ax.set_ylabel("messages/s")
    ax.set_title("Capacity: green = sustained, red = fell behind", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


CAPTIONS = {
    "throughput": "Messages per second produced by the simulator, acknowledged by the broker, consumed by the "
    "pipeline, and change rows written. In the steady phase (green) produced and acknowledged sit on the "
    "target rate and consumed follows them; consumed staying below produced means the pipeline falls behind.",
    "lag": "Top: age of the oldest message the pipeline has not processed yet, in seconds. Bottom: messages "
    "behind the end of the topics (all partitions, and the worst one). In the steady phase both should stay "
    "low and flat; a climb means the pipeline cannot keep up, and the drain shows how long it takes to catch "
    "up.",
    "latency": "End-to-end latency (a message's intended send time to the commit of the batch that wrote "
    "it), p50 and p99 per 5 s of commit time. High in the warm-up while Spark compiles, then it should be "
    "flat through the steady phase; steps mark slow batches.",
    "percentiles": "Latency percentiles over the messages meant for the steady phase, log scale: end-to-end, "
    "publish (send to broker acknowledgement) and schedule lateness (how late the simulator sent against its "
    "schedule). A wide gap between p99 and max points to stalls.",
    "resources": "CPU (% of one core: 100 % is one core busy) and resident memory per component: the broker, "
    "the pipeline (driver, JVM and Python workers) and the harness (simulator and samplers). In the steady "
    "phase memory should level off; steady growth is a leak.",
    "capacity": "Achieved against offered rate for each load factor tried: green sustained, red fell behind. "
    "The dotted line is the highest load factor sustained on this machine.",
}


def charts(results: Sequence[Results]) -> list[tuple[str, str, bytes]]:
    """Every chart that has data, as (title, caption, PNG bytes), in reading order; phases are shaded."""
    made = [
        (
            "Throughput over time",
            CAPTIONS["throughput"],
            chart_over_time(results, lambda r: r.throughput, "Throughput"),
        ),
        ("Lag over time", CAPTIONS["lag"], chart_lag(results)),
        (
            "Latency over time",
            CAPTIONS["latency"],
            chart_over_time(results, lambda r: r.latency_series, "Latency"),
        ),
        ("Latency percentiles", CAPTIONS["percentiles"], chart_percentiles(results)),
        ("Resource use", CAPTIONS["resources"], chart_resources(results)),
    ]
    made += [(f"Capacity ({label(r)} run)", CAPTIONS["capacity"], chart_capacity(r)) for r in results]
    return [(title, caption, png) for title, caption, png in made if png is not None]
