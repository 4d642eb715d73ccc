"""``sotw compare A B``: two results files side by side, B judged against A as the nightly job judges a night.

Each side is a load test's ``results.json`` (its headline metrics), a run directory holding one (or ``sotw
bench``'s ``1x`` and ``10x``), or a nightly history entry. B's metrics are judged against A's with the same
noise-aware thresholds as ``sotw nightly`` (``loadtest.regressions.history.compare``); with ``--fail-on-regression`` the
command exits 1 when one got worse by more than its threshold.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from loadtest.errors import HarnessError
from loadtest.regressions.history import HISTORY_SCHEMA, Entry, Metric, Thresholds, compare, comparison_rows
from loadtest.regressions.metrics import metrics_from_results
from loadtest.reports.results import Results


def _results_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    direct = path / "results.json"
    if direct.is_file():
        return [direct]
    found = sorted(path.glob("*/results.json"))
    if not found:
        raise HarnessError(
            f"{path} holds no results.json (nor */results.json): give a results file or run directory"
        )
    return found


def entry_of(path: Path) -> Entry:
    """``path`` as a history entry: read as one, or built from the results files it names.

    Raises
    ------
    HarnessError
        If it is neither a history entry nor a results file or run directory.
    """
    if not path.exists():
        raise HarnessError(f"{path} does not exist")
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise HarnessError(f"cannot read {path}: {exc}") from None
        if isinstance(data, dict) and "night" in data and data.get("schema_version") == HISTORY_SCHEMA:
            return Entry.from_json(path)
    metrics: list[Metric] = []
    started = ""
    commit = ""
    verdicts = []
    for file in _results_files(path):
        result = Results.from_json(file)
        metrics += metrics_from_results(f"{result.run.load_factor:g}x", [result])
        started = started or str(result.run.started_ms)
        commit = commit or result.run.versions.get("sotw", "")
        verdicts.append(f"{result.run.load_factor:g}x {result.verdict.verdict}")
    return Entry(
        night=str(path), commit=commit, started_utc=started, metrics=metrics, verdict=", ".join(verdicts)
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw compare`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sotw compare",
        description="Two results side by side (results.json, a run directory, or a nightly history entry): "
        "B judged against A with the nightly job's noise-aware thresholds.",
    )
    p.add_argument("a", type=Path, help="the reference")
    p.add_argument("b", type=Path, help="the one judged against it")
    p.add_argument("-k", type=float, default=3.0, help="threshold in multiples of the noise (3)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 if B regressed against A")
    return p


def main(argv: Sequence[str]) -> int:
    """Print the side-by-side table; exit 1 on a regression with ``--fail-on-regression``."""
    from loadtest.regressions.history import comparison_text
    from loadtest.reports.pages import md_table

    args = build_parser().parse_args(list(argv))
    a, b = entry_of(args.a), entry_of(args.b)
    # Side by side, whatever machines they ran on: the user chose the pair.
    b = dataclasses.replace(b, machine=a.machine)
    comparison = compare(b, [a], Thresholds(k=args.k))
    _, rows = comparison_rows(comparison)
    print(f"A: {args.a} ({a.verdict or 'no verdict'})\nB: {args.b} ({b.verdict or 'no verdict'})\n")
    print(md_table((["metric", "status", "B (spread)", "A (spread)", "change", "threshold"], rows)))
    print(comparison_text(comparison))
    return 1 if args.fail_on_regression and comparison.regressions else 0
