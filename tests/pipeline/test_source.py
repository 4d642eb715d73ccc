"""The ``sotw-kafka`` source against a real broker and a real SparkSession, plus its offset arithmetic."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from pipeline.errors import ConfigError
from pipeline.source import FORMAT, KafkaDataSource, SourceOptions, offsets_behind, read_ranges
from pipeline.source.offsets import (
    Lag,
    OffsetRange,
    lag,
    offsets_from_json,
    offsets_to_json,
    pack_ranges,
    parse_offset_spec,
    rate_limit,
)
from pipeline.source.reading import reader_settings
from pipeline.source.rows import ARROW_BATCH_ROWS
from sotw.kafka import KafkaConfig, ensure_topics

Produced = set[tuple[str, int, int, bytes]]


def produce(kafka: KafkaConfig, topic: str, count: int, start: int = 0, linger_ms: int = 20) -> Produced:
    """Produce ``count`` JSON records to ``topic``; return (topic, partition, offset, value) of each."""
    producer = Producer(kafka.client(**{"linger.ms": linger_ms}))
    out: Produced = set()

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        out.add((msg.topic(), msg.partition(), msg.offset(), msg.value()))

    for i in range(start, start + count):
        producer.produce(
            topic, key=f"s{i % 7}".encode(), value=json.dumps({"i": i}).encode(), on_delivery=done
        )
    assert producer.flush(30) == 0
    return out


def delete_topic(kafka: KafkaConfig, topic: str) -> None:
    admin = AdminClient(kafka.client())
    for future in admin.delete_topics([topic], operation_timeout=10).values():
        future.result(10)


def stream(spark: Any, kafka: KafkaConfig, **options: str) -> Any:
    reader = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def drain(df: Any, checkpoint: Path, output: Path) -> Any:
    """Run the stream with availableNow into Parquet and return the finished query."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "availableNow query did not finish"
    finally:
        query.stop()
    return query


def rows_of(spark: Any, output: Path) -> Produced:
    if not output.exists() or not any(output.glob("*.parquet")):
        return set()
    table = spark.read.parquet(str(output)).select("topic", "partition", "offset", "value").collect()
    rows = [(r.topic, r.partition, r.offset, bytes(r.value)) for r in table]
    assert len(rows) == len(set(rows)), "some records were read twice"
    return set(rows)


def wait_for(predicate: Callable[[], bool], timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def between_triggers(query: Any) -> bool:
    """The query finished a batch and waits for its next trigger (no reader holds a consumer)."""
    return query.lastProgress is not None and not query.status["isTriggerActive"]


# ------------------------------------------------------------------------------------ offset arithmetic


def test_a_users_fetch_settings_win_over_the_readers_prefetch_limits_under_either_name() -> None:
    def settings(**kafka: str) -> dict:
        return reader_settings(
            SourceOptions.from_options(
                {
                    "kafka.bootstrap.servers": "127.0.0.1:9092",
                    "subscribe": "t",
                    **{f"kafka.{k}": v for k, v in kafka.items()},
                }
            )
        )

    default = settings()
    assert default["queued.max.messages.kbytes"] == "1024"
    assert default["fetch.message.max.bytes"] == "1048576"
    raised = settings(**{"queued.max.messages.kbytes": "16384", "max.partition.fetch.bytes": "8388608"})
    assert (
        "queued.max.messages.kbytes" not in raised
    )  # the user's own value is in the consumer's base settings
    assert "fetch.message.max.bytes" not in raised and "max.partition.fetch.bytes" not in raised
    # Correctness settings are never the user's to change.
    assert settings(**{"auto.offset.reset": "earliest"})["auto.offset.reset"] == "error"


def test_offsets_json_round_trips_in_canonical_order() -> None:
    offsets = {("b", 1): 5, ("a", 10): 3, ("a", 2): 7}
    as_json = offsets_to_json(offsets)
    assert json.dumps(as_json) == '{"a": {"2": 7, "10": 3}, "b": {"1": 5}}'
    assert offsets_from_json(json.dumps(as_json)) == offsets


def test_offset_spec_accepts_words_and_spark_json_and_names_the_option_when_bad() -> None:
    assert parse_offset_spec("startingOffsets", "Earliest", ("earliest", "latest")) == "earliest"
    assert parse_offset_spec("startingOffsets", '{"t":{"0":23,"1":-2}}', ("earliest",)) == {
        ("t", 0): 23,
        ("t", 1): -2,
    }
    with pytest.raises(ValueError, match="startingOffsets"):
        parse_offset_spec("startingOffsets", "oldest", ("earliest", "latest"))
    with pytest.raises(ValueError, match="endingOffsets"):
        parse_offset_spec("endingOffsets", '{"t":{"0":-5}}', ("latest",))


def test_rate_limit_never_exceeds_the_limit_and_shares_it_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("u", 0): 0}
    end = {("t", 0): 900, ("t", 1): 190, ("u", 0): 10, ("v", 0): 5}  # v is new: starts at 0
    capped = rate_limit(start, end, 100)
    total = sum(capped[tp] - start.get(tp, 0) for tp in capped)
    assert total == 100
    assert capped[("t", 0)] > capped[("t", 1)] - 100 > 0  # the big backlog gets the big share
    assert all(start.get(tp, 0) <= capped[tp] <= end[tp] for tp in end)
    assert rate_limit(start, end, 10_000) == end
    # A limit smaller than the number of partitions still makes progress.
    assert sum(rate_limit(start, end, 1)[tp] - start.get(tp, 0) for tp in end) == 1


def test_pack_ranges_makes_few_balanced_tasks_and_covers_every_offset_once() -> None:
    ranges = [OffsetRange(f"t{i}", 0, 0, 10 + i) for i in range(40)] + [OffsetRange("big", 0, 0, 50_000)]
    groups = pack_ranges(ranges, 2, min_split=1_000)
    assert len(groups) == 2
    loads = [sum(r.size for r in g) for g in groups]
    assert abs(loads[0] - loads[1]) <= 0.05 * sum(loads)
    covered = sorted((r.topic, o) for g in groups for r in g for o in range(r.start, r.end))
    expected = sorted((r.topic, o) for r in ranges for o in range(r.start, r.end))
    assert covered == expected
    assert pack_ranges([OffsetRange("t", 0, 5, 5)], 2) == []


def test_lag_counts_offsets_between_consumed_and_latest() -> None:
    result = lag({("t", 0): 10, ("t", 1): 50}, {("t", 0): 40, ("t", 1): 50, ("u", 0): 5})
    assert result == Lag(35, 30, 0, 35 / 3, 3)
    assert lag({}, {}) is None


def test_bad_options_are_rejected_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="subscribe and subscribePattern"):
        SourceOptions.from_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "subscribePattern": "a.*"}
        )
    with pytest.raises(ConfigError, match="maxOffsetsPerTrigger"):
        SourceOptions.from_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "maxOffsetsPerTrigger": "0"}
        )
    with pytest.raises(ConfigError, match="failOnDataLoss"):
        SourceOptions.from_options(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "failOnDataLoss": "yes"}
        )
    opts = SourceOptions.from_options(
        {"kafka.bootstrap.servers": "h:1", "subscribePattern": "s-.*", "kafka.client.id": "me"}
    )
    assert opts.kafka.settings == {"client.id": "me"}
    assert opts.matches("s-1") and not opts.matches("xs-1") and not opts.matches("s")


# ----------------------------------------------------------------------------------- against the broker


def test_format_name_is_sotw_kafka() -> None:
    assert KafkaDataSource.name() == "sotw-kafka"


def test_reads_every_record_of_several_topics_exactly_once_including_the_last_batch_tail(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str], tmp_path: Path
) -> None:
    prefix = unique_prefix()
    topics = {f"{prefix}{i}": 2 for i in range(3)}
    ensure_topics(kafka, topics)
    expected: Produced = set()
    for topic in topics:
        # Many records per producer batch, then a last batch of several records: every one is read, the
        # last batch's tail too.
        expected |= produce(kafka, topic, 500, linger_ms=50)
        expected |= produce(kafka, topic, 7, start=500, linger_ms=200)
    df = stream(spark, kafka, subscribePattern=f"{prefix}.*", startingOffsets="earliest")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    query = drain(df, tmp_path / "ckpt", tmp_path / "out")
    assert rows_of(spark, tmp_path / "out") == expected
    sample = spark.read.parquet(str(tmp_path / "out")).first()
    assert sample.key.startswith(b"s") and sample.timestampType == 0 and sample.timestamp.year >= 2024
    assert sum(p["numInputRows"] for p in query.recentProgress) == len(expected)


def test_packed_rows_hold_exactly_the_plain_rows_records_one_row_per_key_and_partition_per_batch(
    kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    topic = f"{unique_prefix()}packed"
    ensure_topics(kafka, {topic: 2})
    produced = produce(
        kafka, topic, ARROW_BATCH_ROWS + 2_500
    )  # 7 keys over 2 partitions, more than one batch
    ends = {p: max(o for _, q, o, _ in produced if q == p) + 1 for p in (0, 1)}
    ranges = [OffsetRange(topic, p, 0, end) for p, end in ends.items()]

    def read(pack: bool) -> list[Any]:
        options = {
            "kafka.bootstrap.servers": kafka.bootstrap,
            "subscribe": topic,
            "packRecords": str(pack).lower(),
        }
        return list(read_ranges(SourceOptions.from_options(options), ranges))

    plain = [
        (r["topic"], r["partition"], r["offset"], r["key"], r["value"])
        for b in read(False)
        for r in b.to_pylist()
    ]
    packed_batches = read(True)
    assert len(packed_batches) >= 2
    unpacked = []
    for batch in packed_batches:
        rows = batch.to_pylist()
        assert len({(r["topic"], r["partition"], r["key"]) for r in rows}) == len(rows)
        for r in rows:
            assert r["offsets"] == sorted(r["offsets"]) and all(ts is not None for ts in r["timestamps"])
            unpacked += [
                (r["topic"], r["partition"], o, r["key"], v)
                for o, v in zip(r["offsets"], r["values"], strict=True)
            ]
    assert sorted(unpacked) == sorted(plain) and len(set(unpacked)) == len(unpacked) == len(produced)
    assert {(t, p, o, v) for t, p, o, _, v in unpacked} == produced


def test_a_topic_that_appears_mid_query_is_read_from_its_earliest_offset(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    prefix = unique_prefix()
    first, later = f"{prefix}a", f"{prefix}b"
    ensure_topics(kafka, {first: 1})
    expected = produce(kafka, first, 20)
    name = f"discovery_{uuid.uuid4().hex[:8]}"
    df = stream(
        spark, kafka, subscribePattern=f"{prefix}.*", startingOffsets="latest", topicDiscoveryIntervalMs="500"
    )
    query = df.writeStream.format("memory").queryName(name).trigger(processingTime="500 milliseconds").start()
    try:
        wait_for(lambda: query.lastProgress is not None, what="the first trigger")
        expected = produce(kafka, first, 5, start=20)  # startingOffsets=latest: only these of the first topic
        ensure_topics(kafka, {later: 2})
        # Records produced before the query sees the topic must still be read: it starts at earliest.
        expected |= produce(kafka, later, 30)

        def seen() -> Produced:
            rows = spark.table(name).select("topic", "partition", "offset", "value").collect()
            return {(r.topic, r.partition, r.offset, bytes(r.value)) for r in rows}

        wait_for(lambda: seen() >= expected, what="records of the new topic")
        assert query.isActive
    finally:
        query.stop()
    rows = spark.table(name).collect()
    assert len(rows) == len(expected) and seen() == expected


def test_starting_offsets_latest_reads_only_new_records_and_a_restart_continues_from_the_checkpoint(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str], tmp_path: Path
) -> None:
    topic = unique_prefix() + "x"
    ensure_topics(kafka, {topic: 2})
    produce(kafka, topic, 50)
    df = stream(spark, kafka, subscribe=topic, startingOffsets="latest")
    drain(df, tmp_path / "ckpt", tmp_path / "out")
    assert rows_of(spark, tmp_path / "out") == set()
    new = produce(kafka, topic, 9, start=50)
    drain(df, tmp_path / "ckpt", tmp_path / "out")
    assert rows_of(spark, tmp_path / "out") == new


def test_starting_offsets_json_starts_each_partition_where_told(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str], tmp_path: Path
) -> None:
    topic = unique_prefix() + "j"
    ensure_topics(kafka, {topic: 2})
    records = produce(kafka, topic, 60)
    spec = json.dumps({topic: {"0": 3, "1": -2}})
    drain(stream(spark, kafka, subscribe=topic, startingOffsets=spec), tmp_path / "ckpt", tmp_path / "out")
    assert rows_of(spark, tmp_path / "out") == {r for r in records if r[1] == 1 or r[2] >= 3}


def test_batch_read_returns_the_records_between_starting_and_ending_offsets(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    topic = unique_prefix() + "batch"
    ensure_topics(kafka, {topic: 1})
    records = produce(kafka, topic, 40)
    df = (
        spark.read.format(FORMAT)
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 10}}))
        .option("endingOffsets", json.dumps({topic: {"0": 25}}))
        .load()
    )
    got = {(r.topic, r.partition, r.offset, bytes(r.value)) for r in df.collect()}
    assert got == {r for r in records if 10 <= r[2] < 25}


def test_max_offsets_per_trigger_splits_a_backlog_into_bounded_batches_and_reports_lag(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str], tmp_path: Path
) -> None:
    prefix = unique_prefix()
    ensure_topics(kafka, {f"{prefix}0": 2, f"{prefix}1": 1})
    expected = produce(kafka, f"{prefix}0", 700) | produce(kafka, f"{prefix}1", 300)
    df = stream(
        spark, kafka, subscribePattern=f"{prefix}.*", startingOffsets="earliest", maxOffsetsPerTrigger="300"
    )
    query = drain(df, tmp_path / "ckpt", tmp_path / "out")
    assert rows_of(spark, tmp_path / "out") == expected
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [300, 300, 300, 100]
    lags = [offsets_behind(p["sources"][0]) for p in batches]
    assert [x.offsetsBehindLatest for x in lags if x is not None] == [700, 400, 100, 0]
    assert lags[0] is not None and 0 < lags[0].maxOffsetsBehindLatest <= 700 and lags[0].partitions == 3


def test_deleted_topic_with_unread_data_stops_the_query_naming_topic_partition_and_offsets(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    topic = unique_prefix() + "gone"
    ensure_topics(kafka, {topic: 1})
    produce(kafka, topic, 500)
    name = f"loss_{uuid.uuid4().hex[:8]}"
    df = stream(spark, kafka, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    query = df.writeStream.format("memory").queryName(name).trigger(processingTime="4 seconds").start()
    try:
        wait_for(lambda: between_triggers(query), what="the first batch")
        # Between triggers no reader holds the topic: delete it with 400 records not yet read.
        delete_topic(kafka, topic)
        with pytest.raises(Exception) as failure:  # noqa: B017 (StreamingQueryException wraps the cause)
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(failure.value)
    found = re.search(
        rf"DataLossError: Kafka data lost: topic '{topic}' partition 0 offsets \[(\d+), 500\)", message
    )
    assert found is not None, message
    assert int(found.group(1)) in (100, 200, 300, 400)  # however many batches ran before the deletion
    assert "set failOnDataLoss=false" in message


def test_without_fail_on_data_loss_a_deleted_topic_is_skipped_and_its_recreation_is_read(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    topic = unique_prefix() + "reborn"
    ensure_topics(kafka, {topic: 1})
    produce(kafka, topic, 500)
    name = f"noloss_{uuid.uuid4().hex[:8]}"
    df = stream(
        spark,
        kafka,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="100",
        failOnDataLoss="false",
        topicDiscoveryIntervalMs="0",
    )
    query = df.writeStream.format("memory").queryName(name).trigger(processingTime="4 seconds").start()
    try:
        wait_for(lambda: between_triggers(query), what="the first batch")
        delete_topic(kafka, topic)
        wait_for(lambda: len(query.recentProgress) >= 2, what="a trigger after the deletion")
        ensure_topics(kafka, {topic: 1})
        reborn = produce(kafka, topic, 12, start=1000)
        wait_for(
            lambda: spark.table(name).where("cast(value as string) like '%: 10__}'").count() == 12,
            what="records of the recreated topic",
        )
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    rows = {(r.topic, r.partition, r.offset, bytes(r.value)) for r in spark.table(name).collect()}
    assert reborn <= rows
    # Whole batches of the old topic (however many ran before the deletion), then all of the new one.
    old = sorted(offset for _, _, offset, _ in rows - reborn)
    assert old == list(range(len(old))) and len(old) in (100, 200, 300, 400)


def test_a_topic_recreated_after_it_was_fully_read_is_data_loss_unless_told_otherwise(
    spark: Any, kafka: KafkaConfig, unique_prefix: Callable[[], str], tmp_path: Path
) -> None:
    # A partition that starts again below the query's position may have lost records the query never saw
    # (a broker that lost its data looks the same), so failOnDataLoss stops the query, as Spark's source does.
    topic = unique_prefix() + "again"
    ensure_topics(kafka, {topic: 1})
    produce(kafka, topic, 80)
    drain(
        stream(spark, kafka, subscribe=topic, startingOffsets="earliest"), tmp_path / "ckpt", tmp_path / "out"
    )
    delete_topic(kafka, topic)
    ensure_topics(kafka, {topic: 1})
    fresh = produce(kafka, topic, 10, start=5000)
    strict = stream(spark, kafka, subscribe=topic, startingOffsets="earliest")
    with pytest.raises(
        Exception, match=rf"topic '{topic}' partition 0 offsets from 80 on .* reset and now ends at 10"
    ):
        drain(strict, tmp_path / "ckpt", tmp_path / "out")
    tolerant = stream(spark, kafka, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false")
    drain(tolerant, tmp_path / "ckpt", tmp_path / "out")
    rows = rows_of(spark, tmp_path / "out")
    assert fresh <= rows and len(rows) == 90


@pytest.fixture
def frozen_broker() -> Any:
    """A broker of the test's own that the test can freeze (SIGSTOP) and thaw, as a hung broker would be."""
    from sotw.broker import KafkaBroker

    with KafkaBroker() as broker:

        def freeze(frozen: bool) -> None:
            if frozen:
                broker.pause()
            else:
                broker.resume()

        yield KafkaConfig(broker.bootstrap), freeze


@pytest.mark.system  # waits on a broker of its own, or on none
def test_a_broker_that_does_not_answer_is_not_taken_for_deleted_data(frozen_broker) -> None:
    from pipeline.source.broker import GONE, UNKNOWN, partition_state

    kafka, freeze = frozen_broker
    topic = f"frozen-{uuid.uuid4().hex[:6]}"
    ensure_topics(kafka, {topic: 1})
    produce(kafka, topic, 5)
    options = SourceOptions.from_options({"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic})
    freeze(True)
    assert partition_state(options, (topic, 0), timeout=1.0) == UNKNOWN
    freeze(False)
    assert partition_state(options, (topic, 0), timeout=10.0) == (0, 5)
    assert partition_state(options, (topic, 7), timeout=10.0) == GONE


@pytest.mark.system  # waits on a broker of its own, or on none
def test_the_driver_waits_out_a_frozen_broker_instead_of_failing_the_query(
    frozen_broker, monkeypatch
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pipeline.source import broker
    from pipeline.source.planning import KafkaStreamReader
    from sotw.errors import BrokerError

    kafka, freeze = frozen_broker
    topic = f"frozen-{uuid.uuid4().hex[:6]}"
    ensure_topics(kafka, {topic: 1})
    produce(kafka, topic, 5)
    monkeypatch.setattr(broker, "METADATA_TIMEOUT_S", 1.0)  # each look at the frozen broker gives up sooner
    options = SourceOptions.from_options(
        {
            "kafka.bootstrap.servers": kafka.bootstrap,
            "subscribe": topic,
            "kafkaConsumer.pollTimeoutMs": "5000",
        }
    )
    reader = KafkaStreamReader(options)
    start = reader.initialOffset()
    freeze(True)
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # no new offsets, no failure
    time.sleep(4.5)
    with pytest.raises(BrokerError, match="has not answered for .* more than kafkaConsumer.pollTimeoutMs"):
        reader.latestOffset(start, ReadAllAvailable())
    freeze(False)
    produce(kafka, topic, 3, start=5)
    assert offsets_from_json(reader.latestOffset(start, ReadAllAvailable())) == {(topic, 0): 8}
