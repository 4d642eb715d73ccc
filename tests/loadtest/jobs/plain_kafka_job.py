"""A team's job with no Spark and no sotw: a plain confluent-kafka consumer keeping each session's rows.

It subscribes to the topics matching ``--topics`` in a consumer group, applies each message to an in-memory
table, and every ``--flush-ms`` writes the whole table as one Parquet file (the tables contract) and then
commits its offsets, so the harness reads its lag from the group (``--lag-from group:ID``). ``--mode``:

- ``last-write-wins``: every message applied as it arrives (the job many teams write first): a delayed
  message or a copy sent again puts an old value back;
- ``highest-seq``: each row keeps the value of the highest seq that touched it; a snapshot sets rows at its
  own seq and a delete leaves a tombstone with its seq, so an older message never wins.

``--kafka-config FILE`` (the harness's ``{kafka_config}``) adds the cluster's librdkafka settings (SASL,
TLS), one ``key=value`` a line, read from the file rather than the command line, where ``ps`` would show them.

``--out-topic NAME`` (the harness's ``{output_topic}``) writes the table to a Kafka topic instead of files, as
Kafka-native jobs do: every ``--flush-ms``, a record per row changed since the last flush, keyed
``SESSION/ROW_ID``, the row as JSON, a tombstone for a deleted row; the producer is flushed before the offsets
are committed (at least once: a row written twice is the same row). It writes no ``committed_ms``: the record's
timestamp, taken when it is produced, dates the row.

``--skip-to-latest-after-s N`` plants a bug only a network fault shows: when records come again after more than
``N`` seconds without one, the job takes the silence for a broken fetch and goes on from each partition's
latest offset, as code that "keeps up" after an error does. Under steady load it never fires, nor once the load
has stopped; after a partition, the backlog the cut left is skipped (its commits block while it is cut off, so
the silence is seen when the records come back).

Nothing here imports sotw: it is what the harness is given, not part of it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


def read_settings(path: Path) -> dict[str, str]:
    """``key=value`` lines of a settings file; blank lines and ``#`` comments skipped."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topics", required=True, help="a topic regex (librdkafka: starts with ^)")
    p.add_argument("--out", type=Path, default=None, help="a directory for the table's Parquet file")
    p.add_argument("--out-topic", default=None, help="a Kafka topic for the table, instead of --out")
    p.add_argument("--group", required=True)
    p.add_argument("--mode", choices=("last-write-wins", "highest-seq"), default="last-write-wins")
    p.add_argument("--flush-ms", type=int, default=1000)
    p.add_argument("--skip-to-latest-after-s", type=float, default=None, help="a planted bug (see above)")
    p.add_argument(
        "--kafka-config", type=Path, default=None, help="librdkafka settings file (key=value lines)"
    )
    args = p.parse_args()
    if (args.out is None) == (args.out_topic is None):
        p.error("give one of --out and --out-topic")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    settings = read_settings(args.kafka_config) if args.kafka_config else {}
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            **settings,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe([args.topics])
    table: dict[tuple[str, int], dict[str, Any]] = {}
    apply = last_write_wins if args.mode == "last-write-wins" else highest_seq
    if args.out_topic is not None:
        sink: Files | Topic = Topic(
            Producer({"bootstrap.servers": args.bootstrap, **settings}), args.out_topic
        )
    else:
        sink = Files(args.out)
    next_flush = time.monotonic() + args.flush_ms / 1000
    last_read: float | None = None  # armed by the first record: the start's silence is no broken fetch
    try:
        while not stop:
            silent_since = last_read
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is None:
                    apply(table, msg.value())
                    last_read = time.monotonic()
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    print("kafka error:", msg.error(), flush=True)
            quiet = args.skip_to_latest_after_s
            if quiet is not None and silent_since is not None and last_read != silent_since:
                if last_read - silent_since > quiet:  # records again after a silence: the planted bug
                    skipped = skip_to_latest(consumer)
                    print(
                        f"records after {last_read - silent_since:.0f} s of silence: skipped {skipped}",
                        flush=True,
                    )
            if time.monotonic() >= next_flush:
                sink.flush(table)
                commit(consumer)
                next_flush = time.monotonic() + args.flush_ms / 1000
    finally:
        sink.flush(table)
        commit(consumer)
        consumer.close()


def skip_to_latest(consumer: Consumer) -> int | None:
    """The planted bug: each assigned partition goes on from its latest offset; how many records that skipped."""
    assigned = consumer.assignment()
    try:
        ends = [consumer.get_watermark_offsets(tp, timeout=1.0)[1] for tp in assigned]
        at = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assigned)}
        for tp, high in zip(assigned, ends, strict=True):
            consumer.seek(TopicPartition(tp.topic, tp.partition, high))
    except KafkaException:
        return None
    read = [at[(tp.topic, tp.partition)] for tp in assigned]
    return sum(high - pos for pos, high in zip(read, ends, strict=True) if pos >= 0)


def commit(consumer: Consumer) -> None:
    """Commit what was consumed (written to the table first); nothing consumed yet is not an error."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


def decode(value: bytes | None) -> dict[str, Any] | None:
    try:
        msg = json.loads(value or b"")
    except ValueError:
        return None  # not JSON: skipped
    if not isinstance(msg, dict) or not {"kind", "session", "sensor"} <= msg.keys():
        return None
    return msg if isinstance(msg.get("seq"), int) else None


def last_write_wins(table: dict[tuple[str, int], dict[str, Any]], value: bytes | None) -> None:
    msg = decode(value)
    if msg is None:
        return
    session, sensor = msg["session"], msg["sensor"]
    if msg["kind"] == "snapshot":
        for row in msg["rows"]:
            table[(session, row["id"])] = {"sensor": sensor, "row": row, "seq": 0, "deleted": False}
    elif msg["kind"] == "update":
        row = msg["row"]
        deleted = msg["op"] == "delete"
        table[(session, row["id"])] = {"sensor": sensor, "row": row, "seq": msg["seq"], "deleted": deleted}


def highest_seq(table: dict[tuple[str, int], dict[str, Any]], value: bytes | None) -> None:
    msg = decode(value)
    if msg is None or msg["kind"] == "end":
        return
    session, sensor, seq = msg["session"], msg["sensor"], msg["seq"]
    rows = msg["rows"] if msg["kind"] == "snapshot" else [msg["row"]]
    deleted = msg.get("op") == "delete"
    for row in rows:
        held = table.get((session, row["id"]))
        if held is None or held["seq"] < seq:
            table[(session, row["id"])] = {"sensor": sensor, "row": row, "seq": seq, "deleted": deleted}


def record(session: str, row_id: int, held: dict[str, Any]) -> dict[str, Any]:
    """A row of the table: the row's columns, its session, sensor and seq."""
    return {"session": session, "sensor": held["sensor"], "row_id": row_id, "seq": held["seq"], **held["row"]}


class Files:
    """The whole table as one Parquet file, replaced atomically at each flush."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out

    def flush(self, table: dict[tuple[str, int], dict[str, Any]]) -> None:
        records = [record(s, i, held) for (s, i), held in table.items() if not held["deleted"]]
        if not records:
            return
        tmp = self.out / ".table.parquet.tmp"
        pq.write_table(pa.Table.from_pylist(records), tmp)
        os.replace(tmp, self.out / "table.parquet")


class Topic:
    """The rows changed since the last flush, to a topic keyed by session and row; a tombstone for a delete."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.written: dict[tuple[str, int], dict[str, Any]] = {}

    def flush(self, table: dict[tuple[str, int], dict[str, Any]]) -> None:
        for (session, row_id), held in table.items():
            if self.written.get((session, row_id)) == held:
                continue
            value = None if held["deleted"] else json.dumps(record(session, row_id, held))
            self.producer.produce(self.topic, key=f"{session}/{row_id}", value=value)
            self.producer.poll(0)
            self.written[(session, row_id)] = dict(held)
        # Every row on the broker before the offsets that produced it are committed.
        if self.producer.flush(30) > 0:
            raise RuntimeError(f"the output topic {self.topic} did not take the rows within 30 s")


if __name__ == "__main__":
    main()
