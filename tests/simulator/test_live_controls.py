"""Live controls the game-day incidents use: a sensor storm, and topics made again after a data loss."""

from __future__ import annotations

import threading

import pyarrow.parquet as pq

from simulator import Simulator, SimulatorConfig
from sotw.broker import KafkaBroker
from sotw.kafka import KafkaConfig
from tests.simulator.conftest import read_ledger, when_planned


def test_sensors_asked_for_join_at_once_with_topics_and_sessions_of_their_own(kafka, tmp_path, unique_prefix):
    config = SimulatorConfig(
        sensors=2, rows=10, partitions=1, rate=1000, duration_s=60, session_interval_s=600,
        topic_prefix=unique_prefix(),
    )  # fmt: skip
    sim = Simulator(config, kafka, tmp_path / "run")
    stop = threading.Event()

    def storm():
        n = when_planned(sim, 300)
        sim.add_sensors(6)
        when_planned(sim, n + 1500)
        stop.set()

    thread = threading.Thread(target=storm)
    thread.start()
    summary = sim.run(stop)
    thread.join()
    sensors = pq.read_table(summary.run_dir / "truth" / "sensors.parquet").to_pylist()
    assert sorted(s["sensor"] for s in sensors) == [f"{i:04d}" for i in range(8)]
    topics = {r["topic"] for r in read_ledger(summary.run_dir) if r["delivered"]}
    assert topics == {config.topic_prefix + s["sensor"] for s in sensors}  # every new sensor published


def test_the_producer_delivers_again_once_its_topics_are_made_again_after_the_broker_lost_its_data(
    tmp_path, unique_prefix
):
    with KafkaBroker() as broker:
        config = SimulatorConfig(
            sensors=2, rows=10, partitions=1, rate=500, duration_s=60, session_interval_s=600,
            topic_prefix=unique_prefix(),
        )  # fmt: skip
        sim = Simulator(config, KafkaConfig(broker.bootstrap), tmp_path / "run")
        stop = threading.Event()
        after: list[int] = []

        def data_loss():
            when_planned(sim, 300)
            broker.restart(kill=True, lose_data=True)
            sim.recreate_topics()
            # Counted from here: the planner went on while the broker was down (3 s).
            after.append(when_planned(sim, sim.stats().planned + 200))
            when_planned(sim, after[0] + 500)
            stop.set()

        thread = threading.Thread(target=data_loss)
        thread.start()
        summary = sim.run(stop)
        thread.join()
    rows = sorted(read_ledger(summary.run_dir), key=lambda r: r["intended_ts"])
    later = rows[after[0] :]
    assert later and sum(r["delivered"] for r in later) >= 0.95 * len(later)
