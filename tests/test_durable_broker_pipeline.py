"""The whole system on the durable embedded broker: a backlog written by the simulator survives a broker
restart, and the pipeline drains it into the same output as on the memory broker."""

from __future__ import annotations

from pathlib import Path

from pipeline import query
from pipeline.config import PipelineConfig
from pipeline.inspect import read_dataset
from pipeline.policies import PolicyConfig
from simulator import Simulator, SimulatorConfig
from sotw.broker import EmbeddedBroker
from sotw.kafka import KafkaConfig, topic_pattern


def drain(spark, kafka: KafkaConfig, prefix: str, where: Path) -> dict[str, list[tuple]]:
    """Run the pipeline once over everything on the broker; its outputs without batch- or clock-dependent
    columns (batch ids, dates and every ``*_ms`` time)."""
    config = PipelineConfig(
        kafka=kafka,
        output=where / "output",
        checkpoint=where / "checkpoint",
        pattern=topic_pattern(prefix),
        policy=PolicyConfig("ordered"),
        trigger_ms=None,  # availableNow
        discovery_interval_ms=0,
    )
    query.run(spark, config)
    out = {}
    for name in ("changes", "sessions", "integrity", "dead_letters"):
        table = read_dataset(config.output, name)
        rows = [] if table is None else table.to_pylist()
        out[name] = sorted(
            tuple(
                sorted(
                    (k, v) for k, v in r.items() if k not in ("batch_id", "date") and not k.endswith("_ms")
                )
            )
            for r in rows
        )
    return out


def test_a_backlog_on_a_restarted_durable_broker_drains_to_the_same_output_as_on_memory(
    spark, kafka, tmp_path, unique_prefix
):
    # A fixed number of messages sent as fast as the broker takes them: the same messages on both brokers.
    config = SimulatorConfig(
        sensors=3,
        rows=20,
        partitions=2,
        rate=0.0,
        duration_s=None,
        max_messages=3000,
        session_interval_s=0.4,
        topic_prefix=unique_prefix(),
        seed=13,
    )
    # Same run directory name on both: it is mixed into every session id.
    on_memory = Simulator(config, kafka, tmp_path / "memory" / "run").run()
    reference = drain(spark, kafka, config.topic_prefix, tmp_path / "memory")

    with EmbeddedBroker(durable=True, stop_grace_s=1.0) as broker:
        durable = KafkaConfig(broker.bootstrap)
        on_durable = Simulator(config, durable, tmp_path / "durable" / "run").run()
        assert on_durable.stats.acked == on_memory.stats.acked > 0
        assert on_durable.unacknowledged == on_memory.unacknowledged == 0
        broker.restart(kill=True)
        assert drain(spark, durable, config.topic_prefix, tmp_path / "durable") == reference
    assert reference["sessions"] and reference["changes"]
    assert reference["integrity"] == [] and reference["dead_letters"] == []
