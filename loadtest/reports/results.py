"""``results.json``: the versioned record of one load-test run, as dataclasses with JSON round trip.

The nightly benchmark job and the report read this file, so its shape is a contract: every field is
described in ``docs/results-schema.md`` and ``SCHEMA_VERSION`` changes whenever a field is renamed, removed
or changes meaning (adding an optional field with a default does not). ``from_json`` refuses any other
version rather than guessing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.reports.plain import from_plain, to_plain

SCHEMA_VERSION = 3
LAYERS = ("producer", "broker", "pipeline", "unknown")
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
VERDICTS = (PASS, FAIL, INCONCLUSIVE)
#: Each verdict's exit code in every command (3 is a Locust run's broken ``--check-*`` threshold).
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 4}
SCOPES = ("steady", "drain", "whole run")
"""What a figure covers: the steady phase, the drain, or the whole run (warm-up included)."""


@dataclass(frozen=True)
class RunInfo:
    """Which run this is: identity, times, machine, versions and the load profile stated in full."""

    run_id: str
    started_ms: int
    ended_ms: int
    load_factor: float
    policy: str
    profile_name: str = "default"
    profile: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    bootstrap: str = ""
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


@dataclass(frozen=True)
class Phase:
    """One phase of the run (``warmup``, ``steady``, ``drain``) in epoch milliseconds."""

    name: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Series:
    """A sampled time series: ``t`` in seconds since the run started, ``values`` in ``unit``."""

    name: str
    unit: str
    t: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    component: str = ""

    def __post_init__(self) -> None:
        if len(self.t) != len(self.values):
            raise ValueError(f"series {self.name!r}: t has {len(self.t)} points, values {len(self.values)}")


@dataclass(frozen=True)
class LatencySummary:
    """Exact percentiles of one latency (milliseconds) over the messages of one phase (``scope``)."""

    name: str
    count: int
    p50: float
    p90: float
    p99: float
    p99_9: float
    max: float
    min: float = math.nan
    mean: float = math.nan
    scope: str = "steady"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"latency {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")


@dataclass(frozen=True)
class Figure:
    """One headline figure of a run: what it is, the phase it covers, its value and unit."""

    name: str
    scope: str
    value: float
    unit: str = ""

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"figure {self.name!r}: scope must be one of {SCOPES}, got {self.scope!r}")


@dataclass(frozen=True)
class ResourceUsage:
    """CPU (percent of one core) and memory of one component over the measured phase."""

    component: str
    cpu_mean: float
    cpu_max: float
    rss_mb_mean: float
    rss_mb_max: float


@dataclass(frozen=True)
class Triage:
    """Where the on-call checks found a discrepancy's cause: each step's answer and the layer at fault."""

    layer: str
    sent: bool | None = None
    delivered: bool | None = None
    in_kafka: bool | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.layer not in LAYERS:
            raise ValueError(f"triage layer must be one of {LAYERS}, got {self.layer!r}")


@dataclass(frozen=True)
class Discrepancy:
    """One way the pipeline's output differs from what a correct pipeline must write, with its triage."""

    kind: str
    session: str
    detail: str
    sensor: str = ""
    seq: int | None = None
    topic: str = ""
    partition: int | None = None
    offset: int | None = None
    triage: Triage | None = None


@dataclass(frozen=True)
class FaultScore:
    """Detection of one kind of violation: what the policy requires, what the pipeline reported, and both."""

    kind: str
    fault: str
    injected: int
    expected: int
    detected: int
    true_positives: int
    precision: float
    recall: float


@dataclass(frozen=True)
class DamageWindow:
    """A degraded session: from which seq, and how many updates (to the session's end) were affected."""

    session: str
    sensor: str
    degraded_from: int | None
    observed_degraded_from: int | None
    updates_affected: int


@dataclass(frozen=True)
class Correctness:
    """The verifier's verdict on the pipeline's output under the run's policy.

    ``contract`` is the output contract it was read with (``full`` or ``tables``, see
    ``loadtest.correctness.contracts``), ``output_format`` ``parquet`` or ``delta``. ``rows_wrong`` counts rows whose
    values are not what their message carried, ``rows_values_checked`` the rows whose values were compared
    with it. Under ``tables``, ``sessions_judged_from_delivered`` counts the sessions that lost messages
    before the pipeline could see them, judged against the table their delivered messages build, and
    ``sessions_not_judged`` those that could not be judged (the ledger does not name their rows).
    ``latency_source`` says which commit time end-to-end latency was measured against
    (``loadtest.correctness.contracts.COMMIT_SOURCES``). ``sessions_judged`` counts the sessions the output
    was held to something for (a session allowed to be absent, and absent, was not judged);
    ``faults_delivered`` how many injected faults of each kind reached the broker, where the pipeline could
    meet them (``loadtest.correctness.checks.faults_delivered``); ``policy_stop`` the violation the job's
    integrity output names as the one that stopped it under ``strict``.
    """

    policy: str
    passed: bool
    sessions_expected: int
    sessions_exact_required: int
    sessions_exact: int
    exact_match_rate: float
    rows_expected: int
    rows_written: int
    rows_lost: int
    rows_repeated: int
    rows_unexpected: int
    malformed_sent: int
    malformed_quarantined: int
    must_stop: bool = False
    statuses: dict[str, int] = field(default_factory=dict)
    faults: list[FaultScore] = field(default_factory=list)
    damage: list[DamageWindow] = field(default_factory=list)
    discrepancies: list[Discrepancy] = field(default_factory=list)
    discrepancy_counts: dict[str, int] = field(default_factory=dict)
    blame: dict[str, int] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    contract: str = "full"
    output_format: str = "parquet"
    rows_wrong: int = 0
    sessions_not_judged: int = 0
    latency_source: str = ""
    rows_values_checked: int = 0
    sessions_judged_from_delivered: int = 0
    sessions_judged: int = 0
    faults_delivered: dict[str, int] = field(default_factory=dict)
    policy_stop: str | None = None


@dataclass(frozen=True)
class CapacityStep:
    """One load factor tried by ``sotw capacity`` and whether the pipeline sustained it."""

    load_factor: float
    target_rate: float
    achieved_rate: float
    sustained: bool
    lag_max: float = math.nan
    latency_p99_ms: float = math.nan
    lag_p95: float = math.nan
    confirmation: bool = False


@dataclass(frozen=True)
class Capacity:
    """The highest rate sustained on this machine, the headroom over 1x, and where the time went."""

    steps: list[CapacityStep] = field(default_factory=list)
    max_sustained_factor: float = math.nan
    max_sustained_rate: float = math.nan
    baseline_rate: float = math.nan
    headroom: float = math.nan
    time_breakdown_ms: dict[str, float] = field(default_factory=dict)
    method: str = "steps"
    lowest_broken_factor: float = math.nan
    confidence: str = ""
    targets: dict[str, float] = field(default_factory=dict)
    check_sustained: bool | None = None


@dataclass(frozen=True)
class IncidentResult:
    """One game-day incident: its window, what was done, and what it did to the pipeline.

    Times are epoch ms; durations seconds. ``detect_s`` / ``recover_s`` are None when there was no symptom
    / no recovery before the run ended; ``loadtest.gameday.recovery`` defines each measurement.
    """

    label: str
    kind: str
    start_ms: int
    end_ms: int
    detect_s: float | None = None
    recover_s: float | None = None
    peak_lag_age_s: float = math.nan
    peak_lag_offsets: float = math.nan
    peak_e2e_ms: float = math.nan
    before_lag_age_p99_s: float = math.nan
    before_e2e_p99_ms: float = math.nan
    e2e_threshold_ms: float = math.nan
    stopped: bool = False
    stop_after_s: float | None = None
    stop_triggers: int | None = None
    stop_message: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    #: What the incident's own actions measured (a node's return, leadership moving; NaN: never happened).
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DrillCheck:
    """One expectation of a drill's scorecard: what it needs, what was measured, and whether it was met."""

    name: str
    expected: str
    measured: str
    met: bool


@dataclass(frozen=True)
class DrillScore:
    """A drill's scorecard: PASS only if every expectation was met."""

    name: str
    description: str
    checks: list[DrillCheck] = field(default_factory=list)
    passed: bool = False


@dataclass(frozen=True)
class Verdict:
    """The run's verdict and why.

    PASS only if the pipeline kept up and the correctness checks hold; FAIL with the reasons it did not;
    INCONCLUSIVE when nothing failed but the run judged too little to pass (too few sessions judged, a fault
    kind the profile injects that never reached the broker, too short a steady phase), with why. Anything
    but PASS is not a pass.
    """

    verdict: str
    reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    @property
    def passed(self) -> bool:
        """PASS, and nothing else."""
        return self.verdict == PASS


def exit_code(verdicts: Iterable[str]) -> int:
    """A command's exit code for the verdicts of its runs: FAIL's if any failed, else INCONCLUSIVE's if any was."""
    seen = set(verdicts)
    for verdict in (FAIL, INCONCLUSIVE):
        if verdict in seen:
            return EXIT_CODES[verdict]
    return EXIT_CODES[PASS]


@dataclass(frozen=True)
class Results:
    """Everything one run measured and concluded; the content of ``results.json``."""

    run: RunInfo
    verdict: Verdict
    phases: list[Phase] = field(default_factory=list)
    throughput: list[Series] = field(default_factory=list)
    lag: list[Series] = field(default_factory=list)
    latency_series: list[Series] = field(default_factory=list)
    latency: list[LatencySummary] = field(default_factory=list)
    resources: list[ResourceUsage] = field(default_factory=list)
    resource_series: list[Series] = field(default_factory=list)
    summary: list[Figure] = field(default_factory=list)
    correctness: Correctness | None = None
    capacity: Capacity | None = None
    harness_overhead: dict[str, float] = field(default_factory=dict)
    incidents: list[IncidentResult] = field(default_factory=list)
    drill: DrillScore | None = None
    pipeline_stop: str | None = None
    data_loss_reports: int = 0
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version must be {SCHEMA_VERSION}, got {self.schema_version!r}")
        seen: set[tuple[str, str]] = set()
        for f in self.summary:
            if (f.name, f.scope) in seen:
                raise ValueError(f"summary states {f.name!r} ({f.scope}) twice")
            seen.add((f.name, f.scope))

    def figure(self, name: str, scope: str = "steady") -> float:
        """The value of summary figure ``name`` over ``scope``; NaN when the run did not measure it."""
        return next((f.value for f in self.summary if f.name == name and f.scope == scope), math.nan)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes null, because JSON has no NaN)."""
        return typing.cast(dict[str, Any], to_plain(dataclasses.asdict(self)))

    def to_json(self, path: Path | None = None) -> str:
        """Serialize to JSON text, and write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False)
        if path is not None:
            path.write_text(text + "\n", encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: Any) -> Results:
        """Build and validate from a parsed ``results.json``.

        Raises
        ------
        HarnessError
            If the version is not ``SCHEMA_VERSION`` or a field is missing, unknown or of the wrong type.
        """
        if not isinstance(data, dict):
            raise HarnessError("results.json must hold a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            run = data.get("run")
            writer = run.get("versions", {}).get("sotw") if isinstance(run, dict) else None
            by = f" (written by sotw {writer})" if writer else ""
            raise HarnessError(
                f"results.json has schema_version {version!r}{by}; this sotw reads only version "
                f"{SCHEMA_VERSION}: read it with the sotw that wrote it, or run the load test again "
                "(docs/results-schema.md lists what each version changed)"
            )
        try:
            return from_plain(cls, data, "results")
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"results.json is invalid: {exc}") from None

    @property
    def drill_verdict(self) -> str | None:
        """A drill's verdict: FAIL if an expectation was not met, else its run's INCONCLUSIVE, else PASS.

        Every expectation met means nothing when the run judged too little; None for a run that is no drill.
        """
        if self.drill is None:
            return None
        if not self.drill.passed:
            return FAIL
        return INCONCLUSIVE if self.verdict.verdict == INCONCLUSIVE else PASS

    @classmethod
    def from_json(cls, source: str | Path) -> Results:
        """Parse JSON text, or read it from a path, and validate it (see ``from_dict``)."""
        text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HarnessError(f"results.json is not JSON: {exc}") from None
        return cls.from_dict(data)
