"""How a run's figures are shown in the report and its charts alike: labels, number formats, colours, the steady phase's window and the key numbers."""

from __future__ import annotations

import math

from loadtest.reports.results import Results, Series

PERCENTILE_FIELDS = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p99_9"), ("max", "max"))


PHASE_COLOURS = {"warmup": "#f2f2f2", "steady": "#e6f2e6", "drain": "#f7ecdc"}


RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


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
    window = phase_window(result, "steady")
    points = [
        v
        for t, v in zip(series.t, series.values, strict=True)
        if window is None or window[0] <= t < window[1]
    ]
    finite = [v for v in points if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def phase_window(result: Results, name: str) -> tuple[float, float] | None:
    """The phase ``name``'s start and end, seconds from the run's start; None if the run had no such phase."""
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
