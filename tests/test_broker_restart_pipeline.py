"""The whole system across a broker crash: a backlog written by the simulator survives a SIGKILL of the Kafka
broker and its restart, and the pipeline drains it into the same output as from a broker never restarted."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import query
from pipeline.config import PipelineConfig
from pipeline.inspect import read_dataset
from pipeline.policies import PolicyConfig
from simulator import Simulator, SimulatorConfig
from sotw.broker import KafkaBroker
from sotw.kafka import KafkaConfig, topic_pattern

pytestmark = pytest.mark.system  # a broker of its own and Spark


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


@pytest.mark.slow  # over 20 s on CI: the nightly job runs it (make test-slow)
def test_a_backlog_on_a_killed_and_restarted_broker_drains_to_the_same_output_as_on_one_never_restarted(
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
    steady = Simulator(config, kafka, tmp_path / "steady" / "run").run()
    reference = drain(spark, kafka, config.topic_prefix, tmp_path / "steady")

    with KafkaBroker() as broker:
        crashed = KafkaConfig(broker.bootstrap)
        on_crashed = Simulator(config, crashed, tmp_path / "crashed" / "run").run()
        assert on_crashed.stats.acked == steady.stats.acked > 0
        assert on_crashed.unacknowledged == steady.unacknowledged == 0
        broker.restart(kill=True)
        assert drain(spark, crashed, config.topic_prefix, tmp_path / "crashed") == reference
    assert reference["sessions"] and reference["changes"]
    assert reference["integrity"] == [] and reference["dead_letters"] == []
