"""The HDR-style latency histogram: bounded relative error, merging, and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtest.histogram import LatencyHistogram


@pytest.mark.parametrize("error", [0.01, 0.001])
def test_percentiles_are_within_the_relative_error_of_the_exact_ones(error: float) -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(mean=4.0, sigma=1.2, size=200_000)  # a long-tailed latency in ms
    hist = LatencyHistogram(relative_error=error)
    hist.record(values)
    for p in (50, 90, 99, 99.9):
        exact = float(np.percentile(values, p, method="inverted_cdf"))
        assert abs(hist.value_at(p) - exact) <= error * exact * 1.0001, p
    summary = hist.summary()
    assert summary.count == values.size
    assert summary.max == values.max() and summary.min == values.min()
    assert summary.mean == pytest.approx(values.mean())


def test_merging_two_histograms_equals_recording_everything_in_one() -> None:
    rng = np.random.default_rng(3)
    a_vals, b_vals = rng.exponential(50, 10_000), rng.exponential(500, 10_000)
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    a.record(a_vals)
    b.record(b_vals)
    both.record(np.concatenate([a_vals, b_vals]))
    a.merge(b)
    assert a.summary() == both.summary()


def test_merging_different_layouts_is_refused() -> None:
    with pytest.raises(ValueError, match="different layouts"):
        LatencyHistogram(0.01).merge(LatencyHistogram(0.001))


def test_small_negative_and_nan_values_are_handled() -> None:
    hist = LatencyHistogram(lowest=0.01)
    hist.record([0.0, 0.001, -5.0, float("nan"), 1.0])
    assert hist.count == 4 and hist.negative == 1
    assert hist.value_at(0) == 0.0
    assert hist.summary().max == 1.0


def test_empty_histogram_reports_nan_not_zero() -> None:
    summary = LatencyHistogram().summary()
    assert summary.count == 0 and math.isnan(summary.p99)


def test_memory_stays_small_for_a_wide_range() -> None:
    hist = LatencyHistogram(relative_error=0.01)
    hist.record(np.geomspace(0.01, 3_600_000, 1000))  # 10 µs to an hour
    assert hist._counts.size < 2000


def test_bad_parameters_are_rejected() -> None:
    with pytest.raises(ValueError, match="relative_error"):
        LatencyHistogram(relative_error=0.7)
    with pytest.raises(ValueError, match="percentile"):
        LatencyHistogram().value_at(101)
