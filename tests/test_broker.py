"""The local Kafka broker against its real JVMs: start, a round trip, restarts that keep or lose data, a
pause, `sotw broker`, no process left behind, and every start-up failure named with its fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from sotw.broker import KafkaBroker, Outage, wait_for_kafka
from sotw.broker.config import new_cluster_id
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics
from tests.deliveries import PARTITIONS, Deliveries, filled, read_all

pytestmark = pytest.mark.system  # brokers of its own


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    """A one-node broker of this module's own, for the incidents (the session's broker is shared)."""
    with KafkaBroker(stop_grace_s=10.0) as broker:
        yield broker


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def still_running(pids: set[int], timeout: float = 5.0) -> set[int]:
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


def listening(port: int, timeout: float = 5.0) -> bool:
    """Whether any process still listens on ``port`` after waiting up to ``timeout`` seconds for it to stop.

    A killed JVM's main thread shows as a zombie while its other threads are still exiting and holding the
    sockets, so the port is polled rather than read once. (A connect test could meet a TCP self-connection.)
    """
    deadline = time.monotonic() + timeout
    while True:
        held = any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in psutil.net_connections("tcp")
        )
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def java_processes() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"]) if "kafka.Kafka" in (p.info["cmdline"] or [])}


# ---- the session's broker: what every test stands on ----------------------------------------------------


def test_the_first_offset_written_since_a_time_is_found_and_a_time_after_every_record_gives_the_end(
    kafka: KafkaConfig, unique_prefix
):
    topic = unique_prefix() + "0001"
    ensure_topics(kafka, {topic: 1})
    producer = Producer(kafka.client())
    base = int(time.time() * 1000) - 60_000
    for i in range(10):  # five records a minute ago, five made 30 s later
        producer.produce(topic, value=b"%d" % i, partition=0, timestamp=base + (30_000 if i >= 5 else i))
    assert producer.flush(10) == 0
    ends = EndOffsets(kafka)
    assert ends.first_at((topic, 0), base + 10_000) == 5
    assert ends.first_at((topic, 0), base) == 0
    assert ends.first_at((topic, 0), base + 40_000) == 10


def test_end_offsets_see_the_last_record_of_the_last_batch(kafka: KafkaConfig, unique_prefix):
    topic = unique_prefix() + "0001"
    ensure_topics(kafka, {topic: 1})
    producer = Producer(kafka.client(**{"linger.ms": 50}))
    for i in range(500):
        producer.produce(topic, key=b"k", value=b"%d" % i, partition=0)
    assert producer.flush(10) == 0
    ends = EndOffsets(kafka)
    assert ends([(topic, 0)]) == {(topic, 0): (0, 500)}
    assert ends([(topic, 0)]) == {(topic, 0): (0, 500)}
    for _ in range(7):
        producer.produce(topic, key=b"k", value=b"x", partition=0)
    producer.flush(10)
    assert ends([(topic, 0)])[(topic, 0)] == (0, 507)


def test_a_record_produced_is_read_back_by_a_consumer_group_within_seconds(kafka: KafkaConfig, unique_prefix):
    topic = unique_prefix() + "roundtrip"
    ensure_topics(kafka, {topic: PARTITIONS})
    sender = Deliveries(kafka.bootstrap)
    sender.send(topic, range(100))
    assert sender.flush() == 0 and sender.errors == []
    consumer = Consumer(kafka.client(**{"group.id": topic, "auto.offset.reset": "earliest"}))
    started = time.monotonic()
    consumer.subscribe([topic])
    values: list[int] = []
    try:
        while len(values) < 100 and time.monotonic() - started < 20:
            values += [int(m.value()) for m in consumer.consume(100, 0.5) if not m.error()]
    finally:
        consumer.close()
    assert sorted(values) == list(range(100))
    # The group's first join is not held back (group.initial.rebalance.delay.ms=0): seconds, not ~23 s.
    assert time.monotonic() - started < 10


def test_a_topic_nobody_created_is_not_created_by_a_producer(kafka: KafkaConfig, unique_prefix):
    topic = unique_prefix() + "never-made"
    producer = Producer(kafka.client(**{"message.timeout.ms": "2000"}))
    failed: list[KafkaError] = []
    producer.produce(topic, b"x", on_delivery=lambda err, _: failed.append(err))
    producer.flush(10)
    assert failed and failed[0] is not None
    assert topic not in topics(kafka.bootstrap)


def test_a_missing_broker_is_named_with_a_hint():
    with pytest.raises(BrokerError, match=r"127\.0\.0\.1:1 did not answer within 1 s.*--bootstrap"):
        wait_for_kafka("127.0.0.1:1", timeout=1)


# ---- incidents ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_restarted_broker_keeps_every_acknowledged_record_and_the_producers_id(broker, unique_prefix, kill):
    topic = unique_prefix() + "restart"
    sender = filled(broker.bootstrap, topic, 10_000)
    port = broker.port
    outage = broker.restart(kill=kill)
    # The same idempotent producer goes on after the restart: the broker still knows its id and sequences.
    sender.send(topic, range(10_000, 20_000))
    assert sender.flush() == 0
    assert sender.errors == []
    assert sorted(read_all(broker.bootstrap, topic, 20_000)) == list(range(20_000))  # none lost, none twice
    assert broker.port == port
    assert outage.kind == ("kill" if kill else "restart") and outage.kept_data
    assert outage.down_ms <= outage.up_ms and broker.outages[-1] == outage


def test_a_broker_that_lost_its_data_comes_back_empty_and_an_old_producer_sends_once_topics_exist(
    broker, unique_prefix
):
    topic = unique_prefix() + "lost"
    sender = filled(broker.bootstrap, topic, 300, **{"message.timeout.ms": "3000"})
    outage = broker.restart(kill=True, lose_data=True)
    assert not outage.kept_data
    assert topic not in topics(broker.bootstrap)
    # Nothing creates the topic again by itself: what the old producer sends now times out.
    sender.send(topic, range(300, 400))
    sender.flush()
    assert len(sender.acked) == 300 and {e.code() for e in sender.errors} == {KafkaError._MSG_TIMED_OUT}
    # Made again, the topic starts empty, and the producer that lived through the loss delivers to it.
    kafka = KafkaConfig(broker.bootstrap)
    ensure_topics(kafka, {topic: PARTITIONS})
    assert set(EndOffsets(kafka)([(topic, p) for p in range(PARTITIONS)]).values()) == {(0, 0)}
    sender.errors.clear()
    sender.send(topic, range(400, 450))
    assert sender.flush() == 0 and sender.errors == []
    assert sorted(read_all(broker.bootstrap, topic, 50)) == list(range(400, 450))


def test_a_paused_broker_holds_deliveries_until_it_resumes(broker, unique_prefix):
    topic = unique_prefix() + "pause"
    sender = filled(broker.bootstrap, topic, 1000)
    broker.pause()
    broker.pause()  # idempotent
    assert broker.paused
    sender.send(topic, range(1000, 2000))
    assert sender.flush(1.5) > 0  # nothing is answered while frozen
    assert len(sender.acked) == 1000
    outage = broker.resume()
    assert broker.resume() is None
    assert sender.flush() == 0 and sender.errors == []
    assert sorted(read_all(broker.bootstrap, topic, 2000)) == list(range(2000))
    assert isinstance(outage, Outage) and outage.kind == "pause" and outage.duration_s >= 1.5


def test_a_broker_started_again_on_its_data_dir_has_its_topics_and_records(tmp_path: Path, unique_prefix):
    topic = unique_prefix() + "kept"
    with KafkaBroker(data_dir=tmp_path / "kafka") as first:
        filled(first.bootstrap, topic, 500)
        cluster_id = first.cluster_id
    assert (tmp_path / "kafka" / "node-1" / "data").is_dir()  # kept after stop
    with KafkaBroker(data_dir=tmp_path / "kafka") as second:
        assert second.cluster_id == cluster_id
        assert topic in topics(second.bootstrap)
        assert sorted(read_all(second.bootstrap, topic, 500)) == list(range(500))


# ---- nothing left behind --------------------------------------------------------------------------------


def test_a_stopped_broker_leaves_no_process_port_or_temporary_directory():
    before = descendants()
    broker = KafkaBroker().start()
    started = descendants() - before
    assert len(started) == 2  # the watchdog and the JVM
    data_dir, port = broker.data_dir, broker.port
    assert data_dir is not None and data_dir.is_dir()
    broker.pause()
    broker.stop()  # paused: resumed first
    assert not broker.paused and broker.outages[-1].kind == "pause"
    assert still_running(started, timeout=0) == set()
    assert not listening(port)
    assert not data_dir.exists()


OWNER = """
import sys, time
from pathlib import Path
from sotw.broker import KafkaBroker
broker = KafkaBroker(data_dir=Path(sys.argv[1])).start()
broker.pause()
print(broker.bootstrap, flush=True)
time.sleep(600)
"""


def test_the_jvm_dies_with_the_process_that_started_it(tmp_path: Path):
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "kafka")], stdout=subprocess.PIPE, text=True
    )
    try:
        bootstrap = owner.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        children = {p.pid for p in psutil.Process(owner.pid).children(recursive=True)}
        assert len(children) == 2  # the watchdog and the (paused) JVM
        os.kill(owner.pid, signal.SIGKILL)  # no clean-up runs
        owner.wait(5)
        assert still_running(children) == set()
        assert not listening(int(bootstrap.split(":")[1]))
    finally:
        owner.kill()
        owner.wait()


def test_sotw_broker_prints_its_address_and_stops_on_sigterm_leaving_no_process():
    proc = subprocess.Popen(
        [sys.executable, "-m", "sotw", "broker"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("broker ready: --bootstrap 127.0.0.1:")
        address = line.split()[-1]
        storage = proc.stdout.readline()
        assert storage.startswith("storage: ") and "(temporary, removed when it stops)" in storage
        data_dir = Path(storage.split()[1])
        wait_for_kafka(address, timeout=5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == 2  # the watchdog and the JVM
        proc.terminate()
        assert proc.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=2)
        assert alive == []
        assert not listening(int(address.split(":")[1]))
        assert not data_dir.exists()
    finally:
        proc.kill()
        proc.wait()


# ---- start-up failures: named with the fix, nothing half-started ----------------------------------------


def refused(match: str, **config) -> BrokerError:
    """Start a broker that must fail with ``match``; check that it left no process and no JVM behind."""
    before, jvms = descendants(), java_processes()
    with pytest.raises(BrokerError, match=match) as caught:
        KafkaBroker(**config).start()
    assert still_running(descendants() - before) == set()
    assert java_processes() - jvms == set()
    return caught.value


def test_a_taken_port_is_refused(broker):
    refused(f"port {broker.port} on 127.0.0.1 is taken; choose another with --port", port=broker.port)


def test_no_java_is_named_with_how_to_install_it():
    refused(r"no Java runtime: 'no-such-java' is not on PATH; install Java 17 or newer", java="no-such-java")


def test_a_java_older_than_17_is_refused_naming_its_version(tmp_path: Path):
    old = tmp_path / "java"
    old.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    old.chmod(0o755)
    refused(r"is Java 11; Apache Kafka needs Java 17 or newer", java=str(old))


def test_a_data_dir_of_another_cluster_is_refused_before_any_jvm_starts(tmp_path: Path):
    with KafkaBroker(data_dir=tmp_path / "kafka") as first:
        cluster_id = first.cluster_id
    other = new_cluster_id()
    refused(
        f"formatted for cluster id {cluster_id}, not {other}; use another --data-dir",
        data_dir=tmp_path / "kafka",
        cluster_id=other,
    )
    refused(
        r"holds a cluster of 1 node\(s\), not 3: start it with --nodes 1",
        data_dir=tmp_path / "kafka",
        nodes=3,
    )


def test_a_directory_that_is_not_a_brokers_is_refused(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    refused(r"is not empty and not a sotw Kafka data directory", data_dir=tmp_path)


def test_a_setting_kafka_refuses_is_named_from_its_log_when_the_storage_is_formatted():
    error = refused(
        r"formatting node 1's storage .* failed \(exit code 1\); the end of .*server\.log",
        overrides={"log.retention.bytes": "lots"},
    )
    assert "Invalid value lots for configuration log.retention.bytes" in str(error)


def test_a_node_that_exits_while_starting_is_named_with_the_end_of_its_log():
    error = refused(
        r"Kafka node 1 exited with code 1 while starting; the end of .*server\.log",
        overrides={"authorizer.class.name": "no.such.Authorizer"},
    )
    assert "ClassNotFoundException: no.such.Authorizer" in str(error)


def test_a_node_that_never_becomes_ready_is_stopped_and_its_log_quoted():
    refused(
        r"Kafka node 1 did not become ready within 0\.5 s; the end of .*server\.log:\n", start_timeout=0.5
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"nodes": 0}, "nodes must be a whole number from 1 to 9, got 0"),
        ({"port": 70000}, "port must be from 0"),
        ({"cluster_id": "-bad"}, "cluster_id must be 22 URL-safe base64 characters"),
        ({"heap_mb": 64}, "heap_mb must be a whole number of MiB >= 128, got 64"),
        ({"overrides": {"node.id": "7"}}, "overrides may not set 'node.id'"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(config, message):
    with pytest.raises(BrokerError, match=message):
        KafkaBroker(**config)
