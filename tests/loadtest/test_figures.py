"""A run's figures from hand-built samples, ledger and output: each stated once, over the phase it names."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from loadtest.correctness.policies import Policy
from loadtest.correctness.verify import verify_run
from loadtest.measure.figures import Outcome, results
from loadtest.reports.display import key_numbers
from loadtest.reports.results import Phase
from loadtest.run.profile import load_profile
from simulator import FaultConfig
from tests.loadtest.builders import T0, Output, SessionSpec, ledger_rows, write_run

# One session whose messages are meant every 100 ms from T0 (seq s at T0 + 100 s). The steady phase starts
# at T0 + 300 ms: seqs 0-2 belong to the warm-up, when the pipeline's first batch took 5 s to commit.
CLEAN = [(s, "none") for s in range(7)]
WARMUP = Phase("warmup", T0 - 1000, T0 + 300)
STEADY = Phase("steady", T0 + 300, T0 + 700)
DRAIN = Phase("drain", T0 + 700, T0 + 2000)


def sample(ts_ms: int, phase: str, **readings: float) -> dict[str, Any]:
    return {"t": (ts_ms - WARMUP.start_ms) / 1000, "ts": ts_ms / 1000, "phase": phase, **readings}


def outcome(tmp_path: Path) -> Outcome:
    spec = SessionSpec()
    out = (
        Output(batches={0: T0 + 5000, 1: T0 + 1000})
        .apply(spec, 0, 1, 2)
        .apply(spec, 3, 4, 5, batch=1)
        .session(spec, "ok", batch=1)
    )
    run_dir = tmp_path / "run"
    write_run(run_dir, ledger_rows(spec, CLEAN), [spec])
    out.write(run_dir / "pipeline" / "output")
    samples = [
        # The warm-up's backlog: 9 s of lag and 5,000 offsets, the highest of the run.
        sample(
            T0 - 500, "warmup", lag_age_s=9.0, lag_offsets=5000, sent=0, consumed=0, threads_cpu_s_process=1
        ),
        sample(T0 + 300, "steady", lag_age_s=1.0, lag_offsets=100, sent=1000, consumed=900),
        sample(T0 + 500, "steady", lag_age_s=2.0, lag_offsets=300, sent=1400, consumed=1300),
        sample(T0 + 700, "steady", lag_age_s=1.5, lag_offsets=200, sent=1800, consumed=1700),
        sample(T0 + 1500, "drain", lag_age_s=0.0, lag_offsets=0, sent=1800, consumed=1800),
    ]
    # The smoke profile without its faults, whose 0.4 s steady phase is all a verdict needs: this run's figures
    # are what these tests look at (the floor on what a verdict needs has tests of its own, below).
    smoke = load_profile("smoke")
    profile = dataclasses.replace(
        smoke,
        simulator=smoke.simulator.replace(faults=FaultConfig()),
        run=dataclasses.replace(smoke.run, min_steady_triggers=0),
    )
    correctness = verify_run(run_dir, run_dir / "pipeline" / "output", Policy("ordered"))
    return Outcome(
        profile=profile,
        load_factor=1.0,
        run_dir=run_dir,
        command="sotw run",
        bootstrap="-",
        started_ms=WARMUP.start_ms,
        phases=[WARMUP, STEADY, DRAIN],
        samples=samples,
        correctness=correctness,
        drain_s=0.8,
        pipeline_failed=None,
        interrupted=False,
    )


def test_latency_percentiles_cover_only_the_messages_meant_for_the_steady_phase(tmp_path: Path) -> None:
    result = results(outcome(tmp_path))

    e2e = next(lat for lat in result.latency if lat.name == "end_to_end")
    # Seqs 3, 4 and 5 were meant at T0 + 300, 400, 500 and committed at T0 + 1000; the warm-up's 5 s are out.
    assert (e2e.scope, e2e.count, e2e.min, e2e.max, e2e.p99) == ("steady", 3, 500.0, 700.0, 700.0)
    lateness = next(lat for lat in result.latency if lat.name == "schedule_lateness")
    assert lateness.count == 4 and lateness.p99 == 1.0  # seqs 3-6 (the end too), each sent 1 ms late
    assert result.figure("end_to_end_p99") == 700.0


def test_rates_and_lag_figures_come_from_the_steady_samples_only(tmp_path: Path) -> None:
    result = results(outcome(tmp_path))

    assert result.figure("produced_rate") == pytest.approx(2000.0)  # 800 messages in 0.4 s
    assert result.figure("consumed_rate") == pytest.approx(2000.0)
    assert result.figure("lag_age_max") == 2.0  # not the warm-up's 9 s
    assert result.figure("lag_offsets_max") == 300.0
    assert result.figure("drain_time", "drain") == 0.8
    assert result.verdict.verdict == "PASS", result.verdict.reasons


def test_a_locust_runs_relayed_counters_are_timed_by_when_they_were_read(tmp_path: Path) -> None:
    # A Locust run's simulator counters reach the harness a report late, and by a different delay at either end
    # of the phase: the last sample still shows the reading of 0.2 s earlier.
    base = outcome(tmp_path)
    samples = [dict(s) for s in base.samples]
    for s, (sent, read_ms) in zip(
        samples[1:4], [(1000, T0 + 300), (1400, T0 + 500), (1400, T0 + 500)], strict=True
    ):
        s["sent"], s["counters_ts"] = sent, read_ms / 1000
    result = results(dataclasses.replace(base, samples=samples))

    assert result.figure("produced_rate") == pytest.approx(
        2000.0
    )  # 400 messages in the 0.2 s between readings
    assert result.figure("consumed_rate") == pytest.approx(
        2000.0
    )  # read by the harness itself: its own clock


def test_the_key_numbers_name_each_figure_once_with_its_phase(tmp_path: Path) -> None:
    rows = key_numbers(results(outcome(tmp_path)))

    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names))
    assert ("lag: age of the oldest unprocessed message, max", "steady", "2 s") in rows
    assert ("end-to-end latency p99", "steady", "700 ms") in rows
    assert ("drain time", "drain", "0.8 s") in rows


def test_an_end_to_end_bound_fails_the_run_naming_the_steady_p99(tmp_path: Path) -> None:
    import dataclasses

    base = outcome(tmp_path)
    strict = dataclasses.replace(base.profile.run, max_end_to_end_p99_s=0.5)
    result = results(dataclasses.replace(base, profile=dataclasses.replace(base.profile, run=strict)))

    assert result.verdict.verdict == "FAIL"
    assert result.verdict.reasons == [
        "end-to-end latency p99 of the messages meant for the steady phase 0.7 s > 0.5 s"
    ]


# ------------------------------------------------------------------------- what a verdict needs judged


def with_run(base: Outcome, **settings: Any) -> Outcome:
    return dataclasses.replace(
        base, profile=dataclasses.replace(base.profile, run=dataclasses.replace(base.profile.run, **settings))
    )


def test_a_steady_phase_shorter_than_the_stated_triggers_is_inconclusive(tmp_path: Path) -> None:
    result = results(with_run(outcome(tmp_path), min_steady_triggers=10))
    assert result.verdict.verdict == "INCONCLUSIVE"
    (reason,) = result.verdict.reasons
    assert "steady phase lasted 0 triggers, fewer than the 10" in reason


def test_a_fault_kind_the_profile_injects_that_never_reached_the_broker_is_inconclusive(
    tmp_path: Path,
) -> None:
    base = outcome(tmp_path)
    faulty = dataclasses.replace(
        base.profile, simulator=base.profile.simulator.replace(faults=FaultConfig(malformed=0.01))
    )
    result = results(dataclasses.replace(base, profile=faulty))
    assert result.verdict.verdict == "INCONCLUSIVE"
    assert result.verdict.reasons == [
        "the profile injects malformed faults (rate 0.01) but none reached the broker: how the job meets them "
        "was not seen; lengthen the run or raise the rate"
    ]


def test_too_few_sessions_judged_is_inconclusive_and_the_floor_is_a_setting(tmp_path: Path) -> None:
    base = outcome(tmp_path)
    unjudged = dataclasses.replace(base.correctness, sessions_judged=0)
    result = results(dataclasses.replace(base, correctness=unjudged))
    assert result.verdict.verdict == "INCONCLUSIVE"
    assert result.verdict.reasons[0].startswith("0 of 1 sessions judged (0%), under the 90%")
    assert results(with_run(dataclasses.replace(base, correctness=unjudged), min_judged=0)).verdict.passed


def test_a_failure_is_a_fail_whatever_was_judged(tmp_path: Path) -> None:
    base = with_run(outcome(tmp_path), min_steady_triggers=10, max_end_to_end_p99_s=0.5)
    assert results(base).verdict.verdict == "FAIL"
