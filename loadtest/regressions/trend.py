"""The nightly benchmark's trend page: one chart per headline metric over nights and commits, regressions marked.

Each night was judged against the baseline measured beside it (``sotw nightly``), and the judgement is in its
history entry, so a regression stays marked on the night it appeared. The charts show the record over time:
each night's candidate and its baseline. The page is one self-contained HTML file with the charts embedded,
like the load-test report.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from loadtest.regressions.history import Entry
from loadtest.regressions.paired import judgement_rows
from loadtest.reports.pages import CSS, html_table, png_bytes

MICRO = "micro."
# Figures every night states but no one watches on their own: the bare loops are the ratios' denominators.
_NOT_HEADLINE = (".bare_rate", ".verdict_pass")


def headline_names(history: Sequence[Entry]) -> list[str]:
    """The metrics that get a chart of their own, in the order they first appear."""
    names: list[str] = []
    for entry in history:
        for m in entry.metrics:
            if m.name not in names and not m.name.startswith(MICRO) and not m.name.endswith(_NOT_HEADLINE):
                names.append(m.name)
    return names


def regressed(entry: Entry, name: str) -> bool:
    """Whether the night judged ``name`` a regression against its baseline."""
    return any(j.name == name and j.status == "regression" for j in entry.paired)


def chart_metric(name: str, history: Sequence[Entry]) -> bytes:
    """One metric's median per night with its spread, beside its baseline's; the regressions in red."""
    fig = Figure(figsize=(9, 2.8))
    ax = fig.subplots()
    xs, ys, errs, bad, base, unit = [], [], [], [], [], ""
    for i, entry in enumerate(history):
        metric = entry.metric(name)
        if metric is None or not math.isfinite(metric.median):
            continue
        unit = metric.unit
        xs.append(i)
        ys.append(metric.median)
        errs.append(metric.spread)
        if regressed(entry, name):
            bad.append((i, metric.median))
        theirs = next((m for m in entry.baseline_metrics if m.name == name), None)
        if theirs is not None and math.isfinite(theirs.median):
            base.append((i, theirs.median))
    ax.errorbar(
        xs, ys, yerr=errs, fmt="o-", color="#1f77b4", capsize=3, label="candidate: median (+/- spread)"
    )
    if base:
        ax.plot(
            [b[0] for b in base], [b[1] for b in base], "s", color="grey", alpha=0.7, label="its baseline"
        )
    if bad:
        ax.scatter(
            [b[0] for b in bad], [b[1] for b in bad], s=120, color="#d62728", zorder=5, label="regression"
        )
    planted = [i for i in xs if history[i].planted]
    if planted:
        ax.scatter(
            planted, [ys[xs.index(i)] for i in planted], marker="x", s=80, color="black", label="planted"
        )
    ax.set_xticks(range(len(history)), [e.label for e in history], rotation=30, ha="right", fontsize=7)
    ax.set_title(f"{name}{' (' + unit + ')' if unit else ''}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return png_bytes(fig)


def chart_micro(history: Sequence[Entry]) -> bytes | None:
    """The micro benchmarks' medians per night, each relative to its first night (1.0)."""
    names = sorted({m.name for e in history for m in e.metrics if m.name.startswith(MICRO)})
    if not names:
        return None
    fig = Figure(figsize=(9, 3.5))
    ax = fig.subplots()
    for name in names:
        points = [(i, e.metric(name)) for i, e in enumerate(history)]
        found = [(i, m.median) for i, m in points if m is not None and math.isfinite(m.median)]
        if not found:
            continue
        first = found[0][1]
        ax.plot(
            [i for i, _ in found], [v / first for _, v in found], marker=".", label=name.removeprefix(MICRO)
        )
    ax.set_xticks(range(len(history)), [e.label for e in history], rotation=30, ha="right", fontsize=7)
    ax.set_title("micro benchmarks: median time relative to the first night", fontsize=10)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png_bytes(fig)


def render_trend(history: Sequence[Entry]) -> str:
    """The trend page as one HTML document."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>sotw nightly trend</title>"
        f"<style>{CSS}</style></head><body>",
        "<h1>sotw nightly benchmark: trend</h1>",
    ]
    if not history:
        parts += ["<p>No nights recorded yet.</p></body></html>"]
        return "\n".join(parts)
    last = history[-1]
    regressions = [j for j in last.paired if j.status == "regression"]
    state = "PASS" if last.verdict in ("pass", "") and not regressions else "FAIL"
    parts += [
        f"<p><span class='{state}'>{state}</span> latest night <b>{html.escape(last.label)}</b> against its "
        f"baseline {html.escape(last.baseline_commit[:10] or '-')}, measured side by side; machine: "
        f"{html.escape(', '.join(f'{k} {v}' for k, v in last.machine.items()))}</p>",
    ]
    if regressions:
        parts.append("<ul>" + "".join(f"<li>{html.escape(j.sentence())}</li>" for j in regressions) + "</ul>")
    parts += ["<h2>Latest night: candidate against baseline</h2>", html_table(judgement_rows(last.paired))]
    images = [(name, chart_metric(name, history)) for name in headline_names(history)]
    micro = chart_micro(history)
    if micro is not None:
        images.append(("micro benchmarks", micro))
    for title, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'></figure>")
    rows = [
        [e.label, e.branch, e.baseline_commit[:10], e.verdict or "-",
         "yes: " + ", ".join(f"{k}={v}" for k, v in e.planted.items()) if e.planted else "",
         ", ".join(j.name for j in e.paired if j.status == "regression"),
         ", ".join(f"{b.name} {b.exit_code}" for b in e.benchmarks if b.exit_code)]
        for e in history
    ]  # fmt: skip
    head = [
        "night",
        "branch",
        "baseline",
        "verdict",
        "planted",
        "regressions",
        "benchmarks that exited non-zero",
    ]
    parts += ["<h2>Nights</h2>", html_table((head, rows)), "</body></html>"]
    return "\n".join(parts)


def write_trend(history: Sequence[Entry], path: Path) -> Path:
    """Write the trend page to ``path``; return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_trend(history), encoding="utf-8")
    return path
