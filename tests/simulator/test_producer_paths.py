"""The two producer paths (direct and client): chosen by a setting, the client where the direct one cannot load."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from simulator import Simulator, SimulatorConfig, SimulatorError, rdkafka
from simulator.ledger import NOT_ACKNOWLEDGED
from sotw.broker import KafkaBroker
from sotw.kafka import KafkaConfig
from tests.simulator.conftest import read_ledger

pytestmark = pytest.mark.system  # brokers of its own


def test_auto_takes_the_client_path_with_one_warning_saying_why_where_the_direct_one_cannot_load(
    simulate, monkeypatch, caplog
):
    monkeypatch.setattr(rdkafka, "unavailable", lambda: "librdkafka's C API is not exported here")
    with caplog.at_level(logging.WARNING):
        summary, _ = simulate(producer_path="auto", duration_s=0.5)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "librdkafka's C API is not exported here" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert summary.producer_path == "client" and summary.stats.acked == summary.stats.sent > 0


def test_auto_takes_the_direct_path_where_it_loads_and_says_nothing(simulate, caplog):
    with caplog.at_level(logging.WARNING):
        summary, _ = simulate(producer_path="auto", duration_s=0.3)
    assert summary.producer_path == "direct"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_direct_path_asked_for_where_it_cannot_load_is_refused_naming_why_and_the_way_out(
    simulate, monkeypatch
):
    monkeypatch.setattr(rdkafka, "unavailable", lambda: "no rd_kafka_produce symbol")
    with pytest.raises(
        SimulatorError, match="direct producer path cannot load here: no rd_kafka_produce.*client"
    ):
        simulate(producer_path="direct")


def test_an_unknown_producer_path_is_refused_naming_the_choices():
    with pytest.raises(SimulatorError, match="producer_path must be one of auto, direct, client, got 'fast'"):
        SimulatorConfig(producer_path="fast")


def test_a_broker_that_dies_mid_run_leaves_every_row_in_the_ledger_with_what_became_of_it(
    tmp_path, unique_prefix, producer_path
):
    with KafkaBroker() as broker:
        config = SimulatorConfig(
            sensors=3,
            rows=10,
            partitions=1,
            rate=2000,
            duration_s=4.0,
            topic_prefix=unique_prefix(),
            flush_timeout_s=1.0,
            producer={"message.timeout.ms": "1500"},
            producer_path=producer_path,
        )
        sim = Simulator(config, KafkaConfig(broker.bootstrap), tmp_path / "run")

        def kill_once_acknowledged() -> None:
            while sim.stats().acked < 500:
                time.sleep(0.01)
            broker.kill_node(1)  # a crash, with messages in flight

        killer = threading.Thread(target=kill_once_acknowledged, daemon=True)
        killer.start()
        summary = sim.run()
        killer.join()
    ledger = read_ledger(summary.run_dir)
    sent = [r for r in ledger if r["sent_ts"] is not None]
    lost = [r for r in sent if not r["delivered"]]
    assert len(sent) == summary.stats.sent and len(sent) - len(lost) >= 500
    assert lost, "the broker died with messages in flight: some must be reported lost"
    never_reported = [r for r in lost if r["error"] == NOT_ACKNOWLEDGED]
    assert len(lost) - len(never_reported) == summary.stats.failed  # reported failed: timed out, purged
    assert summary.unacknowledged >= len(never_reported)
    assert all(r["error"] and r["offset"] is None and r["acked_ts"] is None for r in lost)
    assert {r["error"] for r in lost} <= {
        NOT_ACKNOWLEDGED,
        "Local: Message timed out",
        "Local: Purged in queue",
        "Local: Purged in flight",
    }


def test_messages_for_topics_a_broker_lost_fail_in_the_ledger_and_the_run_goes_on(
    tmp_path, unique_prefix, producer_path
):
    with KafkaBroker() as broker:
        config = SimulatorConfig(
            sensors=2, rows=10, partitions=1, rate=500, duration_s=90.0, session_interval_s=600,
            topic_prefix=unique_prefix(), producer_path=producer_path,
            # librdkafka refuses messages for a topic the cluster says is gone only once the topic is older
            # than this (30 s by default, so that a topic just created has time to propagate).
            producer={"message.timeout.ms": "2000", "topic.metadata.propagation.max.ms": "100"},
        )  # fmt: skip
        sim = Simulator(config, KafkaConfig(broker.bootstrap), tmp_path / "run")
        stop = threading.Event()

        def lose_data_once_acknowledged() -> None:
            while sim.stats().acked < 300:
                time.sleep(0.01)
            broker.restart(kill=True, lose_data=True)  # back without topics; nobody makes them again
            # Run on until the producer has refused messages for a while (on a busy machine the broker's
            # return alone can outlast a fixed duration), at most a minute.
            back, deadline = sim.stats().failed, time.monotonic() + 60
            while sim.stats().failed < back + 50 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.0)
            stop.set()

        loser = threading.Thread(target=lose_data_once_acknowledged, daemon=True)
        loser.start()
        summary = sim.run(
            stop
        )  # no SimulatorError: the producer refusing a message for a gone topic is a failure
        loser.join()
    ledger = read_ledger(summary.run_dir)
    lost = [r for r in ledger if r["sent_ts"] is not None and not r["delivered"]]
    errors = {r["error"] for r in lost}
    # Refused at once by the producer once it learned the topics are gone; failed by the broker, or timed out,
    # before that.
    assert "Local: Unknown topic" in errors
    assert errors <= {
        "Local: Unknown topic",
        "Local: Unknown partition",
        "Broker: Unknown topic or partition",
        "Local: Message timed out",
        NOT_ACKNOWLEDGED,
    }
    assert summary.stats.failed == sum(1 for r in lost if r["error"] != NOT_ACKNOWLEDGED)
