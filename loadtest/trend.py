"""The nightly benchmark's trend page: one chart per headline metric over nights and commits, regressions marked.

Each night is judged against its own baseline (the nights before it, as ``sotw nightly`` judged it), so a
regression stays marked on the night it appeared. The page is one self-contained HTML file with the charts
embedded, like the load-test report.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from loadtest.history import Comparison, Entry, Thresholds, baseline_of, compare, comparison_rows
from loadtest.report import _CSS, _html_table, _png

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


def judged(history: Sequence[Entry], nights: int, thresholds: Thresholds | None = None) -> list[Comparison]:
    """Every night against its own baseline."""
    return [compare(e, baseline_of(e, history, nights), thresholds) for e in history]


def chart_metric(name: str, history: Sequence[Entry], comparisons: Sequence[Comparison]) -> bytes:
    """One metric's median per night with its spread, the regressions in red."""
    fig = Figure(figsize=(9, 2.8))
    ax = fig.subplots()
    xs, ys, errs, bad, unit = [], [], [], [], ""
    for i, (entry, comparison) in enumerate(zip(history, comparisons, strict=True)):
        metric = entry.metric(name)
        if metric is None or not math.isfinite(metric.median):
            continue
        unit = metric.unit
        xs.append(i)
        ys.append(metric.median)
        errs.append(metric.spread)
        if any(j.name == name and j.status == "regression" for j in comparison.judgements):
            bad.append((i, metric.median))
    ax.errorbar(
        xs, ys, yerr=errs, fmt="o-", color="#1f77b4", capsize=3, label="median of the night (+/- spread)"
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
    return _png(fig)


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
    return _png(fig)


def render_trend(history: Sequence[Entry], nights: int, thresholds: Thresholds | None = None) -> str:
    """The trend page as one HTML document."""
    comparisons = judged(history, nights, thresholds)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>sotw nightly trend</title>"
        f"<style>{_CSS}</style></head><body>",
        "<h1>sotw nightly benchmark: trend</h1>",
    ]
    if not history:
        parts += ["<p>No nights recorded yet.</p></body></html>"]
        return "\n".join(parts)
    last, latest = history[-1], comparisons[-1]
    state = "FAIL" if latest.regressions else "PASS"
    parts += [
        f"<p><span class='{state}'>{state}</span> latest night <b>{html.escape(last.label)}</b> against "
        f"{len(latest.baseline_nights)} baseline night(s); machine: "
        f"{html.escape(', '.join(f'{k} {v}' for k, v in last.machine.items()))}</p>",
    ]
    if latest.regressions:
        parts.append(
            "<ul>" + "".join(f"<li>{html.escape(j.sentence())}</li>" for j in latest.regressions) + "</ul>"
        )
    parts += ["<h2>Latest night against its baseline</h2>", _html_table(comparison_rows(latest))]
    images = [(name, chart_metric(name, history, comparisons)) for name in headline_names(history)]
    micro = chart_micro(history)
    if micro is not None:
        images.append(("micro benchmarks", micro))
    for title, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'></figure>")
    rows = [
        [e.label, e.branch, "yes: " + ", ".join(f"{k}={v}" for k, v in e.planted.items()) if e.planted else "",
         str(len(c.regressions)), ", ".join(f"{b.name} {b.exit_code}" for b in e.benchmarks if b.exit_code)]
        for e, c in zip(history, comparisons, strict=True)
    ]  # fmt: skip
    parts += [
        "<h2>Nights</h2>",
        _html_table((["night", "branch", "planted", "regressions", "failed benchmarks"], rows)),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_trend(
    history: Sequence[Entry], path: Path, nights: int, thresholds: Thresholds | None = None
) -> Path:
    """Write the trend page to ``path``; return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_trend(history, nights, thresholds), encoding="utf-8")
    return path
