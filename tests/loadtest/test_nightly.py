"""The nightly benchmark: history entries, the regression check, the trend page, ``sotw compare`` and the workflow."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from loadtest.errors import HarnessError
from loadtest.regressions import nightly
from loadtest.regressions.config import NightlyConfig
from loadtest.regressions.history import Entry, Metric, baseline_of, compare, load_history
from loadtest.regressions.paired import judge_pair
from loadtest.regressions.sidebyside import CANDIDATE, Side
from loadtest.regressions.sides import SideRuns
from loadtest.regressions.trend import write_trend
from loadtest.reports import compare as compare_cli
from sotw.processgroup import TIMED_OUT

REPO = Path(__file__).resolve().parents[2]
MACHINE = {"cpus": 2, "cpu_model": "test cpu", "memory_gb": 24, "platform_machine": "x86_64"}


def night(hour: int, ratio: list[float], lag: list[float] | None = None, **changes) -> Entry:
    metrics = [Metric("pipeline_vs_bare.ratio", "ratio", "higher", ratio)]
    if lag is not None:
        metrics.append(Metric("bench_1x.lag_age_p95", "lag", "lower", lag, "s"))
    base = {
        "night": "2026-11-25",
        "commit": f"{hour:02d}abcdef0123",
        "started_utc": f"2026-11-25T{hour:02d}:00:00Z",
        "machine": dict(MACHINE),
        "metrics": metrics,
    }
    return Entry(**(base | changes))


def test_a_night_within_the_noise_of_the_nights_before_is_not_flagged():
    history = [night(1, [0.10, 0.12, 0.11]), night(2, [0.12, 0.10, 0.11]), night(3, [0.09, 0.11, 0.10])]
    today = night(4, [0.095, 0.105, 0.09])
    comparison = compare(today, baseline_of(today, history, 7))
    assert [j.status for j in comparison.judgements] == ["ok"]


def test_a_drop_beyond_the_noise_is_a_regression_naming_metric_baseline_today_and_threshold():
    history = [night(1, [0.10, 0.12, 0.11]), night(2, [0.12, 0.10, 0.11])]
    today = night(3, [0.04, 0.045, 0.05])
    [bad] = compare(today, history).regressions
    assert bad.name == "pipeline_vs_bare.ratio"
    text = bad.sentence()
    assert (
        "pipeline_vs_bare.ratio fell to 0.045" in text and "baseline of 0.11" in text and "threshold" in text
    )
    assert bad.limit < bad.baseline and bad.today < bad.limit


def test_lag_regresses_upwards_and_a_small_absolute_change_is_not_a_regression():
    history = [
        night(1, [0.1, 0.1, 0.1], lag=[0.2, 0.25, 0.2]),
        night(2, [0.1, 0.1, 0.1], lag=[0.2, 0.2, 0.3]),
    ]
    tiny = compare(night(3, [0.1, 0.1, 0.1], lag=[0.9, 0.8, 0.9]), history)
    assert not tiny.regressions, "under a second of lag is within the absolute floor"
    big = compare(night(3, [0.1, 0.1, 0.1], lag=[9.0, 8.0, 9.5]), history)
    assert [j.name for j in big.regressions] == ["bench_1x.lag_age_p95"]


def test_planted_nights_and_other_machines_never_make_a_baseline():
    planted = night(2, [0.01, 0.01, 0.01], planted={"batch_delay_s": "4"})
    other = night(3, [0.5, 0.5, 0.5], machine=MACHINE | {"cpus": 64})
    today = night(4, [0.1, 0.1, 0.1])
    assert baseline_of(today, [night(1, [0.1, 0.1, 0.1]), planted, other], 7) == [night(1, [0.1, 0.1, 0.1])]


def test_a_metric_with_one_value_a_night_is_not_judged_until_three_nights_give_its_noise():
    def single(hour: int, value: float) -> Entry:
        return night(
            hour,
            [0.1, 0.1, 0.1],
            metrics=[Metric("pipeline_vs_bare.cold_rate", "throughput", "higher", [value])],
        )

    early = compare(single(3, 100.0), [single(1, 500.0), single(2, 480.0)])
    assert early.judgements[0].status == "unjudged"
    later = compare(single(5, 100.0), [single(1, 500.0), single(2, 480.0), single(4, 520.0)])
    assert later.judgements[0].status == "regression"


def test_entries_round_trip_and_a_file_of_another_version_is_refused(tmp_path):
    entry = night(1, [0.1, math.nan, 0.12])
    path = entry.write(tmp_path)
    assert path.name == "2026-11-25-01abcdef01.json"
    again = load_history(tmp_path)
    assert again[0].metrics[0].measured == [0.1, 0.12] and again[0].machine == MACHINE
    assert entry.write(tmp_path) != path, "a second entry of the same night and commit keeps the first"
    path.write_text(path.read_text().replace('"schema_version": 1', '"schema_version": 99'))
    with pytest.raises(HarnessError, match="schema_version 99"):
        load_history(tmp_path)


def test_the_trend_page_draws_one_chart_per_headline_metric_and_names_the_regression(tmp_path):
    def paired(hour: int, ratio: list[float], base: list[float]) -> Entry:
        judged = judge_pair("pipeline_vs_bare.ratio", "ratio", "higher", base, ratio)
        lag = Metric("bench_1x.lag_age_p95", "lag", "lower", [1.0, 1.0, 1.0], "s")
        return night(
            hour,
            ratio,
            metrics=[Metric("pipeline_vs_bare.ratio", "ratio", "higher", ratio), lag],
            baseline_metrics=[Metric("pipeline_vs_bare.ratio", "ratio", "higher", base)],
            paired=[judged],
            verdict="regression" if judged.status == "regression" else "pass",
        )

    history = [
        paired(1, [0.1, 0.11, 0.12], [0.11, 0.1, 0.12]),
        paired(2, [0.02, 0.022, 0.021], [0.1, 0.11, 0.1]),
    ]
    page = write_trend(history, tmp_path / "trend.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "FAIL" in page and "REGRESSION" in page and "pipeline_vs_bare.ratio x0.2" in page


# ------------------------------------------------------------------------------- side by side, pairs


def test_pairs_that_move_together_with_the_machine_are_not_a_regression():
    # Both sides slowed by the same neighbour, night after night: the rates swing 2x, the ratios do not.
    baseline = [1000.0, 520.0, 980.0, 610.0, 1010.0]
    candidate = [990.0, 530.0, 1000.0, 600.0, 980.0]
    judged = judge_pair("simulator_vs_bare.simulator_rate", "throughput", "higher", baseline, candidate)
    assert judged.status == "ok" and judged.low < 1.0 < judged.high


def test_a_quarter_slower_candidate_is_a_regression_named_with_its_ratio_and_bound():
    baseline = [1000.0, 520.0, 980.0]
    candidate = [760.0, 385.0, 740.0]
    judged = judge_pair(
        "simulator_vs_bare.simulator_rate", "throughput", "higher", baseline, candidate, "msg/s"
    )
    assert judged.status == "regression" and judged.high < 1 / 1.1
    text = judged.sentence()
    assert text.startswith("simulator_vs_bare.simulator_rate x0.75") and "3 pairs" in text and "msg/s" in text


def test_a_slower_time_is_a_regression_upwards_and_a_faster_one_an_improvement():
    slower = judge_pair("bench_1x.batch_duration", "time", "lower", [300, 320, 310], [600, 640, 615], "ms")
    faster = judge_pair("bench_1x.batch_duration", "time", "lower", [600, 640, 615], [300, 320, 310], "ms")
    assert (slower.status, faster.status) == ("regression", "improved")


def test_pairs_too_noisy_to_tell_are_reported_not_judged_with_the_reason():
    judged = judge_pair(
        "bench_10x.end_to_end_p99", "latency", "lower", [2000, 2100, 1900], [1500, 4000, 2300]
    )
    assert judged.status == "unjudged" and judged.reason.startswith("too noisy")
    one = judge_pair("drill.recover_s.kill", "recovery", "lower", [12.0], [30.0])
    assert one.status == "unjudged" and one.reason == "one pair: no bound"


def test_three_pairs_that_agree_on_a_wide_bound_are_not_a_regression():
    # Unchanged code, three pairs of runs that swing by a third, all three on the candidate's low side.
    baseline, candidate = [900e3, 890e3, 620e3], [550e3, 360e3, 360e3]
    judged = judge_pair("simulator_vs_bare.simulator_rate", "throughput", "higher", baseline, candidate)
    assert judged.high < 1 / 1.1, "the bound lies beyond the smallest effect..."
    assert judged.status == "unjudged" and judged.reason.startswith("too noisy"), "...but is too wide to tell"
    assert "the whole bound is worse than that" in judged.reason, "the reason says which way it leans"


def test_lag_near_zero_is_not_a_ratio_of_tiny_numbers():
    judged = judge_pair("bench_1x.lag_age_p95", "lag", "lower", [0.05, 0.04, 0.06], [0.08, 0.07, 0.09], "s")
    assert judged.status == "ok", judged.sentence()


def test_sotw_compare_puts_two_results_side_by_side(tmp_path, capsys):
    a, b = night(1, [0.10, 0.11, 0.12]), night(2, [0.03, 0.03, 0.04])
    pa, pb = a.write(tmp_path / "a"), b.write(tmp_path / "b")
    assert compare_cli.main([str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "| pipeline_vs_bare.ratio | REGRESSION |" in out
    assert compare_cli.main([str(pa), str(pb), "--fail-on-regression"]) == 1
    with pytest.raises(HarnessError, match="holds no results.json"):
        compare_cli.main([str(tmp_path), str(pb)])


def test_the_workflow_runs_make_nightly_nightly_and_on_demand_keeps_the_history_and_fails_on_regression():
    doc = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    triggers = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"], "once a day"
    assert "workflow_dispatch" in triggers
    [job] = doc["jobs"].values()
    steps = job["steps"]
    runs = [s.get("run", "") for s in steps]
    nightly_step = next(s for s in steps if "make nightly" in s.get("run", ""))
    assert "continue-on-error" not in nightly_step, "a regression must fail the job"
    keep = [s for s in steps if "nightly-history" in s.get("run", "") and "push" in s.get("run", "")]
    assert keep and keep[0]["if"] == "always()", "the night is kept even when it regressed"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "runs/nightly" and upload["if"] == "always()"
    assert any("nightly-history" in r and "checkout" in r for r in runs), "earlier nights are restored first"
    assert job["timeout-minutes"] * 60 <= 6 * 3600


def run_gate(tmp_path: Path, kafka, monkeypatch, *flags: str) -> tuple[int, str, Entry]:
    """``sotw nightly`` with the working tree's HEAD as its own baseline, on the test broker.

    Started from ``tmp_path`` with a relative history root, as ``make nightly`` starts it with ``runs/nightly``:
    the baseline's side runs in a tree of its own and must still find where its figures go.
    """
    monkeypatch.chdir(tmp_path)
    args = ["--quick", "--baseline", "HEAD", "--history", "nightly", "--bootstrap", kafka.bootstrap, "-q"]
    code = nightly.main([*args, *flags])
    root = tmp_path / "nightly"
    return code, (root / "comparison.md").read_text(), load_history(root / "history")[-1]


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_the_gate_passes_unchanged_code_measured_beside_itself(tmp_path, kafka, monkeypatch):
    code, text, entry = run_gate(
        tmp_path, kafka, monkeypatch, "--only", "simulator_vs_bare", "--repeats", "3", "--max-repeats", "3"
    )
    assert code == 0, text
    assert "no regression" in text and entry.verdict == "pass" and entry.baseline_commit
    assert len(entry.baseline_metrics) == len(entry.metrics) and all(j.pairs == 3 for j in entry.paired)
    assert (tmp_path / "nightly" / "baselines" / entry.baseline_commit[:12] / "pyproject.toml").is_file()


def test_a_benchmark_that_hangs_is_stopped_at_the_limit_with_what_it_started_and_fails_the_night(tmp_path):
    runs = SideRuns(
        NightlyConfig(root=tmp_path, command_timeout_s=3),
        Side(CANDIDATE, "c0ffee", REPO, sys.executable),
        tmp_path / "candidate",
        say=lambda message: None,
    )
    started = tmp_path / "child.pid"  # a process the hung command started: it must not outlive the night
    hang = (
        "import os, subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(started)!r} + '.new', 'w').write(str(child.pid)); "
        f"os.replace({str(started)!r} + '.new', {str(started)!r}); time.sleep(600)"
    )
    # Named as a load test, whose exit 1 (a FAIL verdict) still measured: a hang measured nothing.
    assert not runs.command("bench-1x-1", [sys.executable, "-c", hang], tmp_path / "out")
    [run] = runs.runs
    assert run.exit_code == TIMED_OUT and 3 <= run.seconds < 30 and runs.hung("bench")
    assert "stopped at the limit of 3 s a command may run" in Path(run.log).read_text()
    assert nightly.failed_benchmarks(runs.runs) == [run]
    assert nightly.how_it_ended(run).startswith("hung, stopped after")
    child = int(started.read_text())
    deadline = time.monotonic() + 5
    while not ended(child):
        assert time.monotonic() < deadline, "the hung command's own child outlived it"
        time.sleep(0.05)


def ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_quarter_slower_simulator_is_named_on_its_rate(tmp_path, kafka, monkeypatch):
    # Five pairs, and up to twelve while a metric is too noisy to judge (a busy machine).
    only = ["--only", "simulator_vs_bare", "--repeats", "5", "--max-repeats", "12"]
    code, text, entry = run_gate(tmp_path, kafka, monkeypatch, *only, "--plant-simulator-slowdown", "0.25")
    assert code == 1 and entry.verdict == "regression", text
    assert "REGRESSION simulator_vs_bare.simulator_rate x0." in text, text
    assert entry.planted == {"simulator_slowdown": "0.25"}
    bare = next(j for j in entry.paired if j.name == "simulator_vs_bare.bare_rate")
    assert bare.status != "regression", "the planted slowdown is the simulator's, not the bare loop's"


@pytest.mark.slow
def test_a_planted_per_batch_delay_is_named_on_batch_duration_lag_and_end_to_end_latency(
    tmp_path, kafka, monkeypatch
):
    code, text, entry = run_gate(
        tmp_path, kafka, monkeypatch, "--only", "bench", "--repeats", "3", "--plant-batch-delay", "0.5"
    )
    assert code == 1 and entry.planted == {"batch_delay_s": "0.5"}
    judged = {j.name: j for j in entry.paired}
    flagged = {name for name, j in judged.items() if j.status == "regression"}
    assert {"bench_1x.batch_duration", "bench_1x.end_to_end_p99"} <= flagged, text
    # The lag age is the noisiest of the three (its p95 rests on about ten rows of a 10 s steady phase): it
    # is named, or reported as too noisy to judge, never passed as unchanged.
    lag = judged["bench_1x.lag_age_p95"]
    assert lag.status == "regression" or lag.reason.startswith("too noisy"), text
    assert (tmp_path / "nightly" / "trend.html").is_file()
