"""A realistic ``Results`` for the schema and report tests: 60 s of samples with warm-up, steady and drain."""

from __future__ import annotations

import numpy as np

from loadtest.reports.results import (
    Capacity,
    CapacityStep,
    Correctness,
    DamageWindow,
    Discrepancy,
    FaultScore,
    Figure,
    LatencySummary,
    Phase,
    ResourceUsage,
    Results,
    RunInfo,
    Series,
    Triage,
    Verdict,
)

START = 1_790_000_000_000


def sample_results(factor: float = 1.0, passed: bool = True, seed: int = 1) -> Results:
    rng = np.random.default_rng(seed)
    t = [float(i) for i in range(60)]
    rate = 2000.0 * factor
    produced = [rate if 5 <= i < 45 else (rate * i / 5 if i < 5 else 0.0) for i in range(60)]
    written = [max(0.0, p * (0.97 + 0.03 * rng.random())) for p in produced]
    lag = [
        float(rng.integers(50, 400)) * factor if i < 45 else max(0.0, 4000 - 400 * (i - 45))
        for i in range(60)
    ]
    lat = [float(200 + 60 * factor + rng.normal(0, 20)) for _ in t]
    cpu = {"broker": 40.0, "pipeline": 120.0 * min(factor, 1.6), "simulator": 30.0 * factor**0.5}
    resource_series = [
        Series(f"cpu {c}", "%", t, [v + float(rng.normal(0, 5)) for _ in t], c) for c, v in cpu.items()
    ]
    resource_series += [
        Series(f"rss {c}", "MB", t, [m + i * 0.5 for i in range(60)], c)
        for c, m in (("broker", 90.0), ("pipeline", 900.0), ("simulator", 120.0))
    ]
    discrepancies = (
        []
        if passed
        else [
            Discrepancy(
                "lost_row",
                "sess-0007-3",
                "no change row for seq 41 (expected 1x)",
                sensor="0007",
                seq=41,
                topic="sotw-sensor-0007",
                triage=Triage("pipeline", True, True, True, "in Kafka at sotw-sensor-0007[0]@812"),
            )
        ]
    )
    correctness = Correctness(
        policy="ordered",
        passed=passed,
        sessions_expected=120,
        sessions_exact_required=101,
        sessions_exact=101,
        exact_match_rate=1.0,
        rows_expected=84_000,
        rows_written=84_000 - (0 if passed else 1),
        rows_lost=0 if passed else 1,
        rows_repeated=0,
        rows_unexpected=0,
        malformed_sent=12,
        malformed_quarantined=12,
        statuses={"ok": 101, "degraded": 15, "timed_out": 4},
        faults=[
            FaultScore("gap", "gap", 17, 19, 19, 19, 1.0, 1.0),
            FaultScore("reorder", "delayed", 30, 8, 8, 8, 1.0, 1.0),
            FaultScore("duplicate", "duplicate", 25, 25, 25, 25, 1.0, 1.0),
        ],
        damage=[DamageWindow("sess-0003-1", "0003", 120, 120, 410)],
        discrepancies=discrepancies,
        discrepancy_counts={"lost_row": 1} if not passed else {},
        blame={"pipeline": 1} if not passed else {},
        reasons=[] if passed else ["1 lost row"],
    )
    return Results(
        run=RunInfo(
            run_id=f"run-{factor:g}x",
            started_ms=START,
            ended_ms=START + 60_000,
            load_factor=factor,
            policy="ordered",
            profile_name="default",
            profile={"sensors": 24, "rows": 200, "rate": 2000, "gap_rate": 0.001},
        ),
        verdict=Verdict("PASS" if passed else "FAIL", [] if passed else ["correctness: 1 lost row"]),
        phases=[
            Phase("warmup", START, START + 5000),
            Phase("steady", START + 5000, START + 45_000),
            Phase("drain", START + 45_000, START + 60_000),
        ],
        throughput=[Series("produced", "msg/s", t, produced), Series("written", "msg/s", t, written)],
        lag=[
            Series("lag_offsets", "offsets", t, lag),
            Series("lag_age", "s", t, [v / (1000.0 * factor) for v in lag]),
        ],
        latency_series=[Series("end-to-end p99", "ms", t, lat)],
        latency=[
            LatencySummary(
                "end_to_end",
                84_000,
                180.0 * factor,
                240.0 * factor,
                410.0 * factor,
                650.0 * factor,
                1200.0 * factor,
                20.0,
                200.0 * factor,
            ),
            LatencySummary("publish", 84_000, 2.1, 3.5, 8.0, 15.0, 40.0, 0.5, 2.5),
        ],
        resources=[ResourceUsage(c, v, v * 1.3, 100.0, 130.0) for c, v in cpu.items()],
        resource_series=resource_series,
        summary=[
            Figure("target_rate", "steady", rate, "msg/s"),
            Figure("produced_rate", "steady", rate, "msg/s"),
            Figure("lag_age_p95", "steady", 0.3, "s"),
            Figure("lag_age_max", "steady", 0.4, "s"),
            Figure("end_to_end_p99", "steady", 410.0 * factor, "ms"),
            Figure("drain_time", "drain", 9.5, "s"),
        ],
        correctness=correctness,
        capacity=Capacity(
            steps=[CapacityStep(f, 2000 * f, 2000 * min(f, 6.5), f <= 6.0) for f in (1, 2, 4, 6, 8)],
            max_sustained_factor=6.0,
            max_sustained_rate=12_000.0,
            baseline_rate=2000.0,
            headroom=6.0,
            time_breakdown_ms={"broker": 120.0, "spark batch": 800.0, "stateful step": 450.0},
        ),
        harness_overhead={
            "steady_s": 40.0,
            "simulator_cpu_percent": 3.1,
            "sampler_cpu_percent": 1.2,
            "harness_cpu_percent": 1.3,
            "verifier_cpu_s": 2.5,
        },
    )
