"""The engines side by side: one row per engine (verdicts, rows wrong, recovery, end-to-end p99, the highest rate sustained, CPU and memory per message), one row per run, and a chart of the figures.

Every figure is the run's own, from its ``results.json``: the end-to-end p99 and the pipeline's CPU of the
steady phase, the recovery time of each drill's incidents, the capacity search's highest sustained rate. CPU
per message is the job's CPU (its whole process tree: a Spark driver, its JVM and Python workers; a Streams
JVM; a Python process) over the messages it consumed in the same phase, so a job that idles at a low load
shows its fixed cost there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from loadtest.engines.catalog import Engine
from loadtest.engines.steps import Outcome, drill_name, verdict_of
from loadtest.reports.display import RUN_COLOURS, fmt
from loadtest.reports.pages import Table, png_bytes
from loadtest.reports.results import Results

#: The component whose CPU and memory are the job's.
JOB = "pipeline"


def rows_wrong(results: Results) -> int:
    """Rows the verdict found lost, repeated, unexpected or with wrong values (0 without a verdict on rows)."""
    c = results.correctness
    if c is None:
        return 0
    return c.rows_lost + c.rows_repeated + c.rows_unexpected + c.rows_wrong


def cpu_us_per_message(results: Results) -> float:
    """The job's CPU per consumed message in the steady phase, in microseconds (NaN if not measured)."""
    job = next((r for r in results.resources if r.component == JOB), None)
    consumed = results.figure("consumed_rate")
    if job is None or not consumed > 0:
        return math.nan
    return job.cpu_mean / 100 * 1e6 / consumed


def peak_rss_mb(results: Results) -> float:
    """The job's largest resident memory in the steady phase, in MB (NaN if not measured)."""
    job = next((r for r in results.resources if r.component == JOB), None)
    return math.nan if job is None else job.rss_mb_max


def recoveries(results: Results) -> list[float | None]:
    """Each incident's recovery time in seconds (None: not back to normal before the run ended)."""
    return [i.recover_s for i in results.incidents]


def end_to_end_p99_s(results: Results) -> float:
    """The steady phase's end-to-end p99 in seconds."""
    return results.figure("end_to_end_p99") / 1000


@dataclass
class EngineRow:
    """One engine's figures across its runs, keyed by step label (``run 1x``, ``drill pipeline-kill-1x``)."""

    engine: Engine
    outcomes: list[Outcome] = field(default_factory=list)
    left_out: str = ""

    def verdict(self, label: str) -> str:
        """The step's verdict (a drill's scorecard's), or why it has none."""
        found = self._outcome(label)
        if self.left_out:
            return "not run"
        return "-" if found is None else found.verdict

    def _outcome(self, label: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.step.label == label), None)

    def results(self, label: str) -> Results | None:
        """The step's results, if it wrote any."""
        found = self._outcome(label)
        return None if found is None else found.results

    @property
    def all_results(self) -> list[Results]:
        """Every results file the engine's runs wrote."""
        return [o.results for o in self.outcomes if o.results is not None]

    @property
    def rows_wrong(self) -> int:
        """Rows wrong over all the engine's runs."""
        return sum(rows_wrong(r) for r in self.all_results)

    @property
    def rows_wrong_text(self) -> str:
        """Rows wrong, saying over how many runs when some wrote no results."""
        if not self.all_results:
            return "-"
        counted = fmt(self.rows_wrong)
        if len(self.all_results) < len(self.outcomes):
            return f"{counted} (in {len(self.all_results)} of {len(self.outcomes)} runs)"
        return counted

    @property
    def max_rate(self) -> float:
        """The capacity search's highest sustained rate in msg/s (NaN without one, or one that did not PASS)."""
        found = self.results("capacity")
        if found is None or found.capacity is None or found.verdict.verdict != "PASS":
            return math.nan
        return found.capacity.max_sustained_rate

    @property
    def max_rate_text(self) -> str:
        """The highest sustained rate, or the capacity search's verdict when it found none to trust."""
        found = self._outcome("capacity")
        if found is None:
            return "-"
        return fmt(self.max_rate, "msg/s") if math.isfinite(self.max_rate) else f"none ({found.verdict})"

    @property
    def peak_rss_mb(self) -> float:
        """The job's largest memory over the engine's runs."""
        values = [v for v in (peak_rss_mb(r) for r in self.all_results) if math.isfinite(v)]
        return max(values, default=math.nan)


def engine_rows(
    engines: Sequence[Engine], outcomes: Sequence[Outcome], left_out: dict[str, str]
) -> list[EngineRow]:
    """The outcomes grouped by engine, in the engines' order."""
    return [
        EngineRow(e, [o for o in outcomes if o.step.engine.name == e.name], left_out.get(e.name, ""))
        for e in engines
    ]


def _recovery_text(results: Results | None) -> str:
    if results is None or not results.incidents:
        return "-"
    return ", ".join("not back" if s is None else fmt(s, "s") for s in recoveries(results))


def _per_load(rows: EngineRow, loads: Sequence[str], read: Any, unit: str) -> str:
    values = []
    for load in loads:
        found = rows.results(f"run {load}")
        values.append(fmt(read(found), digits=2) if found is not None else "-")
    if all(v == "-" for v in values):
        return "-"
    return " / ".join(values) + (f" {unit}" if unit else "")


def headline(rows: Sequence[EngineRow], loads: Sequence[str], drills: Sequence[str]) -> Table:
    """One row per engine: each run's verdict, rows wrong, each drill's recovery, per-load p99 and CPU, rate, memory."""
    loads_text = " / ".join(loads)
    head = ["engine", *(f"run {load}" for load in loads)]
    for drill in drills:
        head += [f"drill {drill_name(drill)}", f"{drill_name(drill)} recovery"]
    head += [
        "rows wrong",
        f"end-to-end p99 {loads_text}",
        "max sustained rate",
        f"CPU per message {loads_text}",
        "peak memory",
    ]
    body = []
    for row in rows:
        cells = [row.engine.name, *(row.verdict(f"run {load}") for load in loads)]
        for drill in drills:
            label = f"drill {drill_name(drill)}"
            cells += [row.verdict(label), _recovery_text(row.results(label))]
        cells += [
            row.rows_wrong_text,
            _per_load(row, loads, end_to_end_p99_s, "s"),
            row.max_rate_text,
            _per_load(row, loads, cpu_us_per_message, "µs"),
            fmt(row.peak_rss_mb, "MB"),
        ]
        body.append(cells)
    return head, body


def runs_table(outcomes: Sequence[Outcome]) -> Table:
    """One row per run: its verdict, exit code, time, rows wrong, recovery, p99, rate consumed, CPU, memory, directory."""
    head = [
        "engine", "run", "verdict", "exit", "took", "rows wrong", "recovery", "end-to-end p99",
        "consumed", "CPU per message", "peak memory", "directory",
    ]  # fmt: skip
    body = []
    for o in outcomes:
        r = o.results
        body.append(
            [
                o.step.engine.name,
                o.step.label,
                o.verdict,
                str(o.exit_code),
                fmt(round(o.seconds), "s"),
                fmt(rows_wrong(r)) if r else "-",
                _recovery_text(r),
                fmt(end_to_end_p99_s(r), "s", 2) if r else "-",
                fmt(r.figure("consumed_rate"), "msg/s") if r else "-",
                fmt(cpu_us_per_message(r), "µs", 2) if r else "-",
                fmt(peak_rss_mb(r), "MB") if r else "-",
                str(o.step.directory),
            ]
        )
    return head, body


def as_json(rows: Sequence[EngineRow], left_out: dict[str, str]) -> dict[str, Any]:
    """The comparison as plain data: each engine's runs with their figures (null where not measured)."""

    def number(value: float | None) -> float | None:
        return None if value is None or not math.isfinite(value) else round(value, 3)

    engines = []
    for row in rows:
        runs = []
        for o in row.outcomes:
            r = o.results
            runs.append(
                {
                    "run": o.step.label,
                    "directory": str(o.step.directory),
                    "exit_code": o.exit_code,
                    "seconds": round(o.seconds, 1),
                    "verdict": verdict_of(r) if r else None,
                    "problem": o.problem or None,
                    "rows_wrong": rows_wrong(r) if r else None,
                    "recover_s": [number(s) for s in recoveries(r)] if r else [],
                    "end_to_end_p99_s": number(end_to_end_p99_s(r)) if r else None,
                    "consumed_rate": number(r.figure("consumed_rate")) if r else None,
                    "cpu_us_per_message": number(cpu_us_per_message(r)) if r else None,
                    "peak_rss_mb": number(peak_rss_mb(r)) if r else None,
                    "max_sustained_rate": number(r.capacity.max_sustained_rate) if r and r.capacity else None,
                }
            )
        engines.append(
            {
                "engine": row.engine.name,
                "description": row.engine.description,
                "args": list(row.engine.args),
                "left_out": left_out.get(row.engine.name),
                "runs": runs,
            }
        )
    return {"engines": engines}


def chart(rows: Sequence[EngineRow], loads: Sequence[str]) -> bytes | None:
    """Grouped bars per engine, one colour per load: end-to-end p99 (s), CPU per message (µs), the rate.

    The highest sustained rate is drawn when a capacity search ran. A figure not measured is marked n/a, not
    drawn as a zero.
    """
    measured = [r for r in rows if r.all_results]
    if not measured:
        return None
    rates = [r.max_rate for r in measured]

    def per_load(read: Any) -> list[list[float]]:
        out = []
        for load in loads:
            found = [r.results(f"run {load}") for r in measured]
            out.append([math.nan if f is None else read(f) for f in found])
        return out

    panels: list[tuple[str, list[list[float]], list[str]]] = [
        ("end-to-end p99 (s, steady)", per_load(end_to_end_p99_s), list(loads)),
        ("job CPU per message (µs, steady)", per_load(cpu_us_per_message), list(loads)),
    ]
    if any(math.isfinite(v) for v in rates):
        panels.append(("highest sustained rate (msg/s)", [rates], ["capacity"]))
    fig = Figure(figsize=(5.5 * len(panels), 4))
    for index, (title, groups, names) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        width = 0.8 / len(groups)
        for k, (values, name) in enumerate(zip(groups, names, strict=True)):
            xs = [i + (k - (len(groups) - 1) / 2) * width for i in range(len(measured))]
            heights = [v if math.isfinite(v) else 0.0 for v in values]
            ax.bar(xs, heights, width, label=name, color=RUN_COLOURS[k % len(RUN_COLOURS)])
            for x, v in zip(xs, values, strict=True):
                if not math.isfinite(v):
                    ax.annotate("n/a", (x, 0), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(measured)), [r.engine.name for r in measured], rotation=15)
        ax.set_title(title)
        if len(groups) > 1 or names != ["capacity"]:
            ax.legend(title="load")
    return png_bytes(fig)
