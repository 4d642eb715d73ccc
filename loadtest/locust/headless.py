"""What a headless Locust run adds for CI: sotw's figures in ``--csv`` and ``--html``, and ``--check-*`` thresholds.

The thresholds follow locust-plugins' ``--check-rps``/``--check-fail-ratio``: each bounds one of the run's
figures (``results.json``, the same figures and verdict ``sotw run`` computes), and a run that breaks any of
them exits with ``EXIT_CODE`` so a pipeline step can gate on it.
"""

from __future__ import annotations

import csv
import html
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.reports.results import EXIT_CODES, INCONCLUSIVE, Results

#: The process exit code of a run that broke a threshold (locust-plugins' checks use the same).
EXIT_CODE = 3
#: The verdict's correctness counts a run's outputs show (``--csv``, ``--html``, the UI's Correctness tab).
CORRECTNESS_COUNTS = (
    "sessions_expected",
    "sessions_exact",
    "sessions_exact_required",
    "rows_expected",
    "rows_written",
    "rows_lost",
    "rows_repeated",
    "rows_unexpected",
)


@dataclass(frozen=True)
class Gates:
    """The thresholds asked for; None (or False) leaves one out.

    Parameters
    ----------
    max_lag_age_s
        The age of the oldest unprocessed message stays below this during the steady phase (its maximum).
    max_end_to_end_p99_s
        The p99 end-to-end latency of the messages meant for the steady phase stays below this.
    correct
        The output matches the ledger (the verifier passed).
    verdict
        The run's whole verdict is PASS, as ``sotw run``'s exit code requires.
    """

    max_lag_age_s: float | None = None
    max_end_to_end_p99_s: float | None = None
    correct: bool = False
    verdict: bool = False

    @property
    def any(self) -> bool:
        """Whether any threshold is set."""
        return (
            self.max_lag_age_s is not None
            or self.max_end_to_end_p99_s is not None
            or self.correct
            or self.verdict
        )

    def failures(self, results: Results | None) -> list[str]:
        """Each threshold the run broke, in words; a run without results breaks every one asked for."""
        if results is None:
            return ["the run ended without results"] if self.any else []
        steady = {f.name: f.value for f in results.summary if f.scope == "steady"}
        out = []
        if self.max_lag_age_s is not None:
            lag = steady.get("lag_age_max", math.nan)
            if not lag <= self.max_lag_age_s:
                out.append(f"lag age max {lag:.1f} s is not below --check-lag-age {self.max_lag_age_s:g} s")
        if self.max_end_to_end_p99_s is not None:
            p99 = steady.get("end_to_end_p99", math.nan) / 1000.0
            if not p99 <= self.max_end_to_end_p99_s:
                out.append(
                    f"end-to-end p99 {p99:.2f} s is not below --check-e2e-p99 {self.max_end_to_end_p99_s:g} s"
                )
        correctness = results.correctness
        if self.correct and (correctness is None or not correctness.passed):
            reasons = "; ".join(correctness.reasons) if correctness else "no correctness verdict"
            out.append(f"--check-correct: {reasons or 'the verifier failed'}")
        if self.verdict and results.verdict.verdict != "PASS":
            out.append(f"--check-verdict: {results.verdict.verdict}: {'; '.join(results.verdict.reasons)}")
        return out


def exit_code_of(failures: list[str], results: Results | None) -> int:
    """The exit code of a run that broke ``failures``: INCONCLUSIVE's (4) when that verdict is all it broke.

    A run that judged too little did not fail: ``--check-verdict`` alone then exits as ``sotw run`` does.
    """
    only_verdict = all(f.startswith("--check-verdict:") for f in failures)
    if results is not None and only_verdict and results.verdict.verdict == INCONCLUSIVE:
        return EXIT_CODES[INCONCLUSIVE]
    return EXIT_CODE


def summary_rows(results: Results) -> list[list[Any]]:
    """The run's figures as CSV rows: name, scope, value, unit (verdict and correctness first)."""
    rows: list[list[Any]] = [["verdict", "run", results.verdict.verdict, ""]]
    rows += [["verdict_reason", "run", reason, ""] for reason in results.verdict.reasons]
    c = results.correctness
    if c is not None:
        rows.append(["correct", "run", c.passed, ""])
        for name in CORRECTNESS_COUNTS:
            rows.append([name, "run", getattr(c, name), "sessions" if "sessions" in name else "rows"])
        rows += [[f"blame_{layer}", "run", n, "discrepancies"] for layer, n in sorted(c.blame.items())]
    rows += [[f.name, f.scope, f.value, f.unit] for f in results.summary]
    return rows


HISTORY_COLUMNS = (
    "ts",
    "phase",
    "users",
    "load",
    "sent",
    "acked",
    "consumed",
    "lag_offsets",
    "lag_max_partition",
    "lag_age_s",
    "batches",
    "batch_duration_ms",
    "cpu_harness",
    "cpu_simulator",
    "cpu_pipeline",
    "cpu_broker",
)


def write_csvs(results: Results, run_dir: Path, latency: list[dict[str, Any]], prefix: str) -> list[Path]:
    """Write sotw's CSV files beside Locust's ``--csv PREFIX`` files; returns their paths.

    ``PREFIX_sotw.csv`` (figures and verdict), ``PREFIX_sotw_history.csv`` (the run's samples, one a second)
    and ``PREFIX_sotw_latency.csv`` (end-to-end latency by window of commit time, ``latency`` as the live
    verifier gives it).
    """
    base = Path(prefix)
    base.parent.mkdir(parents=True, exist_ok=True)
    figures_path = base.with_name(base.name + "_sotw.csv")
    with figures_path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["name", "scope", "value", "unit"])
        writer.writerows(summary_rows(results))
    history_path = base.with_name(base.name + "_sotw_history.csv")
    samples = run_dir / "samples.jsonl"
    with history_path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(HISTORY_COLUMNS)
        if samples.is_file():
            for line in samples.read_text().splitlines():
                row = json.loads(line)
                writer.writerow([row.get(c, "") for c in HISTORY_COLUMNS])
    latency_path = base.with_name(base.name + "_sotw_latency.csv")
    with latency_path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["window_start_ms", "count", "p50_ms", "p90_ms", "p99_ms", "max_ms"])
        for w in latency:
            writer.writerow([w["t_ms"], w["count"], w["p50"], w["p90"], w["p99"], w["max"]])
    return [figures_path, history_path, latency_path]


def add_to_html(
    path: Path,
    results: Results,
    topics: list[dict[str, Any]],
    latency: list[dict[str, Any]],
    report: Path | None,
) -> None:
    """Put sotw's verdict, figures, lag by topic and latency windows into Locust's ``--html`` report.

    The section goes before the report's ``</body>``; ``report`` is sotw's own report of the run, named in it.
    """

    def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows
        )
        return (
            f"<h3>{html.escape(title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )

    lag_rows = [[t["topic"], t["offsets"], t["age_s"]] for t in topics]
    latency_rows = [
        [
            time.strftime("%H:%M:%S", time.localtime(w["t_ms"] / 1000)),
            w["count"],
            w["p50"],
            w["p99"],
            w["max"],
        ]
        for w in latency
    ]
    section = (
        '<section id="sotw" style="font-family:sans-serif;margin:2em;max-width:1100px">'
        f"<h2>sotw: {html.escape(results.verdict.verdict)}</h2>"
        + "".join(f"<p>{html.escape(r)}</p>" for r in results.verdict.reasons)
        + (f"<p>Full report: {html.escape(str(report))}</p>" if report else "")
        + table("Figures and correctness", ["name", "scope", "value", "unit"], summary_rows(results))
        + table("Consumer lag by topic (at the end)", ["topic", "offsets", "age (s)"], lag_rows)
        + table(
            "End-to-end latency by 5 s of commit time (ms)",
            ["window", "messages", "p50", "p99", "max"],
            latency_rows,
        )
        + "</section>"
    )
    text = path.read_text(encoding="utf-8")
    at = text.rfind("</body>")
    path.write_text(text[:at] + section + text[at:] if at >= 0 else text + section, encoding="utf-8")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value == value else "-"
    return str(value)
