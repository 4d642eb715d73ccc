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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.reports.charts import charts
from loadtest.reports.display import PERCENTILE_FIELDS, fmt, key_numbers, label
from loadtest.reports.pages import CSS, html_table, md_table
from loadtest.reports.results import Correctness, Results

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportPaths:
    """Where the report was written."""

    html: Path
    markdown: Path


# ------------------------------------------------------------------------------------------------ numbers


# ------------------------------------------------------------------------------------------------ charts


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
        ["sessions judged", f"{fmt(c.sessions_judged)} of {fmt(c.sessions_expected)}"],
        [
            "strict: query must stop",
            ("yes; stopped at " + c.policy_stop if c.policy_stop else "yes") if c.must_stop else "no",
        ],
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
        ["not judged (the ledger does not name their rows)", fmt(c.sessions_not_judged)],
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
            verdict = r.drill_verdict
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
            v = r.drill_verdict or ""
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
