"""A run's verdict from its figures and its correctness: PASS, FAIL with every reason, or INCONCLUSIVE.

``verdict`` applies the profile's bounds (lag, end-to-end latency, drain, the rate delivered) and the
verifier's result; ``inconclusive`` says why a run that failed nothing judged too little to pass
(docs/loadtest.md, "Verdict").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from loadtest.reports.results import FAIL, INCONCLUSIVE, PASS, Figure, Verdict
from loadtest.run.phases import STEADY
from loadtest.run.profile import Profile
from simulator.config import FAULT_RATES

if TYPE_CHECKING:
    from loadtest.measure.figures import Outcome


def consumed_nothing(samples: list[dict[str, Any]]) -> str | None:
    """Why the job read nothing, if its position never moved while the broker took messages; else None.

    Missing rows then are not the job's bugs: it never read the run's topics, most often because its
    subscription does not match them.
    """
    acked = max((float(s.get("acked", 0) or 0) for s in samples), default=0.0)
    read = [float(s["consumed"]) for s in samples if s.get("consumed") is not None]
    if acked <= 0 or not read or max(read) > 0:
        return None
    return (
        f"the job consumed nothing while the broker took {acked:,.0f} messages: its position on the run's "
        "topics never moved. Check its subscription: {pattern} is a regex that starts with ^ (librdkafka "
        "reads a topic name without ^ literally), {prefix} the topics' common prefix"
    )


def verdict(outcome: Outcome, summary: list[Figure]) -> Verdict:
    """PASS only if the pipeline kept up, the load was delivered, the output is correct and enough was judged.

    Any failure is a FAIL; a run with none that judged too little (``inconclusive``) is INCONCLUSIVE.
    """
    run = outcome.profile.run
    value = {f.name: f.value for f in summary if f.scope == STEADY}
    reasons: list[str] = []
    if outcome.interrupted:
        reasons.append("the run was interrupted (Ctrl-C); results are partial")
    if outcome.pipeline_failed and not outcome.correctness.must_stop:
        reasons.append(outcome.pipeline_failed)
    idle = consumed_nothing(outcome.samples) if not outcome.correctness.rows_written else None
    if idle:
        reasons.append(idle)
    if outcome.drain_s is None and not outcome.interrupted and outcome.pipeline_failed is None:
        reasons.append(f"the pipeline did not catch up within {run.drain_max_s:g} s after the load stopped")
    # With incidents the steady phase holds their lag on purpose: a drill's scorecard judges how the pipeline
    # recovered, so the calm-day bounds are not applied.
    incidents = any(r.start_ms for r in outcome.incidents)
    lag_p95 = math.nan if incidents else value.get("lag_age_p95", math.nan)
    if lag_p95 > run.max_lag_s:
        reasons.append(
            f"lag during the steady phase: p95 age of the oldest unprocessed message "
            f"{lag_p95:.1f} s > {run.max_lag_s:g} s"
        )
    e2e_p99 = math.nan if incidents else value.get("end_to_end_p99", math.nan) / 1000.0
    if run.max_end_to_end_p99_s is not None and e2e_p99 > run.max_end_to_end_p99_s:
        reasons.append(
            f"end-to-end latency p99 of the messages meant for the steady phase {e2e_p99:.1f} s > "
            f"{run.max_end_to_end_p99_s:g} s"
        )
    produced = value.get("produced_rate", math.nan)
    if (
        produced < 0.9 * outcome.target_rate
        and not outcome.interrupted
        and outcome.correctness.policy_stop is None
    ):
        reasons.append(
            f"the simulator produced {produced:,.0f} msg/s, under 90% of the "
            f"{outcome.target_rate:,.0f} msg/s asked for: the load generator or broker is the bottleneck"
        )
    if not outcome.correctness.passed:
        reasons += [f"correctness: {r}" for r in outcome.correctness.reasons] or ["correctness checks failed"]
    if reasons:
        return Verdict(FAIL, reasons)
    unsure = inconclusive(outcome)
    return Verdict(INCONCLUSIVE, unsure) if unsure else Verdict(PASS)


def injected_kinds(profile: Profile) -> dict[str, float]:
    """The fault kinds the profile injects anywhere, by the ledger's name, with the highest rate it gives each.

    Anywhere: its faults, a sensor's own, a schedule window's.
    """
    configs = [
        profile.simulator.faults,
        *profile.simulator.sensor_faults.values(),
        *(w.faults for w in profile.schedule),
    ]
    kinds: dict[str, float] = {}
    for config in configs:
        for kind, field_name in FAULT_RATES.items():
            rate = float(getattr(config, field_name))
            if rate > 0:
                kinds[kind] = max(rate, kinds.get(kind, 0.0))
    return kinds


def steady_triggers(outcome: Outcome) -> float:
    """How many of the pipeline's triggers the steady phase lasted (0 if it never began)."""
    steady = outcome.steady
    if steady is None or not steady.end_ms:
        return 0.0
    trigger_ms = outcome.profile.pipeline.trigger_ms or 1000
    return (steady.end_ms - steady.start_ms) / trigger_ms


def inconclusive(outcome: Outcome) -> list[str]:
    """Why a run that failed nothing judged too little to pass; empty if it judged enough.

    - fewer than ``run.min_judged`` of the sessions were judged (``Correctness.sessions_judged``);
    - a fault kind the profile injects never reached the broker, so how the job meets it was not seen;
    - the steady phase lasted fewer than ``run.min_steady_triggers`` triggers.

    A run a strict job ended on purpose (its stop verified, ``Correctness.policy_stop``) is judged by that
    stop: what came after it was never the job's to judge, so none of these applies.
    """
    run, c = outcome.profile.run, outcome.correctness
    if c.policy_stop is not None:
        return []
    reasons = []
    share = c.sessions_judged / c.sessions_expected if c.sessions_expected else 0.0
    if share < run.min_judged:
        reasons.append(
            f"{c.sessions_judged:,} of {c.sessions_expected:,} sessions judged ({share:.0%}), under the "
            f"{run.min_judged:.0%} a verdict needs (run.min_judged, --min-judged): the rest could be absent or "
            "were not checked; lengthen the run (run.drain_max_s, run.steady_s) so sessions close"
        )
    delivered = c.faults_delivered
    for kind, rate in sorted(injected_kinds(outcome.profile).items()):
        if delivered and delivered.get(kind, 0) == 0:
            reasons.append(
                f"the profile injects {kind} faults (rate {rate:g}) but none reached the broker: how the job "
                "meets them was not seen; lengthen the run or raise the rate"
            )
    triggers = steady_triggers(outcome)
    if triggers < run.min_steady_triggers:
        reasons.append(
            f"the steady phase lasted {triggers:.0f} triggers, fewer than the {run.min_steady_triggers} a "
            "verdict needs (run.min_steady_triggers): lengthen run.steady_s"
        )
    return reasons
