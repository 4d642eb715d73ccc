"""The warm-up's end: a pipeline that never caught up is measured anyway, and the run says so before any incident."""

from __future__ import annotations

from pathlib import Path

from loadtest.measure.samplers import Sampler
from loadtest.run.phases import behind, pipeline_warm
from loadtest.run.profile import RunSettings


def _sampler(tmp_path: Path, **last: float) -> Sampler:
    sampler = Sampler({}, tmp_path / "samples.jsonl")
    sampler.rows.append(dict(last))
    return sampler


def test_a_pipeline_that_caught_up_in_the_warm_up_starts_the_steady_phase_without_a_warning(
    tmp_path: Path,
) -> None:
    settings = RunSettings(warmup_s=15, max_lag_s=15)
    sampler = _sampler(tmp_path, consumed=1000, lag_age_s=3.0)
    assert pipeline_warm(sampler, 20, settings)
    assert behind(sampler, settings, 20) is None


def test_a_pipeline_still_behind_when_the_warm_up_runs_out_is_measured_with_a_warning_naming_its_lag(
    tmp_path: Path,
) -> None:
    settings = RunSettings(warmup_s=15, max_lag_s=15, pipeline_start_timeout_s=120)
    sampler = _sampler(tmp_path, consumed=667527, lag_age_s=92.5)
    assert not pipeline_warm(sampler, 100, settings)
    assert pipeline_warm(sampler, 135, settings)
    warning = behind(sampler, settings, 135)
    assert warning is not None and "lag age 92 s" in warning and "135 s" in warning


def test_a_pipeline_that_consumed_nothing_is_named_so(tmp_path: Path) -> None:
    settings = RunSettings(warmup_s=15, pipeline_start_timeout_s=120)
    warning = behind(_sampler(tmp_path, consumed=0, lag_age_s=0.0), settings, 135)
    assert warning == "the pipeline had consumed nothing after 135 s of load"
