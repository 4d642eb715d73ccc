"""The nightly benchmark: history entries, the regression check, the trend page, ``sotw compare`` and the workflow."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from loadtest import compare as compare_cli
from loadtest import nightly
from loadtest.errors import HarnessError
from loadtest.history import Entry, Metric, baseline_of, compare, load_history
from loadtest.trend import write_trend

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
    history = [night(1, [0.1, 0.11, 0.12], lag=[1, 1, 1]), night(2, [0.11, 0.1, 0.12], lag=[1, 2, 1])]
    history.append(night(3, [0.02, 0.03, 0.02], lag=[1, 1, 2]))
    page = write_trend(history, tmp_path / "trend.html", nights=7).read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "REGRESSION" in page and "pipeline_vs_bare.ratio fell to" in page


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


@pytest.mark.slow
def test_a_planted_batch_delay_is_flagged_naming_the_metric_and_unchanged_code_is_not(tmp_path, capsys):
    args = ["--quick", "--only", "pipeline_vs_bare", "--repeats", "3", "--history", str(tmp_path), "-q"]
    assert nightly.main(args) == 0
    assert nightly.main(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "no regression" in out
    # Each micro-batch of the pipeline benchmark now waits 5 s before it writes.
    assert nightly.main([*args, "--plant-batch-delay", "5"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION pipeline_vs_bare.ratio fell" in out, out
    assert "bare_rate" not in out.split("REGRESSION", 1)[1].split("\n")[0]
    entries = load_history(tmp_path / "history")
    assert len(entries) == 3 and entries[-1].planted == {"batch_delay_s": "5"}
    assert (tmp_path / "trend.html").is_file() and (tmp_path / "comparison.md").is_file()
