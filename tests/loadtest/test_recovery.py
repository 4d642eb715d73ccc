"""Recovery measurements on hand-made runs: a kill that recovers, a pause with no symptom, a stop."""

from __future__ import annotations

import numpy as np
import pandas as pd

from loadtest.gameday.recovery import Stop, Window, measure

T0 = 1_800_000_000.0  # epoch seconds of the steady phase's start


def run(
    lag_age: list[float], latency_ms: list[float], per_second: int = 10
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One sample a second with the given lag ages; ``per_second`` messages a second with the given latencies."""
    samples = pd.DataFrame({"ts": T0 + np.arange(len(lag_age)), "lag_age_s": lag_age, "lag_offsets": lag_age})
    intended = (
        T0
        + np.repeat(np.arange(len(latency_ms)), per_second)
        + np.tile(np.arange(per_second) / per_second, len(latency_ms))
    )
    latency = np.repeat(latency_ms, per_second)
    return samples, pd.DataFrame({"intended_ts": intended * 1000, "latency_ms": latency})


def window(start: int, end: int) -> Window:
    return Window("kill", "pipeline_kill", int((T0 + start) * 1000), int((T0 + end) * 1000))


def test_a_kill_is_detected_by_its_lag_and_recovers_when_lag_and_latency_are_back():
    # 40 calm seconds, killed at 40 and restarted at 45, caught up by 52.
    ages = [0.5] * 40 + [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.0, 6.0, 4.0, 2.0, 1.0, 0.6] + [0.5] * 20
    latency = [800.0] * 40 + [9000.0] * 12 + [820.0] * 20
    samples, e2e = run(ages, latency)
    got = measure(window(40, 45), samples, e2e, lag_bound_s=3.0, steady_start_ms=int(T0 * 1000))
    assert got.detect_s == 0.0  # the first sample after the kill is over the 1 s floor (2 x 0.5)
    assert got.recover_s == 7.0  # second 52 starts five good seconds: lag <= 3 s and p99 <= 800 + 250 ms
    assert got.peak_lag_age_s == 7.0 and got.peak_e2e_ms == 9000.0
    assert got.before_e2e_p99_ms == 800.0 and got.e2e_threshold_ms == 1050.0
    assert not got.stopped


def test_an_incident_without_symptoms_is_not_detected_and_counts_as_recovered_at_once():
    samples, e2e = run([0.4] * 60, [700.0] * 60)
    got = measure(window(30, 35), samples, e2e, lag_bound_s=3.0)
    assert got.detect_s is None and got.recover_s == 0.0


def test_a_pipeline_that_stopped_never_recovers_and_the_stop_is_the_symptom():
    samples, e2e = run([0.4] * 30 + [5.0] * 30, [700.0] * 30)
    stop = Stop(int((T0 + 33) * 1000), "Kafka data lost: topic 't' partition 0 offsets [10, 90)")
    got = measure(window(30, 32), samples, e2e, lag_bound_s=3.0, stop=stop)
    assert got.stopped and got.stop_after_s == 1.0 and "partition 0" in got.stop_message
    assert got.detect_s == 0.0  # lag age 5 s at the first sample, before the stop at 3 s
    assert got.recover_s is None
