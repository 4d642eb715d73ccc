"""Drills: a named game day in a file (a profile, its incidents, and what must hold), scored after the run.

A drill file is TOML::

    [drill]
    description = "kill -9 of the pipeline at 10x: nothing lost or repeated, recovered within 45 s"
    profile = "baseline"              # a profile of the scenario file (or `scenario = "path.toml"` too)
    load = "10x"
    broker = "kafka"                  # the local broker: kafka (one node, default) or kafka-3
    broker_settings = { "min.insync.replicas" = 1 }   # server.properties of its nodes (optional)
    security = "sasl_ssl"             # the local broker's security (optional; plaintext by default)
    netns = true                      # nodes and pipeline on a network of hosts, for network incidents (optional)
    simulator = { faults = {} }       # changes to the profile's fleet and faults (optional)
    pipeline = { trigger = "1s" }     # changes to its pipeline settings (optional)
    run = { steady_s = 90 }           # changes to its phases (optional)

    [[incidents]]                     # see loadtest.gameday.incidents for every kind and its parameters
    kind = "pipeline_kill"
    at_s = 20                         # seconds into the steady phase
    restart_after_s = 5

    [expect]                          # every line is one check of the scorecard
    rows_lost = 0
    rows_repeated = 0
    recover_s = 45

``sotw drill NAME`` runs a shipped drill (``loadtest/gameday/drills/NAME.toml``), ``sotw drill FILE`` a file of the
user's; either way the scorecard lists each expectation with the measured value, and the command exits 0 only
if every one is met. ``EXPECTATIONS`` documents every key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.gameday.incident import Incident
from loadtest.gameday.incidents import incident_from_mapping
from loadtest.reports.results import VERDICTS, Correctness, DrillCheck, DrillScore, IncidentResult
from sotw.broker.local import check_broker
from sotw.broker.security import security_mode
from sotw.errors import BrokerError
from sotw.tomlfile import read_toml


@dataclass(frozen=True)
class DrillOutcome:
    """What a drill's scorecard is checked against: the run's verdicts and each incident's measurements."""

    verdict: str
    correctness: Correctness | None
    recoveries: Sequence[IncidentResult]
    stopped: bool
    stop_message: str
    data_loss_reports: int = 0


def _max_check(name: str, bound: Any, value: float | None, unit: str = "") -> DrillCheck:
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        raise HarnessError(f"expect.{name} must be a number, got {bound!r}")
    shown = "-" if value is None or not math.isfinite(value) else f"{value:,.6g}{unit}"
    met = value is not None and math.isfinite(value) and value <= bound
    return DrillCheck(name, f"<= {bound:,g}{unit}", shown, met)


def _count(outcome: DrillOutcome, name: str) -> float | None:
    return None if outcome.correctness is None else float(getattr(outcome.correctness, name))


def _each_incident(
    name: str, unit: str, value: Callable[[IncidentResult], float | None]
) -> Callable[[DrillOutcome, Any], list[DrillCheck]]:
    def check(outcome: DrillOutcome, bound: Any) -> list[DrillCheck]:
        if not outcome.recoveries:
            return [DrillCheck(name, f"<= {bound}{unit}", "no incident took place", False)]
        return [_max_check(f"{name} ({r.label})", bound, value(r), unit) for r in outcome.recoveries]

    return check


def _flag(
    name: str, value: Callable[[DrillOutcome], bool]
) -> Callable[[DrillOutcome, Any], list[DrillCheck]]:
    def check(outcome: DrillOutcome, wanted: Any) -> list[DrillCheck]:
        if not isinstance(wanted, bool):
            raise HarnessError(f"expect.{name} must be true or false, got {wanted!r}")
        got = value(outcome)
        return [DrillCheck(name, str(wanted).lower(), str(got).lower(), got == wanted)]

    return check


def _stop_message(outcome: DrillOutcome, patterns: Any) -> list[DrillCheck]:
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise HarnessError(f"expect.stop_message must be a regex or a list of them, got {patterns!r}")
    shown = outcome.stop_message[:160] or "(no stop)"
    return [
        DrillCheck("stop_message", f"matches /{p}/", shown, bool(re.search(p, outcome.stop_message)))
        for p in patterns
    ]


def _stop_triggers(outcome: DrillOutcome, bound: Any) -> list[DrillCheck]:
    counted = [r.stop_triggers for r in outcome.recoveries if r.stopped and r.stop_triggers is not None]
    return [_max_check("stop_within_triggers", bound, float(counted[0]) if counted else None)]


def _verdict(outcome: DrillOutcome, wanted: Any) -> list[DrillCheck]:
    if wanted not in VERDICTS:
        raise HarnessError(f"expect.verdict must be one of {', '.join(VERDICTS)}, got {wanted!r}")
    return [DrillCheck("verdict", wanted, outcome.verdict, outcome.verdict == wanted)]


def _figure(name: str, unit: str) -> Callable[[DrillOutcome, Any], list[DrillCheck]]:
    """A figure incidents measure themselves (``IncidentResult.figures``), at most ``bound`` for each.

    NaN (what the incident waited for never happened) fails, and so does a drill none of whose incidents
    measures it.
    """

    def check(outcome: DrillOutcome, bound: Any) -> list[DrillCheck]:
        measured = [r for r in outcome.recoveries if name in r.figures]
        if not measured:
            return [DrillCheck(name, f"<= {bound}{unit}", "no incident measured it", False)]
        return [_max_check(f"{name} ({r.label})", bound, r.figures[name], unit) for r in measured]

    return check


def _blame(layer: str) -> Callable[[DrillOutcome, Any], list[DrillCheck]]:
    def check(outcome: DrillOutcome, bound: Any) -> list[DrillCheck]:
        value = None if outcome.correctness is None else float(outcome.correctness.blame.get(layer, 0))
        return [_max_check(f"blame_{layer}", bound, value)]

    return check


EXPECTATIONS: dict[str, tuple[str, Callable[[DrillOutcome, Any], list[DrillCheck]]]] = {
    "rows_lost": (
        "change rows the pipeline lost, at most",
        lambda o, b: [_max_check("rows_lost", b, _count(o, "rows_lost"))],
    ),
    "rows_repeated": (
        "change rows written more often than the policy allows, at most",
        lambda o, b: [_max_check("rows_repeated", b, _count(o, "rows_repeated"))],
    ),
    "rows_unexpected": (
        "change rows the policy forbids, at most",
        lambda o, b: [_max_check("rows_unexpected", b, _count(o, "rows_unexpected"))],
    ),
    "correct": (
        "the verifier's verdict on the output (true: no discrepancy)",
        _flag("correct", lambda o: o.correctness is not None and o.correctness.passed),
    ),
    "verdict": ("the run's own verdict, PASS, FAIL or INCONCLUSIVE", _verdict),
    "detect_s": (
        "seconds from each incident's start to its first symptom, at most",
        _each_incident("detect_s", " s", lambda r: r.detect_s),
    ),
    "recover_s": (
        "seconds from each incident's end until lag and latency are back, at most",
        _each_incident("recover_s", " s", lambda r: r.recover_s),
    ),
    "peak_lag_s": (
        "the oldest unprocessed message's age during each incident, at most",
        _each_incident("peak_lag_s", " s", lambda r: r.peak_lag_age_s),
    ),
    "peak_e2e_ms": (
        "end-to-end latency during each incident, at most",
        _each_incident("peak_e2e_ms", " ms", lambda r: r.peak_e2e_ms),
    ),
    "stopped": ("whether the pipeline stopped on its own", _flag("stopped", lambda o: o.stopped)),
    "stop_within_triggers": (
        "triggers from the incident's end to the pipeline's stop, at most",
        _stop_triggers,
    ),
    "stop_message": ("regular expressions the pipeline's stop message must match", _stop_message),
    "data_loss_recorded": (
        "whether the pipeline reported data the broker lost",
        _flag("data_loss_recorded", lambda o: o.data_loss_reports > 0),
    ),
    "leaders_moved_s": (
        "seconds from a node's kill (or its cut-off) until the others lead all of the run's partitions, at most",
        _figure("leaders_moved_s", " s"),
    ),
    "controller_moved_s": (
        "seconds from the active controller's cut-off until another node leads the quorum, at most",
        _figure("controller_moved_s", " s"),
    ),
    "elected_s": (
        "seconds from the leader's kill until every partition of the run has a leader again, at most",
        _figure("elected_s", " s"),
    ),
    "rejoined_s": (
        "seconds from a node's start until it is registered and serving, at most",
        _figure("rejoined_s", " s"),
    ),
    "replicated_s": (
        "seconds from a node's start (or a partition's heal) until no partition is under-replicated, at most",
        _figure("replicated_s", " s"),
    ),
    "broker_lost": (
        "whether triage found acknowledged records the broker no longer has (blamed on the broker)",
        _flag(
            "broker_lost",
            lambda o: o.correctness is not None and o.correctness.blame.get("broker", 0) > 0,
        ),
    ),
    "blame_pipeline": ("discrepancies triage blames on the pipeline, at most", _blame("pipeline")),
    "blame_producer": ("discrepancies triage blames on the producer, at most", _blame("producer")),
}


@dataclass(frozen=True)
class Drill:
    """One drill, as read from its file."""

    name: str
    description: str
    profile: str
    load: str = "1x"
    scenario: Path | None = None
    broker: str = "kafka"
    broker_settings: Mapping[str, str] = field(default_factory=dict)
    security: str = "plaintext"
    netns: bool = False
    simulator: Mapping[str, Any] = field(default_factory=dict)
    pipeline: Mapping[str, Any] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=dict)
    incidents: tuple[Incident, ...] = ()
    expect: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        try:
            check_broker(self.broker)
            security_mode(self.security)
        except BrokerError as exc:
            raise HarnessError(f"drill {self.name}: {exc}") from None
        unknown = sorted(set(self.expect) - set(EXPECTATIONS))
        if unknown:
            raise HarnessError(
                f"drill {self.name}: unknown expectation {unknown[0]!r} (known: {', '.join(sorted(EXPECTATIONS))})"
            )

    def score(self, outcome: DrillOutcome) -> DrillScore:
        """Each expectation against the outcome, in the file's order."""
        checks: list[DrillCheck] = []
        for key, bound in self.expect.items():
            checks += EXPECTATIONS[key][1](outcome, bound)
        # An incident that could not be carried out rehearsed nothing: the drill cannot pass on it.
        checks += [
            DrillCheck(f"carried out ({r.label})", "no error", r.error, False)
            for r in outcome.recoveries
            if r.error
        ]
        return DrillScore(self.name, self.description, checks, bool(checks) and all(c.met for c in checks))


def drill_from_mapping(name: str, doc: Mapping[str, Any], path: Path | None = None) -> Drill:
    """Build a drill from a parsed drill file.

    Raises
    ------
    HarnessError
        Naming the file and what is missing, unknown or mistyped.
    """
    where = str(path or name)
    extra = sorted(set(doc) - {"drill", "incidents", "expect"})
    if extra:
        raise HarnessError(
            f"{where}: unknown section [{extra[0]}] (a drill has [drill], [[incidents]], [expect])"
        )
    head = doc.get("drill")
    if not isinstance(head, Mapping):
        raise HarnessError(f"{where}: a [drill] table with at least a profile is required")
    known = {
        "description",
        "profile",
        "load",
        "scenario",
        "broker",
        "broker_settings",
        "security",
        "netns",
        "simulator",
        "pipeline",
        "run",
    }
    unknown = sorted(set(head) - known)
    if unknown:
        raise HarnessError(
            f"{where}: [drill] has no setting {unknown[0]!r} (it takes {', '.join(sorted(known))})"
        )
    if "profile" not in head:
        raise HarnessError(f"{where}: [drill] needs a profile (a profile name of the scenario file)")
    incidents = tuple(
        incident_from_mapping(item, where=f"{where}: incidents[{i}]")
        for i, item in enumerate(doc.get("incidents", []))
    )
    scenario = head.get("scenario")
    if scenario is not None and path is not None:
        scenario = (path.parent / scenario).resolve()
    return Drill(
        name=name,
        description=str(head.get("description", "")),
        profile=str(head["profile"]),
        load=str(head.get("load", "1x")),
        scenario=Path(scenario) if scenario is not None else None,
        broker=str(head.get("broker", "kafka")),
        broker_settings=_broker_settings(head.get("broker_settings", {}), where),
        security=str(head.get("security", "plaintext")),
        netns=_boolean(head.get("netns", False), f"{where}: netns"),
        simulator=dict(head.get("simulator", {})),
        pipeline=dict(head.get("pipeline", {})),
        run=dict(head.get("run", {})),
        incidents=incidents,
        expect=dict(doc.get("expect", {})),
        path=path,
    )


def _boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise HarnessError(f"{where} must be true or false, got {value!r}")
    return value


def _broker_settings(table: Any, where: str) -> dict[str, str]:
    """``broker_settings`` as Kafka reads them (``true``/``false``, numbers as written)."""
    if not isinstance(table, Mapping):
        raise HarnessError(
            f"{where}: broker_settings must be a table of server.properties settings, "
            f'e.g. {{ "min.insync.replicas" = 1 }}, got {table!r}'
        )
    out = {}
    for key, value in table.items():
        if isinstance(value, bool):
            out[str(key)] = str(value).lower()
        elif isinstance(value, str | int | float):
            out[str(key)] = str(value)
        else:
            raise HarnessError(
                f"{where}: broker_settings.{key} must be a string, number or boolean, got {value!r}"
            )
    return out


def shipped() -> dict[str, Path]:
    """The drills that come with sotw, by name."""
    folder = Path(str(resources.files("loadtest.gameday").joinpath("drills")))
    return {p.stem: p for p in sorted(folder.glob("*.toml"))}


def load_drill(name_or_path: str) -> Drill:
    """A shipped drill by name, or a drill file by path.

    Raises
    ------
    HarnessError
        If there is no such drill or the file cannot be read.
    """
    path = Path(name_or_path)
    if not path.suffix:
        found = shipped().get(name_or_path)
        if found is None:
            raise HarnessError(
                f"no shipped drill {name_or_path!r} (`sotw drill --list` shows them; or give a drill file's path)"
            )
        path = found
    doc = read_toml(path, "drill", HarnessError)
    return drill_from_mapping(path.stem, doc, path)


def scorecard_text(score: DrillScore) -> str:
    """The scorecard as a terminal table: each expectation, what it needs, what was measured, met or not."""
    checks = score.checks
    rows = [("", "expectation", "needs", "measured")] + [
        ("ok" if c.met else "FAIL", c.name, c.expected, c.measured) for c in checks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"drill {score.name}: {score.description}"]
    lines += [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    met = sum(c.met for c in checks)
    lines.append(
        f"  {met} of {len(checks)} expectations met: {'PASS' if met == len(checks) and checks else 'FAIL'}"
    )
    return "\n".join(lines)
