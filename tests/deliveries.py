"""An idempotent producer that counts what the broker acknowledged, and a reader of everything in a topic,
for tests that check that an incident loses or repeats nothing."""

import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from simulator.config import DEFAULT_PRODUCER
from sotw.kafka import KafkaConfig, ensure_topics

PARTITIONS = 3


class Deliveries:
    """An idempotent producer with the simulator's settings that counts acknowledgements and errors."""

    def __init__(self, bootstrap: str, **overrides: str) -> None:
        self.acked: list[int] = []
        self.errors: list[KafkaError] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, **DEFAULT_PRODUCER, **overrides})

    def _done(self, err: KafkaError | None, msg) -> None:
        if err is None:
            self.acked.append(int(msg.value()))
        else:
            self.errors.append(err)

    def send(self, topic: str, values: range) -> None:
        for i in values:
            self.producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS, on_delivery=self._done)
            self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> int:
        return self.producer.flush(timeout)


def read_all(bootstrap: str, topic: str, want: int, timeout: float = 20.0) -> list[int]:
    """Every value in ``topic`` read by assign from offset 0 (no group), waiting for ``want`` of them."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < want and time.monotonic() < deadline:
            values += [int(m.value()) for m in consumer.consume(10_000, 0.2) if not m.error()]
        values += [int(m.value()) for m in consumer.consume(10_000, 0.5) if not m.error()]  # nothing more
    finally:
        consumer.close()
    return values


def filled(bootstrap: str, topic: str, records: int, **overrides: str) -> Deliveries:
    """Create ``topic`` and produce values ``0..records-1`` to it, all acknowledged; return the producer."""
    ensure_topics(KafkaConfig(bootstrap), {topic: PARTITIONS})
    sender = Deliveries(bootstrap, **overrides)
    sender.send(topic, range(records))
    assert sender.flush() == 0 and sender.errors == []
    return sender
