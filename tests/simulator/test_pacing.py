"""Pacing: the schedule's rate follows live load changes, and a late loop catches up without skipping."""

from __future__ import annotations

import threading

import numpy as np

from simulator import Simulator, SimulatorConfig
from tests.simulator.conftest import read_ledger, when_planned


def test_a_load_factor_changed_mid_run_changes_the_planned_rate_both_ways(kafka, tmp_path, unique_prefix):
    config = SimulatorConfig(
        sensors=2,
        rows=10,
        partitions=1,
        rate=500,
        duration_s=60,
        session_interval_s=600,
        topic_prefix=unique_prefix(),
    )
    sim = Simulator(config, kafka, tmp_path / "run")
    stop = threading.Event()

    def burst():  # 1x, 10x, then 1x again, as the harness's bursts do
        n = when_planned(sim, 300)
        sim.set_load_factor(10)
        n = when_planned(sim, n + 3000)
        sim.set_load_factor(1)
        when_planned(sim, n + 500 + 300)  # the 10x block under way, then 300 at 1x
        stop.set()

    thread = threading.Thread(target=burst)
    thread.start()
    summary = sim.run(stop)
    thread.join()
    intended = np.sort([r["intended_ts"] for r in read_ledger(summary.run_dir) if r["kind"] == "update"])
    # Messages per 100 ms of schedule, whole windows only: 50 at 1x, 500 at 10x, some between where it changed.
    per_window = np.bincount((intended - intended[0]) // 100)[:-1]
    phases = ["1x" if abs(c - 50) <= 1 else "10x" if abs(c - 500) <= 1 else "change" for c in per_window]
    steady = [p for i, p in enumerate(phases) if p != "change" and (i == 0 or phases[i - 1] != p)]
    assert steady == ["1x", "10x", "1x"], per_window
    assert phases.count("change") <= 2 and phases.count("10x") >= 5


def test_a_paced_run_sends_every_message_at_or_after_its_time_and_none_skipped(simulate):
    summary, config = simulate(rate=4000, duration_s=1.0, session_interval_s=3600)
    rows = read_ledger(summary.run_dir)
    slots = [r for r in rows if r["kind"] != "end"]  # the closing ends come after the schedule's slots
    assert len(slots) == 4000  # one per slot: 4,000 msg/s for 1 s
    assert all(r["sent_ts"] >= r["intended_ts"] for r in rows if r["sent_ts"] is not None)
