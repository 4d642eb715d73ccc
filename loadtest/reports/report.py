"""The human-readable report: a self-contained HTML page and a Markdown summary from ``results.json``.

One run gives throughput, lag and latency over time, latency percentiles, resource use, the correctness
table with triage and, when measured, the capacity section. Two runs (``sotw bench``: 1x and 10x) are shown
side by side. Charts are PNGs drawn with matplotlib's Agg canvas (no display, no pyplot global state) and
embedded as base64 so the HTML file can be mailed or attached to a ticket on its own.
"""

from __future__ import annotations

import base64
import html
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from loadtest.reports.pages import CSS, html_table, md_table, png_bytes
from loadtest.reports.results import Correctness, Results, Series

log = logging.getLogger(__name__)

PERCENTILE_FIELDS = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p99_9"), ("max", "max"))
PHASE_COLOURS = {"warmup": "#f2f2f2", "steady": "#e6f2e6", "drain": "#f7ecdc"}
RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass(frozen=True)
class ReportPaths:
    """Where the report was written."""

    html: Path
    markdown: Path


# ------------------------------------------------------------------------------------------------ numbers


def label(result: Results) -> str:
    """A short name for a run in tables and legends: its load factor."""
    return f"{result.run.load_factor:g}x"


def fmt(value: float | int | None, unit: str = "", digits: int = 3) -> str:
    """A number for a human: thousands separators, a few significant digits, '-' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        text = f"{int(value):,}"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.{digits}g}"
    return f"{text} {unit}".strip()


def steady_mean(result: Results, series: Series) -> float:
    """The series' mean over the steady phase ``[start, end)`` (the whole series if there is none)."""
    window = _phase_window(result, "steady")
    points = [
        v
        for t, v in zip(series.t, series.values, strict=True)
        if window is None or window[0] <= t < window[1]
    ]
    finite = [v for v in points if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _phase_window(result: Results, name: str) -> tuple[float, float] | None:
    for phase in result.phases:
        if phase.name == name:
            start = result.run.started_ms
            return (phase.start_ms - start) / 1000.0, (phase.end_ms - start) / 1000.0
    return None


FIGURE_LABELS = {
    "target_rate": "target rate",
    "produced_rate": "produced",
    "acked_rate": "acknowledged by the broker",
    "consumed_rate": "consumed by the pipeline",
    "written_rate": "written (change rows)",
    "lag_age_p95": "lag: age of the oldest unprocessed message, p95",
    "lag_age_max": "lag: age of the oldest unprocessed message, max",
    "lag_offsets_max": "lag: offsets behind, max",
    "end_to_end_p50": "end-to-end latency p50",
    "end_to_end_p99": "end-to-end latency p99",
    "publish_p99": "publish latency p99",
    "schedule_lateness_p99": "schedule lateness p99",
    "drain_time": "drain time",
}


def figure_label(name: str) -> str:
    """How a summary figure is named for a reader."""
    return FIGURE_LABELS.get(name, name.replace("_", " "))


def key_numbers(result: Results) -> list[tuple[str, str, str]]:
    """The figures a capacity planner reads first, each once: (figure, phase it covers, formatted value)."""
    rows = [
        ("verdict", "whole run", result.verdict.verdict),
        ("policy", "whole run", result.run.policy),
        ("duration", "whole run", fmt((result.run.ended_ms - result.run.started_ms) / 1000.0, "s")),
    ]
    rows += [(figure_label(f.name), f.scope, fmt(f.value, f.unit)) for f in result.summary]
    c = result.correctness
    if c is not None:
        rows += [
            (
                "exact session tables",
                "whole run",
                f"{c.sessions_exact}/{c.sessions_exact_required} ({fmt(100 * c.exact_match_rate, '%')})",
            ),
            ("rows lost / repeated", "whole run", f"{c.rows_lost} / {c.rows_repeated}"),
        ]
    return rows


# ------------------------------------------------------------------------------------------------ charts


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
        window = _phase_window(result, phase.name)
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


# ------------------------------------------------------------------------------------------------ tables


def _comparison_rows(results: Sequence[Results]) -> tuple[list[str], list[list[str]]]:
    """Key numbers of each run in one table: one row per figure and phase, runs as columns."""
    columns = [{(name, phase): value for name, phase, value in key_numbers(r)} for r in results]
    keys: list[tuple[str, str]] = []
    for col in columns:
        keys += [k for k in col if k not in keys]
    head = ["figure", "phase", *(label(r) for r in results)]
    return head, [[name, phase, *(c.get((name, phase), "-") for c in columns)] for name, phase in keys]


def _latency_rows(results: Sequence[Results]) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            label(r),
            lat.name,
            lat.scope,
            fmt(lat.count),
            *(fmt(getattr(lat, f), "ms") for _, f in PERCENTILE_FIELDS),
        ]
        for r in results
        for lat in r.latency
    ]
    return ["run", "latency", "phase", "messages", *(n for n, _ in PERCENTILE_FIELDS)], rows


def _resource_rows(results: Sequence[Results]) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            label(r),
            u.component,
            "steady",
            fmt(u.cpu_mean, "%"),
            fmt(u.cpu_max, "%"),
            fmt(u.rss_mb_mean, "MB"),
            fmt(u.rss_mb_max, "MB"),
        ]
        for r in results
        for u in r.resources
    ]
    head = ["run", "component", "phase", "CPU mean", "CPU max", "RSS mean", "RSS max"]
    return head, rows


def _overhead_rows(overhead: dict[str, float]) -> tuple[list[str], list[list[str]]]:
    """The harness's own cost: CPU by part over the steady phase, the verifier's CPU after the load."""
    rows = []
    for key, value in overhead.items():
        if key.endswith("_cpu_percent"):
            rows.append(
                [key.removesuffix("_cpu_percent").replace("_", " ") + " CPU", "steady", fmt(value, "%")]
            )
        elif key == "verifier_cpu_s":
            rows.append(["verifier CPU", "after the load", fmt(value, "s")])
        elif key == "steady_s":
            rows.append(["measured over", "steady", fmt(value, "s")])
    return ["part", "phase", "value"], rows


def _fault_rows(c: Correctness) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            f.kind,
            f.fault,
            fmt(f.injected),
            fmt(f.expected),
            fmt(f.detected),
            fmt(f.true_positives),
            fmt(f.precision),
            fmt(f.recall),
        ]
        for f in c.faults
    ]
    return [
        "violation",
        "injected fault",
        "injected",
        "must detect",
        "detected",
        "correct",
        "precision",
        "recall",
    ], rows


def _correctness_rows(c: Correctness) -> tuple[list[str], list[list[str]]]:
    if c.contract == "tables":
        return ["check", "result"], _tables_rows(c)
    rows = [
        ["verdict", "PASS" if c.passed else "FAIL"],
        ["output", f"full contract, {c.output_format}"],
        ["policy", c.policy],
        ["sessions", fmt(c.sessions_expected)],
        [
            "exact session tables",
            f"{c.sessions_exact} of {c.sessions_exact_required} required "
            f"({fmt(100 * c.exact_match_rate, '%')})",
        ],
        ["change rows expected / written", f"{fmt(c.rows_expected)} / {fmt(c.rows_written)}"],
        [
            "change rows whose values were checked / wrong",
            f"{fmt(c.rows_values_checked)} / {fmt(c.rows_wrong)} (every session)",
        ],
        ["rows lost / repeated / unexpected", f"{c.rows_lost} / {c.rows_repeated} / {c.rows_unexpected}"],
        ["malformed quarantined", f"{c.malformed_quarantined} of {c.malformed_sent}"],
        ["session statuses", ", ".join(f"{k} {v}" for k, v in sorted(c.statuses.items())) or "-"],
        ["strict: query must stop", "yes" if c.must_stop else "no"],
        ["blame", ", ".join(f"{k} {v}" for k, v in sorted(c.blame.items())) or "-"],
        ["end-to-end latency measured against", c.latency_source or "-"],
    ]
    return ["check", "result"], rows


def _tables_rows(c: Correctness) -> list[list[str]]:
    """The tables contract's checks: final tables only (docs/own-pipeline.md)."""
    return [
        ["verdict", "PASS" if c.passed else "FAIL"],
        ["output", f"tables contract, {c.output_format}"],
        ["sessions", fmt(c.sessions_expected)],
        [
            "exact final tables",
            f"{c.sessions_exact} of {c.sessions_exact_required} judged ({fmt(100 * c.exact_match_rate, '%')})",
        ],
        [
            "judged against what their delivered messages build (they lost some)",
            fmt(c.sessions_judged_from_delivered),
        ],
        ["not judged (a message whose delivery is unknown)", fmt(c.sessions_not_judged)],
        ["rows expected / written", f"{fmt(c.rows_expected)} / {fmt(c.rows_written)}"],
        [
            "rows wrong / missing / extra / repeated",
            f"{c.rows_wrong} / {c.rows_lost} / {c.rows_unexpected} / {c.rows_repeated}",
        ],
        ["blame", ", ".join(f"{k} {v}" for k, v in sorted(c.blame.items())) or "-"],
        ["end-to-end latency measured against", c.latency_source or "-"],
    ]


def _damage_rows(c: Correctness) -> tuple[list[str], list[list[str]]]:
    rows = [
        [d.sensor, d.session, fmt(d.degraded_from), fmt(d.observed_degraded_from), fmt(d.updates_affected)]
        for d in c.damage
    ]
    return ["sensor", "session", "degraded from seq", "pipeline said", "updates affected"], rows


def _triage_rows(c: Correctness, limit: int = 50) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            d.kind,
            d.session,
            fmt(d.seq),
            d.triage.layer if d.triage else "-",
            d.detail,
            d.triage.detail if d.triage else "",
        ]
        for d in c.discrepancies[:limit]
    ]
    return ["discrepancy", "session", "seq", "layer at fault", "what", "triage"], rows


# ------------------------------------------------------------------------------------------------ markdown


def _seconds(value: float | None) -> str:
    return "-" if value is None else fmt(value, "s")


def _incident_rows(r: Results) -> tuple[list[str], list[list[str]]]:
    """One row per incident: when, what was done, time to detect and recover, peaks, stop."""
    head = ["incident", "at (s)", "lasted (s)", "detected after", "recovered after end", "peak lag",
            "peak e2e", "stopped", "what was done"]  # fmt: skip
    rows = []
    for i in r.incidents:
        done = "; ".join(i.notes) + (f"; FAILED: {i.error}" if i.error else "")
        rows.append(
            [
                i.label,
                fmt((i.start_ms - r.run.started_ms) / 1000.0),
                fmt((i.end_ms - i.start_ms) / 1000.0),
                _seconds(i.detect_s),
                _seconds(i.recover_s) if i.recover_s is not None else "not recovered",
                f"{fmt(i.peak_lag_age_s, 's')} / {fmt(i.peak_lag_offsets, 'offsets')}",
                fmt(i.peak_e2e_ms, "ms"),
                f"yes, {_seconds(i.stop_after_s)} after its end: {i.stop_message}" if i.stopped else "no",
                done,
            ]
        )
    return head, rows


def _scorecard_rows(r: Results) -> tuple[list[str], list[list[str]]]:
    if r.drill is None:
        return [], []
    return ["", "expectation", "needs", "measured"], [
        ["met" if c.met else "NOT MET", c.name, c.expected, c.measured] for c in r.drill.checks
    ]


def markdown_summary(results: Sequence[Results], html_path: Path | None = None) -> str:
    """The Markdown summary: verdicts and reasons, key numbers side by side, correctness and capacity."""
    out = ["# sotw load-test report", ""]
    for r in results:
        if r.drill is not None:
            verdict = "PASS" if r.drill.passed else "FAIL"
            out += [
                f"## Drill {r.drill.name}: {verdict}",
                "",
                r.drill.description,
                "",
                md_table(_scorecard_rows(r)),
            ]
        if r.incidents:
            out += [f"## Incidents ({label(r)})", "", md_table(_incident_rows(r))]
    for r in results:
        out.append(
            f"**{label(r)}: {r.verdict.verdict}** — run `{r.run.run_id}`, policy `{r.run.policy}`, "
            f"profile `{r.run.profile_name}`"
        )
        out += [f"- {reason}" for reason in r.verdict.reasons]
        out.append("")
    out += [
        "## Key numbers",
        "",
        md_table(_comparison_rows(results)),
        "## Latency percentiles",
        "",
        md_table(_latency_rows(results)),
    ]
    for r in results:
        if r.correctness is not None:
            out += [
                f"## Correctness ({label(r)})",
                "",
                md_table(_correctness_rows(r.correctness)),
                md_table(_fault_rows(r.correctness)),
            ]
            if r.correctness.discrepancies:
                out += ["### Discrepancies and triage", "", md_table(_triage_rows(r.correctness, 20))]
        if r.capacity is not None:
            out += [f"## Capacity ({label(r)})", "", md_table(_capacity_rows(r))]
    if html_path is not None:
        out.append(f"Full report: {html_path}")
    return "\n".join(out) + "\n"


def _capacity_rows(r: Results) -> tuple[list[str], list[list[str]]]:
    cap = r.capacity
    if cap is None:
        return [], []
    rows = [
        ["max sustained load factor", fmt(cap.max_sustained_factor, "x")],
        ["max sustained rate", fmt(cap.max_sustained_rate, "msg/s")],
        ["1x baseline rate", fmt(cap.baseline_rate, "msg/s")],
        ["headroom over 1x", fmt(cap.headroom, "x")],
    ]
    if cap.confidence:
        rows.append(["confidence", cap.confidence])
    if cap.targets:
        rows.append(["targets", ", ".join(f"{k} {fmt(v)}" for k, v in cap.targets.items())])
    if cap.check_sustained is not None:
        rows.append(["whole run at that rate", "PASS" if cap.check_sustained else "FAIL"])
    rows += [[f"time in {k}", fmt(v, "ms")] for k, v in cap.time_breakdown_ms.items()]
    rows += [
        [
            f"{'level' if cap.method == 'search' else 'step'} {fmt(s.load_factor)}x"
            + (" (confirmation)" if s.confirmation else ""),
            f"{fmt(s.achieved_rate)} of {fmt(s.target_rate)} msg/s, lag p95 {fmt(s.lag_p95, 's')}, "
            f"end-to-end p99 {fmt(s.latency_p99_ms, 'ms')}: {'sustained' if s.sustained else 'fell behind'}",
        ]
        for s in cap.steps
    ]
    return ["capacity", "value"], rows


# ------------------------------------------------------------------------------------------------ html


def render_html(results: Sequence[Results]) -> str:
    """The whole report as one HTML document with its charts embedded."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>sotw load test "
        f"{html.escape(' vs '.join(label(r) for r in results))}</title><style>{CSS}</style></head><body>",
        "<h1>sotw load-test report</h1>",
    ]
    for r in results:
        if r.drill is not None:
            v = "PASS" if r.drill.passed else "FAIL"
            parts += [
                f"<h2>Drill {html.escape(r.drill.name)} <span class='{v}'>{v}</span></h2>",
                f"<p>{html.escape(r.drill.description)}</p>",
                html_table(_scorecard_rows(r)),
            ]
        if r.incidents:
            parts += [
                f"<h2>Incident timeline ({html.escape(label(r))})</h2>",
                "<p>Every chart below shades these windows in red. Detection is the first sample with lag well "
                "above its level before the incident (or a stop); recovery is when lag is back under the "
                "profile's bound and end-to-end latency within 20 % of its level before (docs/loadtest.md).</p>",
                html_table(_incident_rows(r)),
            ]
    for r in results:
        v = r.verdict.verdict
        parts.append(
            f"<p><span class='{v}'>{v}</span> <b>{html.escape(label(r))}</b> — run "
            f"<code>{html.escape(r.run.run_id)}</code>, policy <code>{html.escape(r.run.policy)}</code>"
            "</p>"
        )
        if r.verdict.reasons:
            parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in r.verdict.reasons) + "</ul>")
    parts += ["<h2>Key numbers</h2>", html_table(_comparison_rows(results))]
    for title, caption, png in charts(results):
        data = base64.b64encode(png).decode("ascii")
        parts += [
            f"<h2>{html.escape(title)}</h2>",
            f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>",
        ]
    parts += [
        "<h2>Latency percentiles</h2>",
        html_table(_latency_rows(results)),
        "<h2>Resources</h2>",
        html_table(_resource_rows(results)),
    ]
    for r in results:
        parts += _html_run_details(r)
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_run_details(r: Results) -> list[str]:
    parts: list[str] = []
    c = r.correctness
    if c is not None:
        parts += [
            f"<h2>Correctness ({html.escape(label(r))})</h2>",
            html_table(_correctness_rows(c)),
            "<h3>Injected faults: detected or missed</h3>",
            html_table(_fault_rows(c)),
            "<h3>Damage window of degraded sessions</h3>",
            html_table(_damage_rows(c)),
            "<h3>Discrepancies and triage</h3>",
            html_table(_triage_rows(c)),
        ]
    if r.capacity is not None:
        parts += [f"<h2>Capacity ({html.escape(label(r))})</h2>", html_table(_capacity_rows(r))]
    if r.harness_overhead:
        parts += [
            f"<h3>Harness overhead ({html.escape(label(r))})</h3>",
            html_table(_overhead_rows(r.harness_overhead)),
        ]
    profile = "\n".join(f"{k} = {v!r}" for k, v in sorted(r.run.profile.items()))
    parts += [
        f"<h2>Profile {html.escape(r.run.profile_name)} ({html.escape(label(r))})</h2>",
        f"<pre>{html.escape(profile or '(not recorded)')}</pre>",
    ]
    return parts


def write_report(results: Sequence[Results], out_dir: Path, name: str = "report") -> ReportPaths:
    """Write ``<name>.html`` and ``<name>.md`` for one run or several side by side; return their paths."""
    if not results:
        raise ValueError("write_report needs at least one Results")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(out_dir / f"{name}.html", out_dir / f"{name}.md")
    paths.html.write_text(render_html(results), encoding="utf-8")
    paths.markdown.write_text(markdown_summary(results, paths.html), encoding="utf-8")
    log.info("report written to %s", paths.html)
    return paths
