"""What each incident did to the pipeline: time to detect, time to recover, peaks, and whether it stopped.

The measurements come from what the run already records: the samples taken about once a second (lag in offsets and
the age of the oldest unprocessed message) and the end-to-end latency of every applied message (when it was
meant to be sent, when the batch that wrote it committed). Definitions, stated once here and in
docs/loadtest.md:

* **before**: the ``BASELINE_S`` seconds before the incident began (within the steady phase); its p99 lag age
  and the p99 end-to-end latency of the messages meant for it and written before the incident began are the
  levels the pipeline must come back to.
* **detected**: the first sample at or after the start where the lag age exceeds
  ``max(DETECT_MIN_S, 2 x before's p99)``, or the pipeline stopped: the first symptom an operator sees.
* **recovered**: the first second at or after the incident's end from which, for ``HOLD_S`` seconds, the lag
  age stays within the profile's bound and the p99 end-to-end latency of the messages meant to be sent in each
  second stays within ``max(before's p99 x (1 + TOLERANCE), before's p99 + TOLERANCE_MIN_MS)``.
* **peaks**: the highest lag (age and offsets) and end-to-end latency from the start to recovery (or to the end
  of the run when it never recovered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from loadtest.reports.results import IncidentResult

BASELINE_S = 30.0
DETECT_MIN_S = 1.0
HOLD_S = 5
TOLERANCE = 0.2
TOLERANCE_MIN_MS = 250.0


@dataclass(frozen=True)
class Window:
    """One incident's window on the run's clock (epoch milliseconds)."""

    label: str
    kind: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Stop:
    """The pipeline stopped on its own: when, and its last words."""

    at_ms: int
    message: str


def _p99(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 99)) if values.size else math.nan


def measure(
    window: Window,
    samples: pd.DataFrame,
    e2e: pd.DataFrame,
    lag_bound_s: float,
    stop: Stop | None = None,
    steady_start_ms: int | None = None,
) -> IncidentResult:
    """Measure one incident.

    Parameters
    ----------
    window
        The incident's start and end.
    samples
        The run's samples: ``ts`` (epoch seconds), ``lag_age_s``, ``lag_offsets``.
    e2e
        Per applied message: ``intended_ts`` and ``latency_ms`` (``loadtest.correctness.latency.end_to_end``).
    lag_bound_s
        The profile's lag bound (``run.max_lag_s``).
    stop
        When and why the pipeline stopped on its own, if it did.
    steady_start_ms
        The baseline does not reach back before this (the warm-up is not a normal level).
    """
    start_s, end_s = window.start_ms / 1000.0, window.end_ms / 1000.0
    floor_s = max(start_s - BASELINE_S, (steady_start_ms or 0) / 1000.0)
    ts = samples["ts"].to_numpy(dtype=float) if "ts" in samples else np.zeros(0)
    age = _column(samples, "lag_age_s")
    offsets = _column(samples, "lag_offsets")
    before = (ts >= floor_s) & (ts < start_s)
    before_age = _p99(age[before])
    intended = e2e["intended_ts"].to_numpy(dtype=float) / 1000.0 if len(e2e) else np.zeros(0)
    latency = e2e["latency_ms"].to_numpy(dtype=float) if len(e2e) else np.zeros(0)
    # Before: messages meant for the window before and written before the incident began (the ones still in
    # flight when it began are the incident's own).
    committed = intended + latency / 1000.0
    before_e2e = _p99(latency[(intended >= floor_s) & (committed < start_s)])
    threshold = (
        max(before_e2e * (1 + TOLERANCE), before_e2e + TOLERANCE_MIN_MS)
        if math.isfinite(before_e2e)
        else math.inf
    )
    detect_s = _detect(ts, age, start_s, before_age, stop)
    recovered_at = (
        None
        if stop is not None and stop.at_ms >= window.start_ms
        else _recovered_at(ts, age, intended, latency, end_s, lag_bound_s, threshold)
    )
    until = recovered_at if recovered_at is not None else math.inf
    during = (ts >= start_s) & (ts <= until)
    during_e2e = (intended >= start_s) & (intended <= until)
    return IncidentResult(
        label=window.label,
        kind=window.kind,
        start_ms=window.start_ms,
        end_ms=window.end_ms,
        detect_s=detect_s,
        recover_s=None if recovered_at is None else max(0.0, recovered_at - end_s),
        peak_lag_age_s=_max(age[during]),
        peak_lag_offsets=_max(offsets[during]),
        peak_e2e_ms=_max(latency[during_e2e]),
        before_lag_age_p99_s=before_age,
        before_e2e_p99_ms=before_e2e,
        e2e_threshold_ms=threshold,
        stopped=stop is not None and stop.at_ms >= window.start_ms,
        stop_after_s=None
        if stop is None or stop.at_ms < window.start_ms
        else (stop.at_ms - window.end_ms) / 1000,
        stop_message=stop.message if stop is not None and stop.at_ms >= window.start_ms else "",
    )


def _column(samples: pd.DataFrame, name: str) -> np.ndarray:
    if name not in samples:
        return np.full(len(samples), math.nan)
    return samples[name].astype(float).to_numpy()


def _max(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else math.nan


def _detect(
    ts: np.ndarray, age: np.ndarray, start_s: float, before_age: float, stop: Stop | None
) -> float | None:
    """Seconds from the start to the first symptom: lag age well above its level before, or a stop."""
    limit = max(DETECT_MIN_S, 2 * before_age) if math.isfinite(before_age) else DETECT_MIN_S
    hits = ts[(ts >= start_s) & (age > limit)]
    candidates = [float(hits[0]) - start_s] if hits.size else []
    if stop is not None and stop.at_ms / 1000 >= start_s:
        candidates.append(stop.at_ms / 1000 - start_s)
    return min(candidates) if candidates else None


def _recovered_at(
    ts: np.ndarray,
    age: np.ndarray,
    intended: np.ndarray,
    latency: np.ndarray,
    end_s: float,
    lag_bound_s: float,
    threshold_ms: float,
) -> float | None:
    """The first second from the incident's end that starts ``HOLD_S`` good seconds (see the module doc)."""
    if not ts.size:
        return None
    last = float(max(ts.max(), intended.max() if intended.size else 0.0))
    seconds = np.arange(math.floor(end_s), math.floor(last) + 1, dtype=float)
    if not seconds.size:
        return None
    good = np.ones(seconds.size, dtype=bool)
    # Lag: a second is good if the nearest sample at or after it is within the bound.
    idx = np.searchsorted(ts, seconds, side="left")
    known = idx < ts.size
    good[known] &= age[idx[known]] <= lag_bound_s
    good[~known] = False
    # Latency: the p99 of the messages meant to be sent in that second.
    if intended.size:
        bucket = np.floor(intended).astype(np.int64)
        frame = pd.DataFrame({"bucket": bucket, "latency": latency})
        p99 = frame[frame["bucket"] >= seconds[0]].groupby("bucket")["latency"].quantile(0.99)
        worse = p99[p99 > threshold_ms].index.to_numpy(dtype=float)
        good &= ~np.isin(seconds, worse)
        # Seconds after the last message that was written say nothing about latency.
        good &= seconds <= float(bucket.max())
    run = 0
    for i, ok in enumerate(good):
        run = run + 1 if ok else 0
        if run >= HOLD_S:
            return float(seconds[i - HOLD_S + 1])
    return None
