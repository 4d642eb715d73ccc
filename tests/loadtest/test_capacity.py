"""``sotw capacity``: the rate controller's moves, the capacity it states, and one real search on the smoke profile."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from loadtest import cli
from loadtest.errors import HarnessError
from loadtest.measure.figures import LATENCY_FILE
from loadtest.planning.capacity import Controller, Level, SearchSettings, Targets, capacity_of, judge_levels
from loadtest.reports.results import CapacityStep, Results
from loadtest.run.profile import default_scenario, load_profile


def controller(tmp_path, **settings) -> Controller:
    return Controller(tmp_path / "samples.jsonl", Targets(8.0, 10.0), SearchSettings(**settings))


def test_the_controller_doubles_while_sustained_then_bisects_and_stops_within_the_tolerance(tmp_path):
    c = controller(tmp_path, start=1.0, max_factor=64.0, tolerance=0.2)
    assert c.next_factor(1.0, True) == 2.0
    assert c.next_factor(2.0, True) == 4.0
    assert c.next_factor(4.0, False) == 3.0
    assert c.next_factor(3.0, True) == 3.5
    assert c.next_factor(3.5, False) is None, "3x sustained and 3.5x broken are within 20 %"
    assert (c.low, c.high) == (3.0, 3.5)


def test_the_controller_halves_from_a_first_level_that_breaks_and_gives_up_below_the_minimum(tmp_path):
    c = controller(tmp_path, start=1.0, min_factor=0.25)
    assert c.next_factor(1.0, False) == 0.5
    assert c.next_factor(0.5, False) == 0.25
    assert c.next_factor(0.25, False) is None
    assert c.low == 0.0


def test_a_level_is_judged_on_lag_and_on_the_latency_its_lag_and_batch_time_imply(tmp_path):
    c = controller(tmp_path)
    calm = [{"lag_age_s": 2.0, "batch_duration_ms": 1500} for _ in range(10)]
    slow_batches = [{"lag_age_s": 6.0, "batch_duration_ms": 6000} for _ in range(10)]
    assert c.judge(calm)[0] is True
    assert c.judge(slow_batches)[0] is False, "6 s of lag and 6 s batches mean 12 s end to end"


def test_each_level_is_judged_again_on_the_latencies_the_run_measured_whatever_its_output(tmp_path):
    # The run leaves every dated message's latency in its directory (a topic's output is gone with its broker,
    # a team's job writes elsewhere): 2 s at the first level, 30 s at the second, none at the third.
    pd.DataFrame(
        {
            "intended_ts": [1_000.0 * t for t in (12, 15, 18, 32, 35, 38)],
            "committed_ms": [1_000.0 * t for t in (14, 17, 20, 62, 65, 68)],
            "latency_ms": [2_000.0] * 3 + [30_000.0] * 3,
        }
    ).to_parquet(tmp_path / LATENCY_FILE)
    samples = [{"ts": float(t), "lag_age_s": 1.0, "consumed": 100.0 * t} for t in range(10, 60)]
    levels = [Level(1.0, 10.0, 20.0), Level(2.0, 30.0, 40.0), Level(4.0, 50.0, 59.0)]

    steps = judge_levels(tmp_path, samples, levels, Targets(8.0, 10.0), 1.0, 300.0)

    assert [(s.load_factor, s.sustained, s.latency_p99_ms) for s in steps[:2]] == [
        (1.0, True, 2000.0),
        (2.0, False, 30000.0),
    ]
    assert steps[2].sustained is False and math.isnan(steps[2].latency_p99_ms), (
        "no latency measured: not sustained"
    )


def test_a_level_the_job_reads_only_part_of_is_not_sustained_though_its_lag_is_still_within_the_bound(
    tmp_path,
):
    # Kafka Streams at 16x: 32,000 msg/s sent, 65 % of it read, a lag age of 8 s after a 20 s hold, under a 15 s
    # bound. A micro-batch job's commits come in steps (every 5 s here); between two steps it reads nothing.
    def hold(read_share: float, every_s: int = 1) -> list[dict]:
        return [
            {
                "ts": float(t),
                "lag_age_s": 4.0 + 0.2 * t,
                "batch_duration_ms": 100,
                "sent": 32_000.0 * t,
                "consumed": 32_000.0 * read_share * (t - t % every_s),
            }
            for t in range(20)
        ]

    c = controller(tmp_path)
    assert c.judge(hold(1.0))[0] is True
    assert c.judge(hold(1.0, every_s=5))[0] is True, "a step read at each commit"
    assert c.judge(hold(0.65))[0] is False, "the backlog grows by 11,000 messages a second"
    pd.DataFrame({"intended_ts": [5_000.0], "committed_ms": [6_000.0], "latency_ms": [1_000.0]}).to_parquet(
        tmp_path / LATENCY_FILE
    )
    (kept, fell) = (
        judge_levels(tmp_path, hold(share), [Level(16.0, 0.0, 19.0)], Targets(15.0, 20.0), 1.0, 2_000.0)[0]
        for share in (1.0, 0.65)
    )
    assert (kept.sustained, fell.sustained) == (True, False)
    assert fell.achieved_rate == pytest.approx(20_800.0)


def test_the_capacity_is_the_highest_sustained_level_below_the_lowest_broken_with_that_bracket():
    steps = [
        CapacityStep(1.0, 300, 300, True),
        CapacityStep(2.0, 600, 600, True),
        CapacityStep(4.0, 1200, 700, False),
        CapacityStep(3.0, 900, 900, True),
        CapacityStep(5.0, 1500, 1500, True),  # above a broken level: noise, not capacity
    ]
    found = capacity_of(steps, 300.0, Targets(8.0, 10.0), "search", {})
    assert found.max_sustained_factor == 3.0 and found.max_sustained_rate == 900.0
    assert found.lowest_broken_factor == 4.0
    assert "between 3x and 4x" in found.confidence


def test_nothing_sustained_states_no_rate():
    found = capacity_of([CapacityStep(1.0, 300, 100, False)], 300.0, Targets(8.0, 10.0), "search", {})
    assert math.isnan(found.max_sustained_factor) and "lowest level" in found.confidence


def test_search_settings_refuse_a_start_outside_the_range():
    with pytest.raises(HarnessError, match="--min <= --start <= --max"):
        SearchSettings(start=0.1, min_factor=0.5)


@pytest.mark.slow
def test_one_run_finds_the_smoke_profiles_sustainable_rate_and_states_it(tmp_path, kafka, capsys):
    root = tmp_path / "capacity"
    code = cli.main(
        ["capacity", "--profile", "smoke", "--bootstrap", kafka.bootstrap, "--run-dir", str(root), "-q",
         "--start", "1x", "--max", "4x", "--hold", "8", "--budget", "40", "--p99", "30"]
    )  # fmt: skip

    saved = Results.from_json(root / "results.json")
    cap = saved.capacity
    assert cap is not None and cap.method == "search"
    assert code == 0, capsys.readouterr().out
    assert len(cap.steps) >= 2 and cap.steps[0].load_factor == 1.0
    assert cap.max_sustained_factor >= 1.0 and cap.max_sustained_rate == 300.0 * cap.max_sustained_factor
    assert all(math.isfinite(s.latency_p99_ms) for s in cap.steps if s.sustained)
    assert saved.correctness is not None and saved.correctness.passed
    assert "capacity:" in capsys.readouterr().out
    assert (root / "report.html").is_file()


@pytest.mark.slow
def test_capacity_exits_non_zero_when_not_even_the_lowest_level_is_sustained(tmp_path, kafka):
    # A pipeline whose every micro-batch waits 4 s cannot keep end-to-end p99 under 2 s at any rate.
    scenario = tmp_path / "slow.toml"
    text = default_scenario().read_text()
    scenario.write_text(
        text.replace(
            "[profiles.smoke.pipeline]\n", '[profiles.smoke.pipeline]\nextra_args = ["--batch-delay", "4"]\n'
        )
    )
    assert load_profile("smoke", scenario).pipeline.extra_args == ("--batch-delay", "4")
    code = cli.main(
        ["capacity", "--profile", "smoke", "--scenario", str(scenario), "--bootstrap", kafka.bootstrap,
         "--run-dir", str(tmp_path / "run"), "-q", "--start", "1x", "--min", "0.5x", "--hold", "8", "--budget", "30",
         "--p99", "2"]
    )  # fmt: skip

    assert code == 1
    data = json.loads((tmp_path / "run" / "results.json").read_text())
    assert data["capacity"]["max_sustained_factor"] is None
    assert all(not s["sustained"] for s in data["capacity"]["steps"])
