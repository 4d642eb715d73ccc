import math
import threading
import time

from simulator import FaultConfig, Simulator, SimulatorConfig
from simulator.faults import FaultTable
from tests.simulator.conftest import read_ledger, when_planned


def within(count, n, p, sigmas=5.0):
    mean = n * p
    return abs(count - mean) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


def test_fault_rates_land_within_statistical_bounds(simulate):
    faults = FaultConfig(gap=0.04, duplicate=0.05, delayed=0.03, malformed=0.06, abandon=0.5, delay_ms=20)
    summary, _ = simulate(faults=faults, rate=12_000, duration_s=1.5, sensors=6, session_interval_s=0.15)
    rows = read_ledger(summary.run_dir)
    messages = [r for r in rows if r["kind"] != "end" and r["fault"] != "duplicate"]
    ends = [r for r in rows if r["kind"] == "end"]
    n = len(messages)
    assert n > 10_000
    for fault, p in (("gap", 0.04), ("delayed", 0.03), ("malformed", 0.06)):
        count = sum(r["fault"] == fault for r in messages)
        assert within(count, n, p), (fault, count, n * p)
    copies = sum(r["fault"] == "duplicate" for r in rows)
    assert within(copies, n, 0.05), (copies, n * 0.05)
    # Closing ends at the stop are never abandoned, so count only ends inside the run.
    closing = max(r["intended_ts"] for r in ends)
    inside = [r for r in ends if r["intended_ts"] < closing]
    abandoned = sum(r["fault"] == "abandoned" for r in inside)
    assert len(inside) > 50 and within(abandoned, len(inside), 0.5), (abandoned, len(inside))


def test_faults_and_load_change_while_running_and_stats_can_be_sampled(kafka, tmp_path, unique_prefix):
    config = SimulatorConfig(
        sensors=3,
        rows=10,
        partitions=1,
        rate=2000,
        duration_s=2.0,
        session_interval_s=60,
        topic_prefix=unique_prefix(),
    )
    sim = Simulator(config, kafka, tmp_path / "live")
    samples = []

    def drive():
        time.sleep(0.7)
        sim.set_faults(FaultConfig(gap=1.0), sensor="0001")
        sim.set_load_factor(2.0)
        for _ in range(5):
            samples.append(sim.stats())
            time.sleep(0.2)

    thread = threading.Thread(target=drive)
    thread.start()
    summary = sim.run()
    thread.join()
    rows = read_ledger(summary.run_dir)
    gaps = [r for r in rows if r["fault"] == "gap"]
    assert gaps and {r["sensor"] for r in gaps} == {"0001"}
    first_gap = min(r["intended_ts"] for r in gaps)
    after = [
        r
        for r in rows
        if r["sensor"] == "0001" and r["intended_ts"] > first_gap + 200 and r["kind"] == "update"
    ]
    assert after and all(r["fault"] == "gap" for r in after)
    assert summary.stats.planned > 2000 * 2.0 * 1.2  # the load factor raised the rate part of the way
    assert all(s.load_factor == 2.0 for s in samples[1:])
    assert [s.sent for s in samples] == sorted(s.sent for s in samples)
    assert summary.stats.faults["gap"] == len(gaps)


def test_a_sensor_with_rates_of_its_own_keeps_them_when_the_default_changes_until_they_are_cleared(
    kafka, tmp_path, unique_prefix
):
    config = SimulatorConfig(
        sensors=3,
        rows=10,
        partitions=1,
        rate=3000,
        duration_s=60,
        session_interval_s=600,
        topic_prefix=unique_prefix(),
        faults=FaultConfig(malformed=0.3),
        sensor_faults={"0001": FaultConfig(gap=0.5)},
    )
    sim = Simulator(config, kafka, tmp_path / "run")
    stop = threading.Event()

    def drive():
        n = when_planned(sim, 1500)
        sim.set_faults(FaultConfig())  # a global fault window ends
        n = when_planned(sim, n + 1500)
        sim.clear_faults("0001")
        when_planned(sim, n + 1500)
        stop.set()

    thread = threading.Thread(target=drive)
    thread.start()
    summary = sim.run(stop)
    thread.join()
    rows = [r for r in read_ledger(summary.run_dir) if r["kind"] == "update" and r["fault"] != "duplicate"]
    by_sensor = {s: [r for r in rows if r["sensor"] == s] for s in ("0000", "0001", "0002")}
    default_ended = max(r["intended_ts"] for r in rows if r["fault"] == "malformed")
    own_cleared = max(r["intended_ts"] for r in by_sensor["0001"] if r["fault"] == "gap")
    for sensor in ("0000", "0002"):  # the default: malformed until it changed, nothing after
        faults = {r["fault"] for r in by_sensor[sensor] if r["intended_ts"] <= default_ended}
        assert faults == {"none", "malformed"}
        assert {r["fault"] for r in by_sensor[sensor] if r["intended_ts"] > default_ended} == {"none"}
    # Sensor 0001 had gaps only, before and after the default changed, until its own rates were cleared.
    assert {r["fault"] for r in by_sensor["0001"] if r["intended_ts"] <= own_cleared} == {"none", "gap"}
    kept = [r for r in by_sensor["0001"] if default_ended < r["intended_ts"] <= own_cleared]
    gaps = sum(r["fault"] == "gap" for r in kept)
    assert len(kept) > 200 and within(gaps, len(kept), 0.5), (gaps, len(kept))
    after = [r for r in by_sensor["0001"] if r["intended_ts"] > own_cleared]
    assert len(after) > 200  # at a rate of 0.5, 200 messages in a row without a gap never happen by chance
    gap_rows = [r for r in read_ledger(summary.run_dir) if r["fault"] == "gap"]
    assert summary.stats.faults["gap"] == len(gap_rows) and {r["sensor"] for r in gap_rows} == {"0001"}


def test_the_default_and_one_sensors_rates_can_be_set_and_cleared_as_a_table():
    table = FaultTable(FaultConfig(gap=0.1), {"0001": FaultConfig(malformed=0.2)})
    table.set(FaultConfig(duplicate=0.3))
    assert table.for_sensor("0001") == FaultConfig(malformed=0.2)
    assert table.for_sensor("0002") == FaultConfig(duplicate=0.3)
    table.set(FaultConfig(delayed=0.4), sensor="0002")
    table.clear("0001")
    assert table.for_sensor("0001") == FaultConfig(duplicate=0.3)
    assert table.for_sensor("0002") == FaultConfig(delayed=0.4)
    table.clear()
    assert table.for_sensor("0002") == FaultConfig(duplicate=0.3) and not table.overrides
