"""The nightly benchmark's history: one JSON entry per night and commit, and the comparison with a baseline.

An entry (``Entry``) holds every headline metric of one night with all its repetitions, so its noise is
stated with it, and the machine it ran on. ``compare`` judges a night against the nights before it on the same
machine: a metric regresses when it is worse than the baseline's median by more than a noise-aware threshold
(the larger of ``k`` times the noise seen, within the night and between nights, and a floor per kind of
metric). Throughput is judged through ratios measured in the same run (simulator / bare producer, pipeline /
bare consumer), which a busy neighbour moves much less than the rates themselves.

The entry's shape is a contract like ``results.json``'s (docs/nightly.md): ``HISTORY_SCHEMA`` changes when a
field is renamed, removed or changes meaning, and ``Entry.from_json`` refuses any other version.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.regressions.paired import PairedJudgement
from loadtest.reports.plain import from_plain, to_plain

HISTORY_SCHEMA = 1
BETTER = ("higher", "lower")
KINDS = ("ratio", "throughput", "latency", "lag", "recovery", "time", "memory")

# The least change that counts as a regression, relative to the baseline: run-to-run noise on a shared 2-core
# machine, measured by running the set twice on unchanged code (docs/nightly.md).
RELATIVE_FLOOR = {
    "ratio": 0.20,
    "throughput": 0.30,
    "latency": 0.50,
    "lag": 0.50,
    "recovery": 0.50,
    "time": 0.30,
    "memory": 0.25,
}
# And in the metric's unit, for the kinds where a small baseline makes any relative floor meaningless.
ABSOLUTE_FLOOR = {"latency": 1000.0, "lag": 1.0, "recovery": 2.0}


@dataclass(frozen=True)
class Metric:
    """One headline metric of a night with every repetition's value.

    Parameters
    ----------
    name
        ``<benchmark>.<figure>``, e.g. ``pipeline_vs_bare.ratio``.
    kind
        One of ``KINDS``: chooses the relative floor of its threshold.
    better
        ``higher`` or ``lower``.
    values
        One value per repetition (NaN where a repetition did not measure it).
    unit
        For the reader.
    """

    name: str
    kind: str
    better: str
    values: list[float]
    unit: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.better not in BETTER:
            raise ValueError(f"metric {self.name!r}: better must be one of {BETTER}, got {self.better!r}")

    @property
    def measured(self) -> list[float]:
        """The finite values."""
        return [v for v in self.values if math.isfinite(v)]

    @property
    def median(self) -> float:
        """The median of the repetitions (NaN if none measured it)."""
        values = self.measured
        return statistics.median(values) if values else math.nan

    @property
    def spread(self) -> float:
        """The repetitions' standard deviation: the noise within the night (0 for one value)."""
        values = self.measured
        return statistics.stdev(values) if len(values) >= 2 else 0.0

    @property
    def log_spread(self) -> float:
        """The standard deviation of the values' logarithms: the noise as a factor (0.1 ~ 10 %)."""
        values = [math.log(v) for v in self.measured if v > 0]
        return statistics.stdev(values) if len(values) >= 2 else 0.0


@dataclass(frozen=True)
class BenchmarkRun:
    """One benchmark command of the night: what ran, how long, how it ended, where its raw output is."""

    name: str
    command: list[str]
    seconds: float
    exit_code: int
    output: str = ""
    log: str = ""


@dataclass(frozen=True)
class Entry:
    """One night: the commit, the machine, the benchmarks run and their metrics, and its baseline's.

    ``planted`` names a regression planted on purpose (the self-test's ``--plant-*``): such a night is
    judged like any other but its commit never becomes a baseline. ``suite`` is the set's sizes (``full`` or
    ``quick``): only nights of the same sizes are drawn together. ``baseline_commit`` and
    ``baseline_metrics`` are the baseline measured side by side with the night (each metric's values paired
    with the night's by repetition), ``paired`` the judgement of each metric on those pairs, and ``verdict``
    the night's: ``pass``, ``regression`` or ``failed`` (a benchmark did not measure).
    """

    night: str
    commit: str
    started_utc: str
    machine: dict[str, Any] = field(default_factory=dict)
    benchmarks: list[BenchmarkRun] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    branch: str = ""
    planted: dict[str, str] = field(default_factory=dict)
    suite: str = "full"
    schema_version: int = HISTORY_SCHEMA
    baseline_commit: str = ""
    baseline_metrics: list[Metric] = field(default_factory=list)
    paired: list[PairedJudgement] = field(default_factory=list)
    verdict: str = ""

    def __post_init__(self) -> None:
        if self.schema_version != HISTORY_SCHEMA:
            raise ValueError(f"schema_version must be {HISTORY_SCHEMA}, got {self.schema_version!r}")
        names = [m.name for m in self.metrics]
        if len(names) != len(set(names)):
            raise ValueError(f"metric names repeat: {sorted(n for n in names if names.count(n) > 1)[0]!r}")

    @property
    def file_name(self) -> str:
        """``<night>-<commit>.json``; a second entry of the same night and commit gets its time appended."""
        return f"{self.night}-{self.commit[:10] or 'nocommit'}.json"

    @property
    def label(self) -> str:
        """How charts and tables name this night: its start (UTC, to the minute) and commit."""
        return f"{self.started_utc[:16].replace('T', ' ')} {self.commit[:7]}".strip()

    def metric(self, name: str) -> Metric | None:
        """The metric called ``name``, if this night measured it."""
        return next((m for m in self.metrics if m.name == name), None)

    def fingerprint(self) -> tuple[Any, ...]:
        """What must match for two nights to be compared: the same kind of machine."""
        m = self.machine
        return (m.get("cpus"), m.get("cpu_model"), m.get("memory_gb"), m.get("platform_machine"))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes null)."""
        out: dict[str, Any] = to_plain(dataclasses.asdict(self))
        return out

    def write(self, directory: Path) -> Path:
        """Write into ``directory`` under ``file_name`` (never over another night's file); return the path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / self.file_name
        if path.exists():
            path = directory / f"{path.stem}-{self.started_utc.replace(':', '')}.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, path: Path) -> Entry:
        """Read and validate one entry.

        Raises
        ------
        HarnessError
            If it is not JSON, not of ``HISTORY_SCHEMA``, or a field is missing or mistyped.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise HarnessError(f"cannot read history entry {path}: {exc}") from None
        if not isinstance(data, dict) or data.get("schema_version") != HISTORY_SCHEMA:
            version = data.get("schema_version") if isinstance(data, dict) else None
            raise HarnessError(
                f"{path} has history schema_version {version!r}; this sotw reads version {HISTORY_SCHEMA} "
                "(docs/nightly.md lists what each version changed)"
            )
        try:
            return from_plain(cls, data, path.name)
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"history entry {path} is invalid: {exc}") from None


def load_history(directory: Path) -> list[Entry]:
    """Every entry in ``directory``, oldest first (by start time)."""
    if not directory.is_dir():
        return []
    entries = [Entry.from_json(p) for p in directory.glob("*.json")]
    return sorted(entries, key=lambda e: e.started_utc)


# ------------------------------------------------------------------------------------------- metrics


# ----------------------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Judgement:
    """One metric of a night against its baseline.

    ``limit`` is the value today's median may not pass (below it for ``higher``, above it for ``lower``);
    ``noise`` is the noise it was derived from, as a factor in log units (0.1 ~ 10 %).
    """

    name: str
    unit: str
    better: str
    status: str
    today: float
    today_spread: float
    baseline: float = math.nan
    baseline_spread: float = math.nan
    limit: float = math.nan
    noise: float = math.nan
    nights: int = 0

    @property
    def change(self) -> float:
        """Today relative to the baseline (0.1 = 10 % higher)."""
        if not math.isfinite(self.baseline) or self.baseline == 0:
            return math.nan
        return (self.today - self.baseline) / abs(self.baseline)

    def sentence(self) -> str:
        """One line naming metric, baseline, today's value and threshold."""
        word, side = ("fell", "below") if self.better == "higher" else ("rose", "above")
        unit = f" {self.unit}" if self.unit else ""
        return (
            f"{self.name} {word} to {self.today:.4g}{unit} ({self.change:+.0%}) against a baseline of "
            f"{self.baseline:.4g}{unit} (median of {self.nights} night(s)); the threshold is {self.limit:.4g}{unit}, "
            f"a regression {side} it (noise {self.noise:.2f} in log units)"
        )


@dataclass(frozen=True)
class Comparison:
    """A night's metrics judged against the nights before it."""

    night: str
    baseline_nights: list[str]
    judgements: list[Judgement]

    @property
    def regressions(self) -> list[Judgement]:
        """The metrics that got worse by more than their threshold."""
        return [j for j in self.judgements if j.status == "regression"]


@dataclass(frozen=True)
class Thresholds:
    """How far a metric may move before it is a regression.

    Rates, ratios, times and memory vary by a factor from run to run, so the comparison is made on the
    logarithms: a metric regresses when it is worse than the baseline by a factor above ``exp(k x noise)``
    and above ``1 + relative`` floor, and by more than the ``absolute`` floor in its unit.

    Parameters
    ----------
    k
        Multiples of the noise: the larger of today's spread, the baseline nights' typical spread within a
        night and, with three nights or more, the spread of their medians between nights.
    relative
        The floor per kind, relative to the baseline.
    absolute
        The floor per kind, in the metric's unit.
    """

    k: float = 3.0
    relative: Mapping[str, float] = field(default_factory=lambda: dict(RELATIVE_FLOOR))
    absolute: Mapping[str, float] = field(default_factory=lambda: dict(ABSOLUTE_FLOOR))


def baseline_of(entry: Entry, history: Iterable[Entry], nights: int) -> list[Entry]:
    """The last ``nights`` entries before ``entry`` of the same suite on the same kind of machine, unplanted."""
    earlier = [
        e
        for e in history
        if e.started_utc < entry.started_utc
        and not e.planted
        and e.suite == entry.suite
        and e.fingerprint() == entry.fingerprint()
    ]
    return earlier[-nights:]


def judge_metric(metric: Metric, past: Sequence[Metric], th: Thresholds) -> Judgement:
    """One metric against the same metric of the baseline nights (``past``, those that measured it)."""
    today, today_spread = metric.median, metric.spread
    if not past or not math.isfinite(today):
        return Judgement(
            metric.name, metric.unit, metric.better, "new", today, today_spread, nights=len(past)
        )
    medians = [m.median for m in past]
    base = statistics.median(medians)
    logs = [math.log(v) for v in medians if v > 0]
    between = statistics.stdev(logs) if len(logs) >= 3 else 0.0
    within = statistics.median(m.log_spread for m in past)
    if len(metric.measured) < 2 and len(logs) < 3:
        # One value a night and fewer than three nights: its noise is unknown, so it is not judged yet.
        return Judgement(
            metric.name, metric.unit, metric.better, "unjudged", today, today_spread, base, nights=len(past)
        )
    noise = max(metric.log_spread, within, between)
    allowed = max(th.k * noise, math.log1p(th.relative.get(metric.kind, 0.25)))
    floor = th.absolute.get(metric.kind, 0.0)
    if metric.better == "higher":
        limit = min(base * math.exp(-allowed), base - floor)
        up = max(base * math.exp(allowed), base + floor)
        status = "regression" if today < limit else "improved" if today > up else "ok"
    else:
        limit = max(base * math.exp(allowed), base + floor)
        down = min(base * math.exp(-allowed), base - floor)
        status = "regression" if today > limit else "improved" if today < down else "ok"
    baseline_spread = (
        statistics.stdev(medians) if len(medians) >= 2 else statistics.median(m.spread for m in past)
    )
    return Judgement(
        metric.name, metric.unit, metric.better, status, today, today_spread, base, baseline_spread, limit, noise,
        len(past),
    )  # fmt: skip


def compare(entry: Entry, baseline: Sequence[Entry], thresholds: Thresholds | None = None) -> Comparison:
    """Judge each of ``entry``'s metrics against the same metric in ``baseline``."""
    th = thresholds or Thresholds()
    judgements = []
    for metric in entry.metrics:
        past = [m for m in (e.metric(metric.name) for e in baseline) if m is not None and m.measured]
        judgements.append(judge_metric(metric, past, th))
    return Comparison(entry.night, [e.label for e in baseline], judgements)


def comparison_text(comparison: Comparison) -> str:
    """The comparison as lines a CI log shows: regressions first, each naming metric, baseline and threshold."""
    lines = [
        f"nightly {comparison.night}: {len(comparison.judgements)} metrics against "
        f"{len(comparison.baseline_nights)} baseline night(s)"
    ]
    for j in comparison.regressions:
        lines.append(f"REGRESSION {j.sentence()}")
    for status in ("improved", "new", "unjudged"):
        names = [j.name for j in comparison.judgements if j.status == status]
        if names:
            lines.append(f"{status}: {', '.join(names)}")
    if not comparison.regressions:
        lines.append("no regression")
    return "\n".join(lines)


def comparison_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The comparison as a table: one row per metric."""
    from loadtest.reports.display import fmt

    head = ["metric", "status", "today (spread)", "baseline (spread)", "change", "threshold"]
    rows = []
    order = {"regression": 0, "improved": 1, "ok": 2, "unjudged": 3, "new": 4}
    for j in sorted(comparison.judgements, key=lambda j: (order[j.status], j.name)):
        change = j.change
        rows.append(
            [
                j.name,
                j.status.upper() if j.status == "regression" else j.status,
                f"{fmt(j.today, j.unit)} ({fmt(j.today_spread)})",
                f"{fmt(j.baseline, j.unit)} ({fmt(j.baseline_spread)})",
                "-" if not math.isfinite(change) else f"{change:+.1%}",
                fmt(j.limit, j.unit),
            ]
        )
    return head, rows
