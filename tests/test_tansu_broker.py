"""The embedded Tansu broker (`--broker tansu`) against its real processes: restarts that keep or lose data, pauses,
and no process left behind."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from sotw.broker import Outage, TansuBroker, port_in_use
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics
from tests.deliveries import PARTITIONS, Deliveries, filled, read_all


@pytest.fixture(scope="module")
def durable() -> Iterator[TansuBroker]:
    # Tansu exits on SIGTERM only when no client is connected: a short grace keeps graceful restarts quick.
    with TansuBroker(durable=True, stop_grace_s=1.0) as broker:
        yield broker


@pytest.fixture
def memory() -> Iterator[TansuBroker]:
    with TansuBroker(stop_grace_s=1.0) as broker:
        yield broker


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_durable_broker_restarted_keeps_every_acknowledged_record(durable, unique_prefix, kill):
    topic = unique_prefix() + "restart"
    sender = filled(durable.bootstrap, topic, 10_000)
    outage = durable.restart(kill=kill)
    # The same producer goes on after the restart: the broker still knows its producer id and sequences.
    sender.send(topic, range(10_000, 20_000))
    assert sender.flush() == 0
    assert sender.errors == []
    assert len(sender.acked) == 20_000
    values = read_all(durable.bootstrap, topic, 20_000)
    assert sorted(values) == list(range(20_000))  # none missing, none twice
    assert outage.kind == ("kill" if kill else "restart") and outage.kept_data
    assert outage.down_ms <= outage.up_ms and durable.outages[-1] == outage


def test_a_long_lived_end_reader_finds_records_the_durable_brokers_watermark_stopped_counting(
    durable, unique_prefix
):
    # Tansu on S3 can leave a partition's reported watermark behind when batches come quickly; a reader
    # that trusted its remembered end while the watermark stood still never saw the rest.
    kafka = KafkaConfig(durable.bootstrap)
    topic = unique_prefix() + "wm"
    ensure_topics(kafka, {topic: 1})
    producer = Producer(kafka.client(**{"linger.ms": "20"}))
    ends = EndOffsets(kafka, recheck_s=0.5)
    sent = 0
    for batch in range(6):
        for i in range(10 + batch):
            producer.produce(topic, value=b"%d" % i, partition=0)
        sent += 10 + batch
        assert producer.flush(15) == 0
        ends([(topic, 0)])
    deadline = time.monotonic() + 10
    while ends([(topic, 0)])[(topic, 0)][1] < sent and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ends([(topic, 0)])[(topic, 0)] == (0, sent)


def test_a_durable_broker_can_lose_its_data_on_request(durable, unique_prefix):
    topic = unique_prefix() + "lost"
    ensure_topics(KafkaConfig(durable.bootstrap), {topic: PARTITIONS})
    assert topic in topics(durable.bootstrap)
    outage = durable.restart(lose_data=True)
    assert not outage.kept_data
    assert topic not in topics(durable.bootstrap)


def test_restarting_a_memory_broker_must_be_asked_to_lose_data(memory):
    with pytest.raises(BrokerError, match=r"loses every record: call restart\(lose_data=True\).*durable"):
        memory.restart()
    memory.check_alive()
    assert memory.outages == []


def test_a_memory_broker_restarted_comes_back_without_topics_records_or_producer_ids(memory, unique_prefix):
    topic = unique_prefix() + "gone"
    sender = filled(memory.bootstrap, topic, 300, **{"message.timeout.ms": "3000"})
    port = memory.port
    outage = memory.restart(kill=True, lose_data=True)
    assert memory.port == port and not outage.kept_data
    assert topic not in topics(memory.bootstrap)
    # The producer that survived the restart is unknown to the new broker: every later delivery fails.
    sender.send(topic, range(300, 400))
    sender.flush()
    assert len(sender.acked) == 300 and len(sender.errors) == 100
    assert {e.code() for e in sender.errors} == {KafkaError._MSG_TIMED_OUT}
    # Its metadata requests re-created the topic, empty and with the broker's default partition count.
    ends = EndOffsets(KafkaConfig(memory.bootstrap))([(topic, p) for p in range(PARTITIONS)])
    assert set(ends.values()) == {(0, 0)}
    # A new producer works at once.
    fresh = Deliveries(memory.bootstrap)
    fresh.send(topic, range(50))
    assert fresh.flush() == 0 and fresh.errors == []
    assert sorted(read_all(memory.bootstrap, topic, 50)) == list(range(50))


def test_a_paused_broker_holds_deliveries_until_it_resumes(memory, unique_prefix):
    topic = unique_prefix() + "pause"
    sender = filled(memory.bootstrap, topic, 1000)
    memory.pause()
    memory.pause()  # idempotent
    assert memory.paused
    sender.send(topic, range(1000, 2000))
    assert sender.flush(1.5) > 0  # nothing is answered while frozen
    assert len(sender.acked) == 1000
    outage = memory.resume()
    assert memory.resume() is None
    assert sender.flush() == 0 and sender.errors == []
    assert sorted(read_all(memory.bootstrap, topic, 2000)) == list(range(2000))
    assert isinstance(outage, Outage) and outage.kind == "pause" and outage.duration_s >= 1.5


def test_closing_a_paused_broker_resumes_and_stops_it():
    broker = TansuBroker().start()
    broker.pause()
    broker.stop()
    assert not broker.paused and broker.outages[-1].kind == "pause"
    assert not port_in_use(broker.host, broker.port)


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _gone(pids: set[int], timeout: float = 5.0) -> set[int]:
    """The pids among ``pids`` still alive (not zombies) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.add(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_closed_durable_broker_leaves_no_process_behind():
    before = _descendants()
    with TansuBroker(durable=True) as broker:
        broker.restart(kill=True)
        started = _descendants() - before
        # the watchdog, the S3 server and Tansu
        assert len(started) == 3
        assert broker.process is not None and broker.process.pid in started
    assert _gone(started, timeout=0) == set()


OWNER = """
import sys, time
from sotw.broker import TansuBroker
broker = TansuBroker(durable=True).start()
broker.pause()
print(broker.bootstrap, flush=True)
time.sleep(600)
"""


def test_the_broker_processes_die_with_the_process_that_started_them():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        bootstrap = owner.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        children = {p.pid for p in psutil.Process(owner.pid).children(recursive=True)}
        assert len(children) == 3
        os.kill(owner.pid, signal.SIGKILL)  # no clean-up runs
        owner.wait(5)
        assert _gone(children) == set()
        host, port = bootstrap.split(":")
        assert not port_in_use(host, int(port))
    finally:
        owner.kill()
        owner.wait()
