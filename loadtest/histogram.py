"""An HDR-style latency histogram: log-sized buckets with a bounded relative error, built on numpy.

Latency distributions have long tails, so a mean hides what matters and keeping every sample costs memory
proportional to the run. Log-sized buckets keep the relative error of every reported percentile below a
fixed bound (1 % by default) with a few hundred counters, merge by adding counts (samplers on several
processes, or 1x and 10x runs), and record whole numpy arrays at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))


@dataclass(frozen=True)
class Percentiles:
    """The summary a capacity planner reads: count, the tail percentiles and the exact min, max and mean."""

    count: int
    p50: float
    p90: float
    p99: float
    p99_9: float
    max: float
    min: float
    mean: float


class LatencyHistogram:
    """Counts of values in log-sized buckets; every percentile is within ``relative_error`` of a true sample.

    Bucket ``i`` (``i >= 1``) holds values in ``[lowest * g**(i-1), lowest * g**i)`` with
    ``g = 1 + 2 * relative_error`` and reports its midpoint ``lower * (1 + relative_error)``, so the reported
    value differs from any value in the bucket by at most ``relative_error`` of that value. Bucket 0 holds
    values below ``lowest`` (reported as the exact minimum). Negative values (clock skew) are clamped to 0
    and counted in ``negative``.

    Parameters
    ----------
    relative_error
        Bound on the relative error of reported percentiles, in (0, 0.5).
    lowest
        Smallest value resolved (same unit as the values, e.g. 0.01 ms).
    """

    def __init__(self, relative_error: float = 0.01, lowest: float = 0.01) -> None:
        if not 0 < relative_error < 0.5:
            raise ValueError(f"relative_error must be in (0, 0.5), got {relative_error!r}")
        if not lowest > 0:
            raise ValueError(f"lowest must be > 0, got {lowest!r}")
        self.relative_error = relative_error
        self.lowest = lowest
        self._log_growth = math.log1p(2 * relative_error)
        self._counts: npt.NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        self.count = 0
        self.negative = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    def _index(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        idx = np.zeros(values.shape, dtype=np.int64)
        above = values >= self.lowest
        idx[above] = np.floor(np.log(values[above] / self.lowest) / self._log_growth).astype(np.int64) + 1
        return idx

    def record(self, values: npt.ArrayLike) -> None:
        """Add an array (or iterable) of values; NaNs are ignored."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return
        negative = arr < 0
        self.negative += int(negative.sum())
        arr = np.where(negative, 0.0, arr)
        idx = self._index(arr)
        top = int(idx.max())
        if top >= self._counts.size:
            grown = np.zeros(max(top + 1, 2 * self._counts.size), dtype=np.int64)
            grown[: self._counts.size] = self._counts
            self._counts = grown
        self._counts += np.bincount(idx, minlength=self._counts.size)
        self.count += int(arr.size)
        self._sum += float(arr.sum())
        self._min = min(self._min, float(arr.min()))
        self._max = max(self._max, float(arr.max()))

    def merge(self, other: LatencyHistogram) -> None:
        """Add another histogram's counts into this one; both must have the same bucket layout."""
        if (other.relative_error, other.lowest) != (self.relative_error, self.lowest):
            raise ValueError(
                "cannot merge histograms with different layouts: "
                f"({self.relative_error}, {self.lowest}) vs ({other.relative_error}, {other.lowest})"
            )
        if other._counts.size > self._counts.size:
            grown = np.zeros(other._counts.size, dtype=np.int64)
            grown[: self._counts.size] = self._counts
            self._counts = grown
        self._counts[: other._counts.size] += other._counts
        self.count += other.count
        self.negative += other.negative
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def value_at(self, percentile: float) -> float:
        """The value at ``percentile`` (0-100): the smallest bucket covering that rank, clamped to min/max."""
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile!r}")
        if self.count == 0:
            return math.nan
        rank = max(1, math.ceil(percentile / 100.0 * self.count))
        bucket = int(np.searchsorted(np.cumsum(self._counts), rank))
        if bucket == 0:
            return self._min
        value = self.lowest * math.exp((bucket - 1) * self._log_growth) * (1 + self.relative_error)
        return min(max(value, self._min), self._max)

    def summary(self) -> Percentiles:
        """p50, p90, p99, p99.9, max, min and mean (NaN for an empty histogram)."""
        if self.count == 0:
            nan = math.nan
            return Percentiles(0, nan, nan, nan, nan, nan, nan, nan)
        values = {name: self.value_at(p) for name, p in PERCENTILES}
        return Percentiles(
            count=self.count,
            max=self._max,
            min=self._min,
            mean=self._sum / self.count,
            **values,
        )

    @classmethod
    def of(cls, values: Iterable[float], relative_error: float = 0.01) -> LatencyHistogram:
        """A histogram of ``values`` (a list, an iterable or a numpy array) in one call."""
        hist = cls(relative_error=relative_error)
        hist.record(values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=np.float64))
        return hist
