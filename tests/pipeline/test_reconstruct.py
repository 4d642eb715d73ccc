"""The stateful step in a real streaming query: a Parquet file-stream source of Kafka-shaped rows.

Spark's own Kafka rows (one per message) take the same path as the sotw-kafka source's packed rows; the
end-to-end tests in ``test_pipeline`` cover the packed shape.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.placement import placement_partitions
from pipeline.policies import PolicyConfig
from pipeline.reconstruct import NO_DATA_BATCHES, reconstruct
from pipeline.records import from_blocks
from sotw.wire import encode_end, encode_snapshot, encode_update, table_digest

KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
TOPIC = "sensor-a"


def session_values(session: str, n_updates: int = 6) -> tuple[list[bytes], str]:
    """A fault-free session: snapshot, upserts and a delete, end; returns the values and the true digest."""
    table = {i: {"id": i, "temp": 20.0 + i, "label": f"r{i}"} for i in range(4)}
    values = [encode_snapshot("sensor-a", session, 0, 1_000, list(table.values()))]
    seq = 1
    for i in range(n_updates):
        row = {"id": i % 5, "temp": 30.5 + i, "label": f"u{i}"}
        table[row["id"]] = row
        values.append(encode_update("sensor-a", session, seq, 1_000 + seq, "upsert", row))
        seq += 1
    del table[0]
    values.append(encode_update("sensor-a", session, seq, 1_000 + seq, "delete", {"id": 0}))
    seq += 1
    digest = table_digest(table.values())
    values.append(encode_end("sensor-a", session, seq, 1_000 + seq, len(table), digest))
    return values, digest


def write_rows(
    directory: Path, name: str, rows: list[tuple[bytes | None, bytes, int, int]], topic: str = TOPIC
) -> None:
    """Write (key, value, partition, offset) rows of ``topic`` as one Parquet file, in the order given."""
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "topic": pa.array([topic] * len(rows), pa.string()),
            "partition": pa.array([r[2] for r in rows], pa.int32()),
            "offset": pa.array([r[3] for r in rows], pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * len(rows), pa.timestamp("us", tz="UTC")),
        }
    )
    tmp = directory / f".{name}.tmp"
    pq.write_table(table, tmp)
    tmp.rename(directory / f"{name}.parquet")


def run_once(
    spark: Any, source: Path, out: Path, checkpoint: Path, policy: PolicyConfig, transform: Any = None
) -> None:
    """Drain everything in ``source`` with an availableNow trigger into a Parquet sink.

    ``transform`` (the stream to the record blocks) defaults to ``reconstruct`` under ``policy``.

    Processing-time timeouts make Spark run a no-data batch every trigger, so an availableNow query would
    never finish: the query is started with no-data batches off (timeouts then fire in batches with data).
    """
    stream = spark.readStream.schema(KAFKA_SCHEMA).parquet(str(source))
    spark.conf.set(NO_DATA_BATCHES, "false")
    blocks = (
        transform(stream)
        if transform
        else reconstruct(stream, policy, placement_partitions(spark, checkpoint))
    )
    query = (
        blocks.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    spark.conf.unset(NO_DATA_BATCHES)
    try:
        query.awaitTermination(180)
    finally:
        query.stop()


def records(spark: Any, out: Path, kind: str) -> list[dict[str, Any]]:
    """The records of one kind in the blocks the query wrote (nothing before its first batch)."""
    if not out.is_dir() or not any(out.glob("*.parquet")):
        return []
    blocks = [r["block"] for r in spark.read.parquet(str(out)).select("block").collect()]
    return [r for r in from_blocks(blocks).to_pylist() if r["record"] == kind]


def test_rows_of_a_group_are_applied_in_offset_order_whatever_order_spark_hands_them_over(spark, tmp_path):
    values_a, digest_a = session_values("sess-a")
    values_b, digest_b = session_values("sess-b", n_updates=9)
    rows_a = [(b"sess-a", v, 0, 100 + i) for i, v in enumerate(values_a)]
    rows_b = [(b"sess-b", v, 1, 200 + i) for i, v in enumerate(values_b)]
    source = tmp_path / "in"
    # Reversed and split over two files: strict would stop at the first seq out of order if not sorted.
    write_rows(source, "part-1", list(reversed(rows_a[3:] + rows_b[:4])))
    junk = [(b"junk", b"{not json", 1, 300), (None, values_a[0], 1, 301)]
    write_rows(source, "part-2", list(reversed(rows_a[:3] + rows_b[4:])) + junk)

    run_once(spark, source, tmp_path / "out", tmp_path / "ckpt", PolicyConfig("strict"))

    sessions = {r["session"]: r for r in records(spark, tmp_path / "out", "session")}
    assert {s: (r["status"], r["digest"]) for s, r in sessions.items()} == {
        "sess-a": ("ok", digest_a),
        "sess-b": ("ok", digest_b),
    }
    assert sessions["sess-b"]["messages"] == len(values_b)
    changes = records(spark, tmp_path / "out", "change")
    assert len([c for c in changes if c["session"] == "sess-a"]) == 4 + 6 + 1
    dead = sorted(records(spark, tmp_path / "out", "dead_letter"), key=lambda r: r["offset"])
    assert [(d["key"], d["value"], d["offset"]) for d in dead] == [
        (b"junk", b"{not json", 300),
        (None, values_a[0], 301),
    ]
    assert "not UTF-8 JSON" in dead[0]["detail"]
    assert dead[1]["detail"].startswith("key is null")


def test_a_quiet_session_is_closed_as_timed_out_after_the_session_timeout(spark, tmp_path):
    policy = PolicyConfig("ordered", session_timeout_ms=1_500)
    values, _ = session_values("quiet")
    source, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    write_rows(source, "part-1", [(b"quiet", v, 0, i) for i, v in enumerate(values[:3])])
    run_once(spark, source, out, ckpt, policy)
    assert records(spark, out, "session") == []

    time.sleep(2.0)
    other, _ = session_values("other")
    write_rows(source, "part-2", [(b"other", v, 1, i) for i, v in enumerate(other)])
    run_once(spark, source, out, ckpt, policy)

    sessions = {r["session"]: r for r in records(spark, out, "session")}
    assert sessions["quiet"]["status"] == "timed_out"
    assert sessions["quiet"]["closed_by"] == "timeout"
    assert sessions["quiet"]["row_count"] == 4
    assert sessions["other"]["status"] == "ok"
    timeouts = [r for r in records(spark, out, "integrity") if r["violation"] == "timeout"]
    assert [r["session"] for r in timeouts] == ["quiet"]


def test_strict_policy_stops_the_query_naming_the_session_and_offsets(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    values, _ = session_values("gappy")
    del values[3]  # seq 3 never arrives
    source = tmp_path / "in"
    write_rows(source, "part-1", [(b"gappy", v, 2, 40 + i) for i, v in enumerate(values)])

    with pytest.raises(StreamingQueryException) as failure:
        run_once(spark, source, tmp_path / "out", tmp_path / "ckpt", PolicyConfig("strict"))

    message = str(failure.value)
    assert "IntegrityViolation" in message
    assert "gap in session 'gappy' of sensor 'sensor-a'" in message
    assert "partition 2 offset 43: expected seq 3, got seq 4 (last applied offset: 42)" in message


def test_a_restart_with_another_shuffle_partition_count_keeps_every_open_session(spark, tmp_path):
    # Sessions are placed by their topic's number (pipeline.placement); the placement must be computed with
    # the checkpoint's partition count, which Spark keeps, or the open sessions would lose their state.
    policy = PolicyConfig("strict")
    source, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    sessions = {f"sess-{i}": session_values(f"sess-{i}") for i in range(8)}
    first = {s: v[:4] for s, (v, _) in sessions.items()}
    for i, (s, values) in enumerate(first.items()):
        write_rows(
            source, f"a-{i}", [(s.encode(), v, 0, n) for n, v in enumerate(values)], f"sotw-sensor-{i:04d}"
        )
    run_once(spark, source, out, ckpt, policy)

    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        for i, (s, (values, _)) in enumerate(sessions.items()):
            rest = [(s.encode(), v, 0, n) for n, v in enumerate(values) if n >= 4]
            write_rows(source, f"b-{i}", rest, f"sotw-sensor-{i:04d}")
        run_once(spark, source, out, ckpt, policy)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")

    closed = {r["session"]: (r["status"], r["digest"]) for r in records(spark, out, "session")}
    assert closed == {s: ("ok", digest) for s, (_, digest) in sessions.items()}
    assert records(spark, out, "integrity") == []


def test_a_checkpoint_whose_state_is_keyed_by_the_session_alone_is_refused_with_a_clear_reason(
    spark, tmp_path
):
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from pipeline.query import explain_failure
    from pipeline.reconstruct import STATE_DDL, SessionFunction
    from pipeline.records import BLOCK_DDL

    values, _ = session_values("old")
    source, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    write_rows(source, "part-1", [(b"old", v, 0, i) for i, v in enumerate(values[:3])], "sotw-sensor-0001")

    def grouped_by_the_key_alone(stream: Any) -> Any:
        """The layout before placement by sensor."""
        return (
            stream.select(
                F.col("key").alias("group_key"),
                "key",
                "topic",
                "partition",
                F.array("offset").alias("offsets"),
                F.array("value").alias("values"),
                F.array(F.unix_millis("timestamp")).alias("timestamps"),
            )
            .groupBy("group_key")
            .applyInPandasWithState(
                SessionFunction(PolicyConfig("ordered")),
                outputStructType=BLOCK_DDL,
                stateStructType=STATE_DDL,
                outputMode="append",
                timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
            )
        )

    run_once(spark, source, out, ckpt, PolicyConfig("ordered"), grouped_by_the_key_alone)
    write_rows(
        source, "part-2", [(b"old", v, 0, i) for i, v in enumerate(values) if i >= 3], "sotw-sensor-0001"
    )

    with pytest.raises(StreamingQueryException) as failure:
        run_once(spark, source, out, ckpt, PolicyConfig("ordered"))

    assert "start with a new --checkpoint and --output" in str(explain_failure(failure.value))
