"""The simulator's producer (librdkafka driven directly): settings, reports, a full queue and refusals."""

from __future__ import annotations

import _thread
import socket
import threading
import time
from collections import Counter

import pytest

from simulator import FaultConfig, Simulator, SimulatorConfig, SimulatorError
from simulator.client import ClientProducer
from simulator.rdkafka import DirectProducer, error_text
from sotw.kafka import ensure_topics
from tests.simulator.conftest import read_ledger, read_topics


@pytest.mark.parametrize("make", [DirectProducer, ClientProducer], ids=["direct", "client"])
def test_a_bad_producer_setting_is_refused_naming_it(kafka, make):
    with pytest.raises(SimulatorError, match="bad producer setting.*no.such.setting"):
        make(kafka.client(**{"no.such.setting": "1"}))
    with pytest.raises(SimulatorError, match="bad producer setting.*acks"):
        make(kafka.client(acks="sometimes"))
    # Settings librdkafka takes but the ledger cannot live with, and settings that conflict.
    if make is DirectProducer:  # the direct path's report log is sized from the queue's limit
        with pytest.raises(
            SimulatorError, match="queue.buffering.max.messages must be 1 to 10,000,000.*not 0"
        ):
            make(kafka.client(**{"queue.buffering.max.messages": 0}))
    with pytest.raises(SimulatorError, match="acks=0 gives no offsets"):
        make(kafka.client(acks=0, **{"enable.idempotence": False}))
    with pytest.raises(SimulatorError, match="delivery.report.only.error=true reports no deliveries"):
        make(kafka.client(**{"delivery.report.only.error": True}))
    with pytest.raises(SimulatorError, match="bad producer settings: .*acks.*idempotence"):
        make(kafka.client(acks=1, **{"enable.idempotence": True}))


@pytest.mark.parametrize("make", [DirectProducer, ClientProducer], ids=["direct", "client"])
def test_each_report_gives_back_the_row_it_was_produced_with_and_its_offset_or_error(
    kafka, unique_prefix, make
):
    topic = f"{unique_prefix()}0001"
    ensure_topics(kafka, {topic: 1})
    producer = make(kafka.client(**{"message.timeout.ms": "3000"}))
    try:
        handle = producer.topic(topic)
        assert producer.topic(topic) == handle  # one handle per topic
        for row in (11, 12, 13):
            assert producer.produce(handle, 0, b"v%d" % row, b"k", row) == 0
        # Partition 9 does not exist: refused at once, or reported as failed once the metadata says so.
        refused = producer.produce(handle, 9, b"lost", b"k", 14)
        assert producer.flush(10) == 0
        rows, offsets, codes = producer.take()
        by_row = dict(zip(rows.tolist(), zip(offsets.tolist(), codes.tolist(), strict=True), strict=True))
        assert [by_row[r] for r in (11, 12, 13)] == [(0, 0), (1, 0), (2, 0)]
        code = refused or by_row[14][1]
        assert code != 0 and "partition" in error_text(code).lower()
        assert len(producer.take()[0]) == 0  # taken once
    finally:
        producer.close()
        producer.close()  # twice is harmless
    with pytest.raises(SimulatorError, match="the producer is closed"):
        producer.poll(0)
    records = read_topics(kafka, [topic], 1)
    assert [r["value"] for r in sorted(records, key=lambda r: r["offset"])] == [b"v11", b"v12", b"v13"]


# Each path takes over 30 s on CI: the default's in make test, the other's in make test-slow.
@pytest.mark.parametrize("producer_path", ["direct", pytest.param("client", marks=pytest.mark.slow)])
def test_a_full_producer_queue_makes_the_simulator_wait_and_lose_nothing(kafka, simulate, producer_path):
    # A queue of 64 messages fills on every slice of a full-speed run: the loop must poll and retry.
    summary, config = simulate(
        rate=0,
        duration_s=None,
        max_messages=20_000,
        producer={"queue.buffering.max.messages": "64"},
        producer_path=producer_path,
    )
    assert summary.stats.backpressure_waits > 0
    ledger = read_ledger(summary.run_dir)
    assert len(ledger) == summary.stats.sent == summary.stats.acked and summary.unacknowledged == 0
    assert all(row["delivered"] and row["error"] is None for row in ledger)
    places = Counter((row["topic"], row["partition"], row["offset"]) for row in ledger)
    assert max(places.values()) == 1
    on_topics = {
        (r["topic"], r["partition"], r["offset"]): r["sha"]
        for r in read_topics(kafka, list(summary.topics), config.partitions)
    }
    assert {p: on_topics.get(p) for p in places} == {
        (row["topic"], row["partition"], row["offset"]): row["value_sha256"] for row in ledger
    }


def test_a_message_the_client_refuses_stops_the_run_saying_which_and_why(simulate, producer_path):
    with pytest.raises(
        SimulatorError, match=r"refused a [\d,]+-byte message for \S+-sensor-\d{4}: .*size too large"
    ):
        simulate(rows=200, producer={"message.max.bytes": "2000"}, producer_path=producer_path)


def test_a_ctrl_c_in_the_middle_of_a_run_leaves_nothing_on_the_topics_that_the_ledger_lacks(
    kafka, tmp_path, unique_prefix, producer_path
):
    config = SimulatorConfig(
        sensors=4,
        rows=20,
        partitions=2,
        rate=0,
        duration_s=None,
        max_messages=400_000,
        topic_prefix=unique_prefix(),
        faults=FaultConfig(delayed=0.02, delay_ms=30),
        seed=3,
        producer_path=producer_path,
    )
    sim = Simulator(config, kafka, tmp_path / "run")

    def interrupt_once_publishing() -> None:
        while sim.stats().sent < 60_000:
            time.sleep(0.005)
        _thread.interrupt_main()  # a KeyboardInterrupt in the loop's thread, wherever it is

    threading.Thread(target=interrupt_once_publishing, daemon=True).start()
    summary = sim.run()
    assert summary.interrupted and summary.stats.sent < 400_000
    ledger = read_ledger(summary.run_dir)
    records = read_topics(kafka, list(summary.topics), config.partitions)
    assert not [r for r in ledger if r["sent_ts"] is None and r["delivered"]], "a never-sent row is delivered"
    sent = {r["value_sha256"] for r in ledger if r["sent_ts"] is not None}
    missing = [r for r in records if r["sha"] not in sent]
    assert not missing, f"{len(missing)} records on the topics are not in the ledger"
    if producer_path == "client":
        # A Ctrl-C landing as a Python delivery callback starts loses that one report (simulator.client): the
        # message has its row, recorded as not acknowledged.
        return
    places = {(r["topic"], r["partition"], r["offset"]): r for r in ledger if r["delivered"]}
    missing = [r for r in records if (r["topic"], r["partition"], r["offset"]) not in places]
    assert not missing, f"{len(missing)} records on the topics are not acknowledged in the ledger"
    assert all(places[(r["topic"], r["partition"], r["offset"])]["value_sha256"] == r["sha"] for r in records)


@pytest.mark.system  # waits on a broker of its own, or on none
def test_a_ctrl_c_while_the_broker_is_down_interrupts_the_producer_every_time():
    with socket.socket() as s:  # a port nothing listens on: the client reports errors all the while
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    producer = DirectProducer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 50}
    )
    interrupted = 0
    try:
        for _ in range(5):
            threading.Timer(0.02, _thread.interrupt_main).start()
            try:
                started = time.monotonic()
                while time.monotonic() - started < 1.0:
                    producer.poll(0.5)
            except KeyboardInterrupt:
                interrupted += 1
    finally:
        producer.close()
    assert interrupted == 5


def test_reports_reach_the_log_without_polling_and_none_is_lost_however_seldom_they_are_taken(
    kafka, unique_prefix
):
    # librdkafka's background thread serves the reports. A 64-message queue frees up only as reports are
    # written to the log; 20,000 messages produced without a single take overrun a log sized from the queue
    # unless produce calls read it on the way (every STASH_EVERY messages).
    topic = f"{unique_prefix()}0001"
    ensure_topics(kafka, {topic: 2})
    producer = DirectProducer(kafka.client(**{"queue.buffering.max.messages": "64", "linger.ms": "1"}))
    try:
        assert producer.serves_in_background
        handle, produced = producer.topic(topic), 0
        deadline = time.monotonic() + 60
        while produced < 20_000 and time.monotonic() < deadline:
            err = producer.produce(handle, produced % 2, b"v%d" % produced, b"k", produced)
            if err == 0:
                produced += 1
            else:
                time.sleep(0.0005)  # not poll: nothing on this thread serves the reports
        assert produced == 20_000
        assert producer.flush(30) == 0
        rows, offsets, codes = producer.take()
    finally:
        producer.close()
    assert sorted(rows.tolist()) == list(range(20_000))
    assert not codes.any() and (offsets >= 0).all()
