"""A three-node Apache Kafka cluster on this machine: one bootstrap, replication factor 3 with two in sync
required, and a node killed and started again with leadership moving and the replicas catching up."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import ConfigResource

from simulator import Simulator, SimulatorConfig
from sotw.broker import KafkaBroker
from sotw.kafka import KafkaConfig, ensure_topics
from tests.deliveries import filled, read_all

pytestmark = pytest.mark.system  # a three-node cluster of its own


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaBroker]:
    with KafkaBroker(nodes=3) as cluster:
        yield cluster


def test_one_bootstrap_names_all_three_nodes_and_the_simulators_topics_get_three_replicas_in_sync(
    cluster, tmp_path, unique_prefix
):
    assert len(cluster.bootstrap.split(",")) == 3 and cluster.node_ids == [1, 2, 3]
    assert set(cluster.pids) == {"kafka-1", "kafka-2", "kafka-3"}
    kafka = KafkaConfig(cluster.bootstrap)
    config = SimulatorConfig(
        sensors=2, rows=10, partitions=3, rate=0.0, duration_s=None, max_messages=300,
        topic_prefix=unique_prefix(), seed=3,
    )  # fmt: skip
    summary = Simulator(config, kafka, tmp_path / "run").run()
    # Idempotent, acks=all: every message on two replicas at least before it was acknowledged.
    assert summary.stats.acked == summary.stats.sent >= 300 and summary.unacknowledged == 0
    admin = cluster.admin()
    meta = admin.list_topics(timeout=10)
    mine = {name: t for name, t in meta.topics.items() if name.startswith(config.topic_prefix)}
    assert len(mine) == 2
    for topic in mine.values():
        for partition in topic.partitions.values():
            assert sorted(partition.replicas) == [1, 2, 3]
            assert sorted(partition.isrs) == [1, 2, 3]
    described = admin.describe_configs([ConfigResource("topic", next(iter(mine)))])
    configs = next(iter(described.values())).result(timeout=10)
    assert configs["min.insync.replicas"].value == "2"


def test_a_killed_leader_hands_its_partitions_over_and_catches_up_when_it_comes_back(cluster, unique_prefix):
    topic = unique_prefix() + "failover"
    ensure_topics(KafkaConfig(cluster.bootstrap), {topic: 6})
    sender = filled(cluster.bootstrap, topic, 3000)
    leader = cluster.busiest_leader([topic])
    assert cluster.leader_counts([topic])[leader] >= 2
    cluster.kill_node(leader)
    cluster.check_alive()  # a node stopped on purpose is not a failure
    deadline = time.monotonic() + 30
    while cluster.leader_counts([topic])[leader] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.leader_counts([topic])[leader] == 0  # the others lead everything
    assert cluster.under_replicated([topic])  # two replicas in sync of three
    # min.insync.replicas=2: acks=all still succeeds with one node down, nothing lost.
    sender.send(topic, range(3000, 4000))
    assert sender.flush() == 0 and sender.errors == []
    cluster.start_node(leader)
    assert cluster.wait_replicated(60, [topic]) >= 0
    assert cluster.under_replicated([topic]) == []
    assert sorted(read_all(cluster.bootstrap, topic, 4000)) == list(range(4000))


def test_a_frozen_node_leaves_the_isr_and_the_metadata_keeps_answering_while_it_is_frozen(
    cluster, unique_prefix
):
    topic = unique_prefix() + "frozen"
    ensure_topics(KafkaConfig(cluster.bootstrap), {topic: 6})
    frozen = cluster.busiest_leader([topic])
    cluster.pause(frozen)
    try:
        slowest, out_at = 0.0, None
        started = time.monotonic()
        while out_at is None and time.monotonic() - started < 45:
            asked = time.monotonic()
            states = cluster.partitions([topic])
            slowest = max(slowest, time.monotonic() - asked)
            if all(frozen not in p.isr for p in states):
                out_at = time.monotonic() - started
            time.sleep(0.2)
        # Fenced after the broker session timeout (9 s), seen at once: no request waits on the frozen node.
        assert out_at is not None and out_at < 30, f"node {frozen} still in the ISR after 45 s"
        assert slowest < 5, f"one look at the metadata took {slowest:.1f} s"
    finally:
        cluster.resume()
    assert cluster.wait_replicated(60, [topic]) >= 0
