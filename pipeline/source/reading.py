"""The ``sotw-kafka`` source's reading, in Spark's Python workers: exactly ``[start, end)`` of each offset range.

A task reads its ranges (``pipeline.source.planning.KafkaInputPartition``) with one assign-only consumer and
yields Arrow record batches (``pipeline.source.rows``). The consumer is held to a small prefetch, since what
is fetched past a range's end is thrown away, and set so that a missing offset is an error rather than a
silent jump. A partition that stops delivering is looked at afresh and judged by
``pipeline.source.dataloss.judge_stall``. This runs with nothing but the pickled options and the ranges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.gcpause import gc_paused
from pipeline.source.broker import partition_state
from pipeline.source.dataloss import judge_stall
from pipeline.source.offsets import TP, OffsetRange
from pipeline.source.options import SourceOptions
from pipeline.source.rows import ARROW_BATCH_ROWS, ArrowRows, arrow_schema
from sotw.errors import BrokerError

log = logging.getLogger(__name__)

STALL_CHECK_S = 2.0
"""A reader that got nothing from a partition for this long asks the broker whether the data still exists."""

# Consumer tuning for bulk reads; a ``kafka.*`` option with the same name wins. A task reads bounded ranges,
# and whatever librdkafka prefetches past a range's end is fetched, decoded into messages and thrown away:
# with its default 64 MB queue most of that work is wasted on short ranges, so the queue is held to 1 MB and
# fetched again 5 ms (not a second) after it was found full. librdkafka also caps a whole fetch request at the queue's size unless
# ``fetch.max.bytes`` is given: against a remote Kafka, or for values near 1 MB, raise
# ``kafka.queued.max.messages.kbytes`` (docs/pipeline.md).
_READ_TUNING = {
    "fetch.wait.max.ms": "100",
    "fetch.message.max.bytes": "1048576",
    "queued.max.messages.kbytes": "1024",
    "fetch.queue.backoff.ms": "5",
}
# librdkafka's other names for the same settings: a user's ``kafka.max.partition.fetch.bytes`` must win too.
_ALIASES = {"fetch.message.max.bytes": "max.partition.fetch.bytes"}
# Settings the reader's correctness depends on; these win over ``kafka.*`` options.
_READ_REQUIRED = {
    # An offset that is gone must surface as an error (data loss), never as a silent jump.
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
}


def reader_settings(options: SourceOptions) -> dict[str, Any]:
    """The readers' consumer settings: ``_READ_TUNING`` unless the user set it, then ``_READ_REQUIRED``.

    A user's ``kafka.*`` setting wins over the tuning under either of librdkafka's names for it.
    """
    given = options.kafka.settings
    tuning = {k: v for k, v in _READ_TUNING.items() if k not in given and _ALIASES.get(k) not in given}
    return {**tuning, **_READ_REQUIRED}


def read_ranges(options: SourceOptions, ranges: Sequence[OffsetRange]) -> Iterator[Any]:
    """Read exactly ``[start, end)`` of every range and yield the records as Arrow record batches.

    One assign-only consumer serves all ranges. A partition is released as soon as its end is reached, so
    nothing after ``end`` is fetched for long. When a partition stops delivering, the broker is asked why:
    records that are gone are data loss (``failOnDataLoss``), records that exist but do not come within
    ``kafkaConsumer.pollTimeoutMs`` stop the task with ``SourceTimeoutError``.
    """
    if not ranges:
        return
    schema = arrow_schema(options.pack)
    consumer = options.kafka.consumer(**reader_settings(options))
    try:
        with gc_paused():
            for group in rounds(ranges):
                yield from ReadRound(consumer, options, group).batches(schema)
    finally:
        consumer.close()


def rounds(ranges: Sequence[OffsetRange]) -> list[list[OffsetRange]]:
    """Split ranges into rounds in which every partition appears once (a consumer has one position each)."""
    merged: list[OffsetRange] = []
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition, r.start)):
        last = merged[-1] if merged else None
        if (
            last is not None
            and (last.topic, last.partition) == (r.topic, r.partition)
            and last.end == r.start
        ):
            merged[-1] = OffsetRange(r.topic, r.partition, last.start, r.end)
        else:
            merged.append(r)
    out: list[list[OffsetRange]] = []
    seen: dict[TP, int] = {}
    for r in merged:
        i = seen.get((r.topic, r.partition), -1) + 1
        seen[(r.topic, r.partition)] = i
        if i == len(out):
            out.append([])
        out[i].append(r)
    return out


class ReadRound:
    """One round of a task's read: each of its partitions once, from its range's start to its end.

    Parameters
    ----------
    consumer
        The task's assign-only consumer (``reader_settings``); the round assigns its partitions and
        releases each one as soon as its end is reached.
    options
        The source's options (``failOnDataLoss``, ``kafkaConsumer.pollTimeoutMs``, ``packRecords``).
    group
        The round's ranges, at most one per partition (``rounds``).

    Attributes
    ----------
    pending : dict
        ``{(topic, partition): [next offset, end]}`` of the partitions not yet read to their end.
    progress : float
        When the last record of any partition was accepted (``time.monotonic``). The consumer, not each
        partition, is watched for stalls: while records of some partitions keep coming, the others are just
        waiting their turn in librdkafka's fetch queue, not missing.
    checked : dict
        When each partition was last looked at afresh, so a silent one is asked about once per stall check.
    """

    def __init__(self, consumer: Any, options: SourceOptions, group: list[OffsetRange]) -> None:
        self.consumer = consumer
        self.options = options
        self.pending: dict[TP, list[int]] = {(r.topic, r.partition): [r.start, r.end] for r in group}
        now = time.monotonic()
        self.progress = now
        self.checked = dict.fromkeys(self.pending, now)

    def batches(self, schema: Any) -> Iterator[Any]:
        """Read the round to its end and yield the accepted records as Arrow record batches of ``schema``."""
        from confluent_kafka import KafkaError, TopicPartition

        consumer, pending = self.consumer, self.pending
        consumer.assign([TopicPartition(t, p, r[0]) for (t, p), r in pending.items()])
        pack = self.options.pack
        recheck_codes = {
            KafkaError._AUTO_OFFSET_RESET,
            KafkaError.OFFSET_OUT_OF_RANGE,
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError._UNKNOWN_TOPIC,
            KafkaError._PARTITION_EOF,
        }
        finish, diagnose = self.finish, self.diagnose
        cols = ArrowRows(pack)
        accept = cols.msgs.append
        while pending:
            # ``consume`` returns when it has ``num_messages`` or the timeout passed. Asking for no more than the
            # ranges still hold makes the last call of a range return as soon as its records are in, instead of
            # waiting out the timeout for a batch that cannot fill (the whole cost of a small read).
            left = sum(stop - pos for pos, stop in pending.values())
            msgs = consumer.consume(num_messages=max(1, min(ARROW_BATCH_ROWS, left)), timeout=0.2)
            now = time.monotonic()
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    tp = (msg.topic(), msg.partition())
                    if tp not in pending:
                        continue
                    if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= pending[tp][1]:
                        finish(tp)  # the tail is control records (transaction markers), not data
                    elif err.code() in recheck_codes:
                        diagnose(tp)
                    elif err.fatal():
                        raise BrokerError(f"Kafka consumer failed: {err.str()}")
                    else:
                        log.debug("consumer error on %s/%d: %s", tp[0], tp[1], err.str())
                    continue
                tp = (msg.topic(), msg.partition())
                state = pending.get(tp)
                if state is None:
                    continue
                off = msg.offset()
                if off < state[0]:
                    continue  # Kafka returns whole batches: skip what precedes our start
                if off >= state[1]:
                    finish(tp)
                    continue
                accept(msg)
                state[0] = off + 1
                self.progress = now
                if state[0] >= state[1]:
                    finish(tp)
            if len(cols) >= ARROW_BATCH_ROWS:
                yield cols.batch(schema)
                cols = ArrowRows(pack)
                accept = cols.msgs.append
            if now - self.progress > STALL_CHECK_S:
                for tp in [tp for tp in pending if now - self.checked[tp] > STALL_CHECK_S]:
                    diagnose(tp)
        if len(cols):
            yield cols.batch(schema)
        consumer.unassign()

    def finish(self, tp: TP) -> None:
        """Stop reading ``tp``: its range is read (or nothing more of it exists)."""
        from confluent_kafka import TopicPartition

        if self.pending.pop(tp, None) is not None:
            self.consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])

    def diagnose(self, tp: TP) -> None:
        """``tp`` stopped delivering before its end: ask the broker whether its records still exist, and act."""
        from confluent_kafka import TopicPartition

        pos, stop = self.pending[tp]
        self.checked[tp] = time.monotonic()
        state = partition_state(self.options, tp)
        verdict = judge_stall(self.options, tp, pos, stop, state, time.monotonic() - self.progress)
        if verdict.finish:
            self.finish(tp)
        elif verdict.resume_at is not None:
            self.pending[tp][0] = verdict.resume_at
            self.consumer.seek(TopicPartition(tp[0], tp[1], verdict.resume_at))
            self.progress = time.monotonic()
        elif verdict.end_at is not None:
            self.pending[tp][1] = verdict.end_at
