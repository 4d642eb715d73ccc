"""``sotw plan``: the batch-cost fit, the steady-state model, and the plan it answers with."""

from __future__ import annotations

import dataclasses
import math

import pytest

from loadtest.errors import HarnessError
from loadtest.planning import plan
from loadtest.planning.costs import BatchCost, Measurements, fit
from loadtest.planning.plan import Fleet, cores_for, max_rate, steady
from loadtest.reports.results import Capacity
from tests.loadtest.sample_results import sample_results


def cost(setup: str, cores: int, fixed: float, per_message_us: float) -> BatchCost:
    return BatchCost(setup, f"{setup}-master", cores, fixed, 0.05, per_message_us / 1e6, per_message_us / 1e8)


def measurements() -> Measurements:
    return Measurements(
        taken_utc="2026-11-25T09:00:00Z",
        machine={"cpus": 2},
        command="sotw plan measure",
        backlog={"messages": 60000.0, "sensors": 24.0, "rows": 200.0, "partitions": 1.0},
        costs=[
            cost("local-1", 1, 0.8, 200.0),
            cost("local-2", 2, 0.8, 125.0),
            cost("standalone-1", 1, 1.0, 220.0),
            cost("standalone-2", 2, 1.0, 130.0),
        ],  # fmt: skip
        partition_rate=6000.0,
        broker_produce_us=3.0,
        broker_consume_us=2.0,
        state_bytes_per_session=1400.0,
    )


def test_the_fit_recovers_a_fixed_cost_and_a_cost_per_message_from_batches_of_two_sizes():
    points = [
        (3000, 0.8 + 3000 * 2e-4),
        (3000, 0.81 + 3000 * 2e-4),
        (20000, 0.8 + 20000 * 2e-4),
        (20000, 4.79),
    ]
    fixed, fixed_se, per_message, per_message_se = fit(points)
    assert fixed == pytest.approx(0.8, abs=0.02) and per_message == pytest.approx(2e-4, rel=0.01)
    assert fixed_se < 0.05 and per_message_se < 1e-5
    with pytest.raises(HarnessError, match="two sizes"):
        fit([(3000, 1.0), (3000, 1.1), (3000, 1.0)])


def test_a_query_that_keeps_up_batches_at_its_trigger_and_one_near_its_limit_batches_slower():
    calm = steady(fixed_s=0.5, per_message_s=1e-4, rate=1000, trigger_s=1.0)
    assert calm.interval_s == 1.0 and calm.batch_s == pytest.approx(0.6) and calm.p99_s == pytest.approx(1.6)
    busy = steady(fixed_s=0.5, per_message_s=1e-4, rate=8000, trigger_s=1.0)
    assert busy.interval_s == pytest.approx(2.5) and busy.p99_s == pytest.approx(5.0)
    assert not steady(0.5, 1e-4, 10_000, 1.0).sustainable


def test_more_rate_or_a_tighter_target_needs_more_cores_and_the_range_brackets_the_answer():
    meas = measurements()
    few = cores_for(meas, 5_000, 10.0, 1.0, "standalone", 0.0)
    many = cores_for(meas, 50_000, 10.0, 1.0, "standalone", 0.0)
    tight = cores_for(meas, 50_000, 3.0, 1.0, "standalone", 0.0)
    assert few is not None and many is not None and tight is not None
    assert few < many <= tight
    answer = plan.plan(meas, Fleet(sensors=2000, rate=50_000, p99_s=10.0))
    low, high = answer["executor_cores_range"]
    assert low <= answer["executor_cores"] <= high
    assert answer["kafka_partitions"] >= max(answer["executor_cores"], math.ceil(2 * 50_000 / 6000))
    assert answer["brokers"] >= 3
    assert answer["predicted"]["p99_s"] <= 10.0


def test_the_model_predicts_the_rate_it_was_measured_at_and_a_p99_below_the_trigger_is_refused():
    meas = measurements()
    rate = max_rate(meas, 2, 10.0, 1.0, "local", 0.0)
    assert steady(0.8, 125e-6, rate, 1.0).p99_s == pytest.approx(10.0, rel=0.01)
    with pytest.raises(HarnessError, match="cannot be met with a 1 s trigger"):
        Fleet(sensors=10, rate=100, p99_s=0.5)


def test_the_plan_states_its_measurements_and_assumptions_and_checks_itself_against_a_capacity_run(
    tmp_path, capsys
):
    meas_path = tmp_path / "measurements.json"
    meas = measurements()
    meas.to_json(meas_path)
    assert Measurements.from_json(meas_path) == meas
    predicted = max_rate(meas, 2, 20.0, 1.0, "local", 0.0)
    measured = sample_results()
    found = Capacity(
        max_sustained_factor=predicted * 0.9 / 2000,
        max_sustained_rate=predicted * 0.9,
        lowest_broken_factor=predicted * 1.1 / 2000,
        baseline_rate=2000.0,
        targets={"max_lag_s": 15.0, "max_end_to_end_p99_s": 20.0},
    )
    measured = dataclasses.replace(measured, capacity=found)
    measured.to_json(tmp_path / "capacity.json")

    code = plan.main(["--sensors", "500", "--rate", "20000", "--p99", "20", "--measurements", str(meas_path),
                      "--check", str(tmp_path / "capacity.json"), "--out", str(tmp_path / "plan.md")])  # fmt: skip

    out = capsys.readouterr().out
    assert code == 0, out
    assert "executor cores: **" in out and "## Assumptions" in out and "standalone-2" in out
    assert "WITHIN the stated uncertainty" in out
    assert (tmp_path / "plan.md").read_text() == out.rstrip("\n") + "\n" or (tmp_path / "plan.md").is_file()
