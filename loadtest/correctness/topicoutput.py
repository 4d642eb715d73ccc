"""A job's table kept in a Kafka topic, as the verifier reads it and the harness watches it.

Kafka Streams, Flink and most Kafka-native jobs write their output to a topic, not to files: a record per row
change, keyed by session and row, its value the row as JSON with the columns the tables contract names for files
(``session``, ``row_id``, the row's columns, ``seq``, ``committed_ms``, ...), a tombstone (null value) for a
deleted row. ``read_topic_table`` reads it to its end and compacts it as Kafka would, so that
``loadtest.correctness.tables.read_tables`` hands the same frame as for files to the same verdict rules.

Unlike a table in files, the topic also holds every change the job wrote, each with its ``seq`` and commit time:
so end-to-end latency is measured for every message whose change reached the topic, not only for the messages
that set the final rows (a capacity search's early levels, or the seconds after an incident, leave almost no
final rows). The output topic sotw creates keeps its changes for the run (``min.compaction.lag.ms``).
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from array import array
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from loadtest.errors import HarnessError
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)

#: The record's timestamp (epoch ms), the commit time of last resort; ``_``: not one of the row's columns.
RECORD_MS = "_record_ms"

#: How long the verifier waits for the topic's end before it gives up.
READ_TIMEOUT_S = 120.0

#: How long the output topic sotw creates keeps a change before the cleaner may compact it away: longer than a
#: run, so every change is there to date its message when the verifier reads the topic.
KEEP_CHANGES_MS = 7 * 24 * 3600 * 1000


class TopicTable(NamedTuple):
    """What the verifier reads from an output topic: the table, and every change written, for latency."""

    table: pd.DataFrame
    #: Per record with a value that names its session and seq: ``session``, ``seq``, its ``committed_ms`` field
    #: (NaN without one) and ``RECORD_MS``, the record's timestamp (NaN without one).
    changes: pd.DataFrame


class _Changes:
    """Every dated change, kept in arrays: four 8-byte numbers a change, its session one shared name.

    A 10x run's topic holds millions of changes. Kept as a Python tuple each, with a session name of its own,
    they cost about 300 bytes apiece: gigabytes of the verifier's memory for a drill of a few minutes.
    """

    def __init__(self) -> None:
        self.sessions: dict[str, int] = {}
        self.codes = array("q")
        self.seqs = array("q")
        self.committed = array("d")
        self.ms = array("d")

    def add(self, value: bytes, ms: int) -> None:
        """Keep the change's session, seq and dates; a change that names no session or seq dates nothing."""
        session, seq, committed, when = _dated(value, ms)
        if session is None or seq is None:
            return
        self.codes.append(self.sessions.setdefault(session, len(self.sessions)))
        self.seqs.append(seq)
        self.committed.append(math.nan if committed is None else float(committed))
        self.ms.append(math.nan if when is None else float(when))

    def frame(self) -> pd.DataFrame:
        """``session``, ``seq``, ``committed_ms`` and ``RECORD_MS``, one row per change kept."""
        names = np.array(list(self.sessions), dtype=object)
        codes = np.frombuffer(self.codes, dtype=np.int64) if self.codes else np.zeros(0, dtype=np.int64)
        return pd.DataFrame(
            {
                "session": names[codes] if len(names) else np.zeros(0, dtype=object),
                "seq": np.frombuffer(self.seqs, dtype=np.int64) if self.seqs else np.zeros(0, dtype=np.int64),
                "committed_ms": np.frombuffer(self.committed) if self.committed else np.zeros(0),
                RECORD_MS: np.frombuffer(self.ms) if self.ms else np.zeros(0),
            }
        )


def read_topic_table(kafka: KafkaConfig, topic: str, timeout_s: float = READ_TIMEOUT_S) -> TopicTable:
    """The topic's last value per key, a row per live key: the row's JSON fields and ``RECORD_MS``; and its changes.

    Read from the beginning of every partition to its end with ``isolation.level=read_committed``, whatever
    the run's settings say: an exactly-once job's aborted writes are not its table. Compacted per partition
    and key, as Kafka compacts: a later record replaces an earlier one, a tombstone (null value) deletes it.
    A key written to two partitions stays twice, so a job that scatters a row's changes shows repeated rows.
    A record without a key cannot be replaced or deleted and stays as it is.

    Raises
    ------
    HarnessError
        If the topic does not exist, is not read to its end within ``timeout_s``, or holds a value that is not
        a JSON object (naming its partition and offset).
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        kafka.client(
            **{
                "group.id": f"sotw-verify-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            }
        )
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise HarnessError(
                f"the output topic {topic} does not exist on {kafka.bootstrap}: the job wrote nothing to it"
            )
        partitions = sorted(found.partitions)
        # Assign, not subscribe: a reader that joins no group cannot rebalance anyone.
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])  # -2: the beginning
        table: dict[tuple[int, Any], tuple[bytes, int]] = {}
        changes = _Changes()
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"the output topic {topic} was not read to its end in {timeout_s:g} s "
                    f"(partitions {sorted(set(partitions) - at_end)} not done): is a transaction still open?"
                )
            for msg in consumer.consume(1000, timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                        continue
                    raise HarnessError(f"reading the output topic {topic}: {error.str()}")
                key = (msg.partition(), msg.key() if msg.key() is not None else ("offset", msg.offset()))
                value = msg.value()
                if value is None:
                    table.pop(key, None)
                else:
                    ms = msg.timestamp()[1]
                    table[key] = (value, ms)
                    changes.add(value, ms)
    finally:
        consumer.close()
    frame = pd.DataFrame.from_records([_record(topic, key, value, ms) for key, (value, ms) in table.items()])
    return TopicTable(frame, changes.frame())


def _dated(value: bytes, ms: int) -> tuple[Any, Any, Any, Any]:
    """A change's session, seq, ``committed_ms`` field and record timestamp; None where the record lacks one."""
    try:
        row = json.loads(value)
    except ValueError:
        row = None
    if not isinstance(row, dict):
        return (None, None, None, None)
    session, seq, committed = row.get("session"), row.get("seq"), row.get("committed_ms")
    return (
        session if isinstance(session, str) else None,
        seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
        committed if isinstance(committed, (int, float)) and not isinstance(committed, bool) else None,
        ms if ms > 0 else None,
    )


def _record(topic: str, key: tuple[int, Any], value: bytes, ms: int) -> dict[str, Any]:
    try:
        row = json.loads(value)
    except ValueError:
        row = None
    if not isinstance(row, dict):
        raise HarnessError(
            f"a record of the output topic {topic} (partition {key[0]}, key {key[1]!r}) is not a JSON object: "
            f"{value[:80]!r}; the tables contract wants the row as JSON (docs/own-pipeline.md)"
        )
    return {**row, RECORD_MS: ms if ms > 0 else None}


def create_output_topic(kafka: KafkaConfig, topic: str, timeout_s: float = 30.0) -> bool:
    """Create the output topic, compacted as a table's topic is, unless it exists; whether it was made.

    No change is compacted away for a week (``KEEP_CHANGES_MS``), so the verifier dates every message.

    sotw makes it rather than the job, so that a job that never creates its output topic (Kafka Streams
    creates only its internal ones) runs on a cluster that does not create topics on first write, and so
    that the run's clean-up knows what it owns. The cluster's default replication is used.

    Raises
    ------
    HarnessError
        If the cluster refuses to create it (an ACL, a bad name).
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka.client())
    config = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(KEEP_CHANGES_MS)}
    new = NewTopic(topic, num_partitions=1, config=config)
    try:
        admin.create_topics([new], operation_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise HarnessError(f"could not create the output topic {topic}: {err.str()}") from None
    log.info("created the output topic %s", topic)
    return True


class TopicOutputProbe:
    """Records written to the output topic so far (its end offsets), once a second, as ``written_changes``.

    An exactly-once job's records count when written, not when committed: the figure is the job's activity,
    the verdict reads only what was committed.
    """

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self._kafka = kafka
        self._topic = topic
        self._consumer: Any = None
        self.rows = 0

    def sample(self) -> dict[str, Any]:
        """The sum of the topic's end offsets (the last figure while the cluster does not answer)."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            if self._consumer is None:
                self._consumer = self._kafka.consumer(**{"isolation.level": "read_uncommitted"})
            found = self._consumer.list_topics(self._topic, timeout=2).topics.get(self._topic)
            if found is not None and found.error is None:
                total = 0
                for p in found.partitions:
                    low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(self._topic, p), timeout=2, cached=False
                    )
                    total += max(0, high - low)
                self.rows = total
        except KafkaException as exc:
            log.debug("output topic %s not sampled: %s", self._topic, exc)
        return {"written_changes": self.rows}

    def close(self) -> None:
        """Close the consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
