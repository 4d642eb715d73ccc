import subprocess
import sys

import psutil
import pytest
from confluent_kafka import Producer

from sotw.broker import EmbeddedBroker, port_in_use, wait_for_kafka
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets, KafkaConfig, ensure_topics


def test_end_offsets_see_the_last_record_of_the_last_batch(kafka: KafkaConfig, unique_prefix):
    topic = unique_prefix() + "0001"
    ensure_topics(kafka, {topic: 1})
    producer = Producer(kafka.client(**{"linger.ms": 50}))
    for i in range(500):
        producer.produce(topic, key=b"k", value=b"%d" % i, partition=0)
    assert producer.flush(10) == 0
    ends = EndOffsets(kafka)
    assert ends([(topic, 0)]) == {(topic, 0): (0, 500)}
    # Unchanged watermark: served from memory, still right.
    assert ends([(topic, 0)]) == {(topic, 0): (0, 500)}
    for _ in range(7):
        producer.produce(topic, key=b"k", value=b"x", partition=0)
    producer.flush(10)
    assert ends([(topic, 0)])[(topic, 0)] == (0, 507)


def test_a_missing_broker_is_named_with_a_hint():
    with pytest.raises(BrokerError, match=r"127\.0\.0\.1:1 did not answer within 1 s.*--bootstrap"):
        wait_for_kafka("127.0.0.1:1", timeout=1)


def test_a_taken_port_is_refused(bootstrap: str):
    host, port = bootstrap.split(":")
    if not port_in_use(host, int(port)):
        pytest.skip("external broker")
    with pytest.raises(BrokerError, match=f"port {port} .* is taken"):
        EmbeddedBroker(port=int(port)).start()


@pytest.mark.parametrize("flags", [[], ["--durable"]], ids=["memory", "durable"])
def test_sotw_broker_prints_its_address_and_stops_on_sigterm_leaving_no_process(flags):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sotw", "broker", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("broker ready: --bootstrap 127.0.0.1:")
        address = line.split()[-1]
        storage = proc.stdout.readline()
        assert storage.startswith("storage: s3://" if flags else "storage: memory://")
        wait_for_kafka(address, timeout=5)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) == (3 if flags else 2)  # watchdog, Tansu and, when durable, the S3 server
        proc.terminate()
        assert proc.wait(10) == 0
        _, alive = psutil.wait_procs(children, timeout=2)
        assert alive == []
        host, port = address.split(":")
        assert not port_in_use(host, int(port))
    finally:
        proc.kill()
        proc.wait()
