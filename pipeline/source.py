"""Kafka as a Spark source without Spark's JVM connector: ``spark.readStream.format("sotw-kafka")``.

sotw's own reader of Kafka, through PySpark's Python Data Source API and confluent-kafka, and the pipeline's
default source: it hands the stateful step one packed row per session and partition instead of one per message
(docs/pipeline.md, "Kafka source", has the measurements). It mirrors Spark's Kafka connector, so the same
query runs on either (``--source spark-kafka`` swaps in ``format("kafka")``):

* the same options (``kafka.*`` pass-through, ``subscribe``, ``subscribePattern``, ``startingOffsets``,
  ``endingOffsets``, ``failOnDataLoss``, ``maxOffsetsPerTrigger``, ``minPartitions``,
  ``kafkaConsumer.pollTimeoutMs``) plus ``topicDiscoveryIntervalMs``;
* the same rows (``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``);
* the same offsets in the checkpoint (``{"topic": {"0": 23}}``, next offset to read).

Where it differs, it is on purpose: end offsets of all partitions come from one ``sotw.kafka.EndOffsets``
look (two requests, not two per partition); many topic-partitions are packed into a few tasks;
rows reach Spark as Arrow record batches; and a vanished topic only counts as data loss when the query had
not read all of it. docs/pipeline.md ("Kafka source") is the user-facing description.

The driver-side half (offset planning) runs in one long-lived Python process per query; ``read`` runs in
Python workers and must not rely on anything but the pickled reader and the partition it is given.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipeline.errors import ConfigError, PipelineError
from pipeline.gcpause import gc_paused
from pipeline.offsets import (
    EARLIEST,
    LATEST,
    TP,
    Lag,
    OffsetRange,
    lag,
    offsets_from_json,
    offsets_to_json,
    pack_ranges,
    parse_offset_spec,
    rate_limit,
)
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets, KafkaConfig

log = logging.getLogger(__name__)

FORMAT = "sotw-kafka"
DEFAULT_TASKS = 2
"""Tasks per micro-batch when ``minPartitions`` is not given: Spark's default parallelism on local[2]."""
ARROW_BATCH_ROWS = 10_000
"""Rows per Arrow record batch handed to Spark (Spark's own ``arrow.maxRecordsPerBatch`` default)."""
METADATA_TIMEOUT_S = 10.0
"""How long the driver waits for the broker when listing topics and reading offsets."""
STALL_CHECK_S = 2.0
"""A reader that got nothing from a partition for this long asks the broker whether the data still exists."""

# Consumer tuning for bulk reads; a ``kafka.*`` option with the same name wins. A task reads bounded ranges,
# and whatever librdkafka prefetches past a range's end is fetched, decoded into messages and thrown away:
# with its default 64 MB queue, a task's read of 24 ranges of 4,166 messages cost the embedded broker 1.5 us
# and the reader 3.1 us per message kept; with the queue held to 1 MB, fetching again 5 ms (not a second)
# after finding it full, 0.8 and 1.9. librdkafka also caps a whole fetch request at the queue's size unless
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

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
"""The row schema of Spark's Kafka source (without headers)."""

PACKED_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offsets", ArrayType(LongType(), containsNull=False)),
        StructField("values", ArrayType(BinaryType())),
        StructField("timestamps", ArrayType(LongType())),
    ]
)
"""The rows with ``packRecords=true``: one row per key and partition per Arrow batch, messages in offset order.

Spark's per-row costs (Arrow to rows, the shuffle, rows back to pandas in a stateful function) are paid per
row, not per byte; a session's messages travel together anyway (same key, so same group), so packing them
cuts those costs by the number of messages per row. ``timestamps`` are epoch milliseconds (null when the
broker gave none).
"""


class DataLossError(PipelineError):
    """Offsets the query still had to read are gone from Kafka, and ``failOnDataLoss`` is true.

    The message names the topic, the partition, the missing offset range and what happened.
    """


class SourceTimeoutError(PipelineError):
    """The broker reports records that a reader could not fetch within ``kafkaConsumer.pollTimeoutMs``."""


# --------------------------------------------------------------------------------------------- options


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name} must be true or false, got {raw!r}")
    return value == "true"


def _int_option(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed and checked once where ``load()`` is called.

    Parameters
    ----------
    kafka
        Bootstrap address and librdkafka settings (every ``kafka.*`` option with the prefix removed).
    subscribe
        Topics named by ``subscribe`` (empty when ``subscribePattern`` is used).
    pattern
        ``subscribePattern``: a Python regular expression that must match the whole topic name.
    starting
        ``startingOffsets``: ``earliest``, ``latest`` or ``{(topic, partition): offset}``; ``None`` for the
        default (``latest`` for streams, ``earliest`` for batch reads, as in Spark).
    ending
        ``endingOffsets`` (batch reads only): ``latest`` or ``{(topic, partition): offset}``.
    fail_on_data_loss
        Stop the query when offsets it still needs are gone (``failOnDataLoss``).
    max_offsets_per_trigger
        Upper bound of offsets per micro-batch, shared among partitions by backlog.
    min_partitions
        Spark tasks per micro-batch; ``None`` means ``DEFAULT_TASKS``.
    discovery_interval_ms
        How often the topic list is refreshed to find new (and notice deleted) topics.
    pack
        ``packRecords``: emit ``PACKED_SCHEMA`` rows (one per key and partition per batch) instead of one row
        per message.
    poll_timeout_ms
        How long a reader waits for records the broker says exist before it gives up.
    """

    kafka: KafkaConfig
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    starting: str | dict[TP, int] | None = None
    ending: str | dict[TP, int] = "latest"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    discovery_interval_ms: int = 5000
    poll_timeout_ms: int = 120_000
    pack: bool = False
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if bool(self.subscribe) == (self.pattern is not None):
            raise ConfigError("give exactly one of the options subscribe and subscribePattern")
        if self.pattern is not None:
            try:
                object.__setattr__(self, "_regex", re.compile(self.pattern))
            except re.error as exc:
                raise ConfigError(
                    f"option subscribePattern {self.pattern!r} is not a valid regex: {exc}"
                ) from None
        if self.discovery_interval_ms < 0:
            raise ConfigError(
                f"option topicDiscoveryIntervalMs must be >= 0, got {self.discovery_interval_ms}"
            )
        if self.poll_timeout_ms < 1:
            raise ConfigError(f"option kafkaConsumer.pollTimeoutMs must be >= 1, got {self.poll_timeout_ms}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        """Build from the options given to ``spark.readStream.format("sotw-kafka")``, named as Spark names them.

        Raises
        ------
        ConfigError
            Naming the option and its bad value.
        """
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        bootstrap = opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ConfigError("option kafka.bootstrap.servers is required (HOST:PORT[,HOST:PORT...])")
        settings = {
            k[len("kafka.") :]: v
            for k, v in opts.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        for unsupported in ("assign", "startingtimestamp", "startingoffsetsbytimestamp", "includeheaders"):
            if unsupported in opts:
                raise ConfigError(
                    f"option {unsupported} of Spark's Kafka source is not supported by {FORMAT}"
                )
        try:
            kafka = KafkaConfig(bootstrap, settings)
        except ValueError as exc:
            raise ConfigError(f"option kafka.bootstrap.servers: {exc}") from None
        subscribe = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        try:
            starting = (
                parse_offset_spec("startingOffsets", opts["startingoffsets"], ("earliest", "latest"))
                if "startingoffsets" in opts
                else None
            )
            ending = parse_offset_spec("endingOffsets", opts.get("endingoffsets", "latest"), ("latest",))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        interval = _int_option(opts, "topicDiscoveryIntervalMs", 0)
        poll = _int_option(opts, "kafkaConsumer.pollTimeoutMs", 1)
        return cls(
            kafka=kafka,
            subscribe=subscribe,
            pattern=opts.get("subscribepattern"),
            starting=starting,
            ending=ending,
            fail_on_data_loss=_bool_option(opts, "failOnDataLoss", True),
            max_offsets_per_trigger=_int_option(opts, "maxOffsetsPerTrigger", 1),
            min_partitions=_int_option(opts, "minPartitions", 1),
            discovery_interval_ms=5000 if interval is None else interval,
            poll_timeout_ms=120_000 if poll is None else poll,
            pack=_bool_option(opts, "packRecords", False),
        )

    def matches(self, topic: str) -> bool:
        """Whether the query reads ``topic``: named by ``subscribe`` or fully matched by the pattern.

        Internal topics (``__consumer_offsets`` and the like) never match a pattern, as with Kafka's own
        pattern subscription.
        """
        if self._regex is None:
            return topic in self.subscribe
        return not topic.startswith("__") and self._regex.fullmatch(topic) is not None

    @property
    def tasks(self) -> int:
        """Spark tasks per micro-batch (``minPartitions``, else ``DEFAULT_TASKS``)."""
        return self.min_partitions or DEFAULT_TASKS


def report_data_loss(
    fail: bool, topic: str, partition: int, start: int, end: int | None, reason: str
) -> None:
    """Stop with ``DataLossError`` or log a warning, as Spark's Kafka source does with ``failOnDataLoss``.

    The message is one line (it has to survive being quoted inside Spark's error) and names the topic,
    the partition and the missing offsets ``[start, end)`` (``end=None``: from ``start`` on, extent unknown).
    """
    where = f"offsets [{start}, {end})" if end is not None else f"offsets from {start} on"
    message = (
        f"Kafka data lost: topic {topic!r} partition {partition} {where} are no longer available ({reason})"
    )
    if fail:
        raise DataLossError(
            f"{message}. The query stops because failOnDataLoss is true; set failOnDataLoss=false to "
            "continue from the data that still exists"
        )
    log.warning("%s; continuing from the data that still exists because failOnDataLoss is false", message)


# ---------------------------------------------------------------------------------------- driver side


@dataclass
class BrokerView:
    """What the driver learned about the subscribed partitions in one look at the broker.

    Attributes
    ----------
    available
        ``{(topic, partition): (low, end)}`` of the partitions that exist and match.
    gone
        Partitions asked about that the topic listing positively says no longer exist.
    """

    available: dict[TP, tuple[int, int]]
    gone: set[TP]


class OffsetReader:
    """Lists matching partitions and reads their offsets, for the driver-side planning of the source.

    One admin client (``EndOffsets.admin``) lists topics and reads watermarks for the whole query, two
    requests per look whatever the partition count. Listing on the same client matters: its metadata cache is
    where ``ListOffsets`` looks up a partition's leader, so partitions a listing found can be read at once.

    Parameters
    ----------
    options
        The source's options.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._opts = options
        self._ends = EndOffsets(options.kafka, timeout=METADATA_TIMEOUT_S)
        self._partitions: set[TP] = set()
        self._listed_at: float | None = None

    def _list(self) -> set[TP]:
        from confluent_kafka import KafkaException

        try:
            metadata = self._ends.admin.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(f"could not list topics: {exc.args[0]}") from None
        found: set[TP] = set()
        for name, topic in metadata.topics.items():
            if topic.error is not None or not self._opts.matches(name):
                continue
            found.update((name, p) for p in topic.partitions)
        self._partitions = found
        self._listed_at = time.monotonic()
        return found

    def look(self, known: set[TP], force_listing: bool = False) -> BrokerView:
        """Return the offsets of every matching partition, and which of ``known`` are gone.

        The topic list is refreshed when ``force_listing`` is set or ``topicDiscoveryIntervalMs`` has
        passed; in between, the partitions found last time are used, and a partition whose offsets cannot
        be read triggers a fresh listing.
        """
        interval = self._opts.discovery_interval_ms / 1000
        due = self._listed_at is None or time.monotonic() - self._listed_at >= interval
        listed = force_listing or due
        current = self._list() if listed else set(self._partitions)
        try:
            available = self._ends(sorted(current))
        except BrokerError:
            if listed:
                raise
            # Most likely a partition vanished since the last listing: look again, once.
            listed = True
            current = self._list()
            available = self._ends(sorted(current))
        # Only a fresh listing can prove a partition gone; between listings, unknown is not gone.
        gone = {tp for tp in known if tp not in current} if listed else set()
        return BrokerView(available=available, gone=gone)

    def lows(self, partitions: Sequence[TP]) -> dict[TP, int]:
        """Earliest available offsets of ``partitions``; partitions that cannot be read are left out."""
        try:
            return {tp: low for tp, (low, _) in self._ends(partitions).items()}
        except BrokerError:
            pass
        out: dict[TP, int] = {}
        for tp in partitions:  # one of them is unreadable: ask one by one to keep the others
            try:
                out[tp] = self._ends([tp])[tp][0]
            except BrokerError:
                continue
        return out


class KafkaInputPartition(InputPartition):
    """The offset ranges one Spark task reads with one consumer.

    Parameters
    ----------
    ranges
        Offset ranges; several ranges of the same partition are read one after another.
    """

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(None)
        self.ranges = tuple(ranges)

    def __repr__(self) -> str:
        return f"KafkaInputPartition({len(self.ranges)} ranges, {sum(r.size for r in self.ranges)} offsets)"


def plan_partitions(
    options: SourceOptions,
    start: Mapping[TP, int],
    end: Mapping[TP, int],
    lows: Mapping[TP, int],
) -> list[KafkaInputPartition]:
    """Turn a batch's start and end offsets into packed input partitions.

    A partition missing from ``start`` is new and is read from its earliest offset (``lows``); one whose end
    is before its start was reset (a topic recreated) and is also read from its earliest offset.
    """
    ranges = []
    for tp, stop in sorted(end.items()):
        begin = start.get(tp)
        if begin is None or stop < begin:
            begin = min(lows.get(tp, 0), stop)
        if stop > begin:
            ranges.append(OffsetRange(tp[0], tp[1], begin, stop))
    return [KafkaInputPartition(group) for group in pack_ranges(ranges, options.tasks)]


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Kafka offsets and reads them; see the module docstring.

    One instance lives in the driver's Python source runner for the whole query and keeps what it learned
    (the end of every partition it has seen, the latest offsets for lag); copies pickled to the workers only
    run ``read``.

    Parameters
    ----------
    options
        The parsed source options.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._opts = options
        self._broker: OffsetReader | None = None
        self._seen_end: dict[TP, int] = {}
        # Partitions that disappeared after the query had read them to the end, and where it was: if one comes
        # back starting below that, it was reset (recreated, or a broker that lost its data) while running.
        self._left_at: dict[TP, int] = {}
        self._latest: dict[TP, int] = {}
        self._available_now = False
        self._target: dict[TP, int] | None = None
        self._unreachable_since: float | None = None

    @property
    def broker(self) -> OffsetReader:
        """The driver's view of the broker, created on first use (never in workers)."""
        if self._broker is None:
            self._broker = OffsetReader(self._opts)
        return self._broker

    def _remember(self, view: BrokerView) -> None:
        for tp, (_, end) in view.available.items():
            self._seen_end[tp] = end
        self._latest = {tp: end for tp, (_, end) in view.available.items()}

    def initialOffset(self) -> dict[str, dict[str, int]]:  # noqa: N802 (PySpark's API name)
        """Offsets a new query starts from, resolved from ``startingOffsets`` (default ``latest``)."""
        view = self.broker.look(set(), force_listing=True)
        self._remember(view)
        spec = self._opts.starting if self._opts.starting is not None else "latest"
        if spec == "earliest":
            offsets = {tp: low for tp, (low, _) in view.available.items()}
        elif spec == "latest":
            offsets = {tp: end for tp, (_, end) in view.available.items()}
        else:
            assert isinstance(spec, dict)
            # Partitions the JSON does not name start at their earliest offset, like partitions found later.
            offsets = {tp: low for tp, (low, _) in view.available.items()}
            for tp, wanted in spec.items():
                if tp not in view.available:
                    log.warning("startingOffsets names %s/%d, which does not exist or does not match", *tp)
                    continue
                low, end = view.available[tp]
                if wanted == EARLIEST:
                    offsets[tp] = low
                elif wanted == LATEST:
                    offsets[tp] = end
                elif wanted < low:
                    report_data_loss(
                        self._opts.fail_on_data_loss,
                        tp[0],
                        tp[1],
                        wanted,
                        low,
                        "startingOffsets is before the earliest offset",
                    )
                    offsets[tp] = low
                else:
                    offsets[tp] = min(wanted, end)
        log.info("starting offsets: %s", offsets)
        return offsets_to_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        """``maxOffsetsPerTrigger`` as Spark's ``ReadMaxRows``, else read everything available."""
        if self._opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Remember that this run drains what exists now; the target is fixed at the first ``latestOffset``."""
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:  # noqa: N802
        """End offsets of the next micro-batch: the newest available, capped by ``limit``.

        This is also where vanished data is detected: a partition the broker no longer has, an offset reset
        (the partition now ends before where we are), or a low watermark past where we are.
        """
        begin = offsets_from_json(start)
        first_available_now = self._available_now and self._target is None
        try:
            view = self.broker.look(set(begin), force_listing=first_available_now)
        except BrokerError as exc:
            return self._wait_for_broker(start, exc)
        self._unreachable_since = None
        fail = self._opts.fail_on_data_loss
        end: dict[TP, int] = {}
        origin: dict[TP, int] = {}  # where each partition's next read really begins, for the read limit
        for tp, pos in begin.items():
            if tp in view.gone:
                self._vanished(tp, pos)
                continue
            if tp not in view.available:
                end[tp] = origin[tp] = pos  # not listed right now: keep the position, decide later
                continue
            low, stop = view.available[tp]
            if stop < pos:
                # The partition now ends before our position: it was recreated or the broker lost its data.
                # Records acknowledged after the last look may be gone too, so, as in Spark, it is data loss.
                seen = self._seen_end.get(tp, pos)
                report_data_loss(
                    fail, tp[0], tp[1], pos, seen if seen > pos else None,
                    f"the partition was reset and now ends at {stop}; it is read again from offset {low}",
                )  # fmt: skip
                end[tp], origin[tp] = stop, low
            elif low > pos:
                report_data_loss(fail, tp[0], tp[1], pos, low, "the broker deleted them (retention or reset)")
                end[tp], origin[tp] = stop, low
            else:
                end[tp], origin[tp] = stop, pos
        for tp, (low, stop) in view.available.items():
            if tp not in begin:
                left_at = self._left_at.pop(tp, None)
                if left_at is not None and low < left_at:
                    report_data_loss(
                        fail, tp[0], tp[1], left_at, None,
                        f"the partition disappeared while the query was at this offset and came back starting at "
                        f"{low} (recreated, or the broker lost its data); it is read again from offset {low}",
                    )  # fmt: skip
                log.info("new partition %s/%d: reading from offset %d", tp[0], tp[1], low)
                end[tp], origin[tp] = stop, low
        self._remember(view)
        # Keep latest offsets of partitions we carried forward, so the lag does not drop them.
        for tp in end:
            self._latest.setdefault(tp, end[tp])
        if self._available_now:
            if self._target is None:
                self._target = dict(end)
            end = {
                tp: min(stop, self._target[tp]) if tp in self._target else stop for tp, stop in end.items()
            }
            # Partitions that appeared after the run started are left for the next run.
            end = {tp: stop for tp, stop in end.items() if tp in self._target or tp in begin}
        if isinstance(limit, ReadMaxRows):
            capped = rate_limit(
                origin, {tp: e for tp, e in end.items() if e >= origin.get(tp, 0)}, limit.max_rows
            )
            end.update(capped)
        return offsets_to_json(end)

    def _wait_for_broker(self, start: dict[str, Any], exc: BrokerError) -> dict[str, Any]:
        """No new offsets while the broker does not answer, until ``kafkaConsumer.pollTimeoutMs`` has passed.

        A frozen or restarting broker is an outage to ride out, as Kafka's own clients do: the query keeps
        its position and runs no new data until the broker is back. Only an outage longer than the poll
        time-out stops it.
        """
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        waited = now - self._unreachable_since
        if waited * 1000 > self._opts.poll_timeout_ms:
            raise BrokerError(
                f"{exc}; the broker has not answered for {waited:.0f} s, more than kafkaConsumer.pollTimeoutMs "
                f"({self._opts.poll_timeout_ms} ms): stopping (raise it to wait out longer outages)"
            ) from None
        log.warning(
            "the broker did not answer (%s); no new offsets this trigger (%.0f s so far)", exc, waited
        )
        return start

    def _vanished(self, tp: TP, pos: int) -> None:
        seen = self._seen_end.get(tp)
        self._seen_end.pop(tp, None)
        if seen is None:
            log.warning(
                "topic %r partition %d disappeared before this run saw its end; offsets from %d on may be lost",
                tp[0],
                tp[1],
                pos,
            )
        elif seen > pos:
            report_data_loss(
                self._opts.fail_on_data_loss, tp[0], tp[1], pos, seen, "the topic or partition was deleted"
            )
        else:
            self._left_at[tp] = pos
            log.info("topic %r partition %d disappeared after it was read to the end (%d)", tp[0], tp[1], pos)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:  # noqa: N802
        """The newest available offsets at the last trigger; Spark shows them as the source's ``latestOffset``.

        With the batch's ``endOffset`` they give the lag (``offsets_behind``): PySpark (4.2, 4.3) has no way for a
        Python source to add its own ``metrics`` to the query progress.
        """
        return offsets_to_json(self._latest) if self._latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Pack the batch's offset ranges into ``minPartitions`` (default 2) tasks."""
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        need_low = [tp for tp, e in stop.items() if tp not in begin or e < begin[tp]]
        lows = self.broker.lows(need_low) if need_low else {}
        return plan_partitions(self._opts, begin, stop, lows)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read the partition's offset ranges as Arrow record batches."""
        assert isinstance(partition, KafkaInputPartition)
        return read_ranges(self._opts, partition.ranges)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in Kafka consumer groups."""

    def stop(self) -> None:
        """Let the planning's admin client go; every consumer is closed right after use."""
        self._broker = None


class KafkaBatchReader(DataSourceReader):
    """``spark.read.format("sotw-kafka")``: the records between ``startingOffsets`` and ``endingOffsets``.

    Parameters
    ----------
    options
        The parsed source options (``startingOffsets`` defaults to ``earliest`` here).
    """

    def __init__(self, options: SourceOptions) -> None:
        if options.starting == "latest":
            raise ConfigError("startingOffsets=latest is not allowed for batch reads (nothing would be read)")
        self._opts = options

    def partitions(self) -> Sequence[InputPartition]:
        """Resolve the offsets now and pack the ranges into tasks."""
        view = OffsetReader(self._opts).look(set(), force_listing=True)
        start: dict[TP, int] = {}
        stop: dict[TP, int] = {}
        starting = self._opts.starting if isinstance(self._opts.starting, dict) else {}
        ending = self._opts.ending if isinstance(self._opts.ending, dict) else {}
        for tp, (low, end) in view.available.items():
            s = starting.get(tp, EARLIEST)
            e = ending.get(tp, LATEST)
            start[tp] = low if s == EARLIEST else end if s == LATEST else s
            stop[tp] = end if e in (LATEST, EARLIEST) else min(e, end)
            if start[tp] < low:
                report_data_loss(
                    self._opts.fail_on_data_loss, tp[0], tp[1], start[tp], low, "before the earliest offset"
                )
                start[tp] = low
            start[tp] = min(start[tp], stop[tp])
        return plan_partitions(self._opts, start, stop, {}) or [KafkaInputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read the partition's offset ranges as Arrow record batches."""
        assert isinstance(partition, KafkaInputPartition)
        return read_ranges(self._opts, partition.ranges)


class KafkaDataSource(DataSource):
    """The ``sotw-kafka`` data source: Spark's Kafka source options and rows, read with confluent-kafka.

    Registered by ``pipeline.spark.build_session``; options are checked when ``load()`` is called, so a
    typo fails before the query starts.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.from_options(options)

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.readStream.format("sotw-kafka")``."""
        return FORMAT

    def schema(self) -> StructType:
        """Spark's Kafka rows (key, value, topic, partition, offset, timestamp, timestampType), or packed rows."""
        return PACKED_SCHEMA if self.parsed.pack else SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader."""
        return KafkaStreamReader(self.parsed)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (``startingOffsets`` to ``endingOffsets``)."""
        return KafkaBatchReader(self.parsed)


# ---------------------------------------------------------------------------------------- worker side


def _arrow_schema(pack: bool) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Exactly the schema PySpark validates returned batches against.
    return to_arrow_schema(PACKED_SCHEMA if pack else SCHEMA, timezone="UTC")


class _Columns:
    """The accepted messages of one Arrow record batch; columns are built in one pass per column."""

    def __init__(self, pack: bool) -> None:
        self.msgs: list[Any] = []
        self.pack = pack

    def __len__(self) -> int:
        return len(self.msgs)

    def batch(self, schema: Any) -> Any:
        """The messages as one Arrow record batch of ``schema`` (packed or one row per message)."""
        import pyarrow as pa

        msgs = self.msgs
        if self.pack:
            return self._packed(schema)
        stamps = [m.timestamp() for m in msgs]
        return pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in msgs], pa.binary()),
                pa.array([m.value() for m in msgs], pa.binary()),
                pa.array([m.topic() for m in msgs], pa.string()),
                pa.array([m.partition() for m in msgs], pa.int32()),
                pa.array([m.offset() for m in msgs], pa.int64()),
                # confluent-kafka: (1 create time | 2 log-append time | 0 none, ms); Spark: 0, 1, -1 and us.
                pa.array([ts * 1000 if kind else None for kind, ts in stamps], pa.timestamp("us", tz="UTC")),
                pa.array([kind - 1 for kind, _ in stamps], pa.int32()),
            ],
            schema=schema,
        )

    def _packed(self, schema: Any) -> Any:
        """One row per (topic, partition, key), messages in the order read (offset order within a partition)."""
        import pyarrow as pa

        msgs = self.msgs
        groups: dict[tuple[str, int, bytes | None], list[int]] = {}
        for i, m in enumerate(msgs):
            tpk = (m.topic(), m.partition(), m.key())
            members = groups.get(tpk)
            if members is None:
                groups[tpk] = [i]
            else:
                members.append(i)
        order = pa.array([i for members in groups.values() for i in members], pa.int64())
        bounds = [0]
        for members in groups.values():
            bounds.append(bounds[-1] + len(members))
        list_offsets = pa.array(bounds, pa.int32())
        stamps = [m.timestamp() for m in msgs]
        offsets = pa.array([m.offset() for m in msgs], pa.int64()).take(order)
        values = pa.array([m.value() for m in msgs], pa.binary()).take(order)
        times = pa.array([ts if kind else None for kind, ts in stamps], pa.int64()).take(order)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([k for _, _, k in groups], pa.binary()),
                pa.array([t for t, _, _ in groups], pa.string()),
                pa.array([p for _, p, _ in groups], pa.int32()),
                pa.ListArray.from_arrays(list_offsets, offsets, type=schema.field("offsets").type),
                pa.ListArray.from_arrays(list_offsets, values, type=schema.field("values").type),
                pa.ListArray.from_arrays(list_offsets, times, type=schema.field("timestamps").type),
            ],
            schema=schema,
        )


def _rounds(ranges: Sequence[OffsetRange]) -> list[list[OffsetRange]]:
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
    rounds: list[list[OffsetRange]] = []
    seen: dict[TP, int] = {}
    for r in merged:
        i = seen.get((r.topic, r.partition), -1) + 1
        seen[(r.topic, r.partition)] = i
        if i == len(rounds):
            rounds.append([])
        rounds[i].append(r)
    return rounds


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
    schema = _arrow_schema(options.pack)
    consumer = options.kafka.consumer(**reader_settings(options))
    try:
        with gc_paused():
            for group in _rounds(ranges):
                yield from _read_round(consumer, options, group, schema)
    finally:
        consumer.close()


def _read_round(
    consumer: Any, options: SourceOptions, group: list[OffsetRange], schema: Any
) -> Iterator[Any]:
    from confluent_kafka import KafkaError, TopicPartition

    # pending: partition -> [next offset, end]
    pending: dict[TP, list[int]] = {(r.topic, r.partition): [r.start, r.end] for r in group}
    now = time.monotonic()
    # The consumer, not each partition, is watched for stalls: while records of some partitions keep coming,
    # the others are just waiting their turn in librdkafka's fetch queue, not missing.
    progress = [now]  # when the last record of any partition was accepted
    checked = dict.fromkeys(pending, now)
    consumer.assign([TopicPartition(t, p, r[0]) for (t, p), r in pending.items()])
    cols = _Columns(options.pack)
    fail = options.fail_on_data_loss
    recheck_codes = {
        KafkaError._AUTO_OFFSET_RESET,
        KafkaError.OFFSET_OUT_OF_RANGE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._PARTITION_EOF,
    }

    def finish(tp: TP) -> None:
        if pending.pop(tp, None) is not None:
            consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])

    def diagnose(tp: TP) -> None:
        """The partition stopped delivering before its end: find out whether its records still exist."""
        pos, stop = pending[tp]
        checked[tp] = time.monotonic()
        state = _partition_state(options, tp)
        if state == GONE:
            report_data_loss(fail, tp[0], tp[1], pos, stop, "the topic or partition was deleted")
            finish(tp)
            return
        if isinstance(state, str):  # UNKNOWN: ask again at the next stall check, up to the poll time-out
            if time.monotonic() - progress[0] > options.poll_timeout_ms / 1000:
                raise SourceTimeoutError(
                    f"no records from topic {tp[0]!r} partition {tp[1]} at offset {pos} within "
                    f"{options.poll_timeout_ms} ms, and the broker did not answer whether they exist "
                    "(raise kafkaConsumer.pollTimeoutMs to wait out longer broker outages)"
                )
            return
        low, end = state
        if end <= pos:
            report_data_loss(fail, tp[0], tp[1], pos, stop, f"the partition was reset and now ends at {end}")
            finish(tp)
        elif low > pos:
            report_data_loss(fail, tp[0], tp[1], pos, min(low, stop), "the broker deleted them")
            if low >= stop:
                finish(tp)
            else:
                pending[tp][0] = low
                consumer.seek(TopicPartition(tp[0], tp[1], low))
                progress[0] = time.monotonic()
        elif end < stop:
            report_data_loss(fail, tp[0], tp[1], end, stop, f"the partition now ends at {end}")
            pending[tp][1] = end
        elif time.monotonic() - progress[0] > options.poll_timeout_ms / 1000:
            raise SourceTimeoutError(
                f"no records from topic {tp[0]!r} partition {tp[1]} at offset {pos} within "
                f"{options.poll_timeout_ms} ms although the broker has offsets up to {end} "
                "(raise kafkaConsumer.pollTimeoutMs if the broker is just slow)"
            )

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
            progress[0] = now
            if state[0] >= state[1]:
                finish(tp)
        if len(cols) >= ARROW_BATCH_ROWS:
            yield cols.batch(schema)
            cols = _Columns(options.pack)
            accept = cols.msgs.append
        if now - progress[0] > STALL_CHECK_S:
            for tp in [tp for tp in pending if now - checked[tp] > STALL_CHECK_S]:
                diagnose(tp)
    if len(cols):
        yield cols.batch(schema)
    consumer.unassign()


GONE = "gone"
"""``_partition_state``: the listing positively says the topic or partition no longer exists."""
UNKNOWN = "unknown"
"""``_partition_state``: the broker did not answer; a hang or a restart is not data loss."""


def _partition_state(
    options: SourceOptions, tp: TP, timeout: float = METADATA_TIMEOUT_S
) -> tuple[int, int] | str:
    """``(low, end)`` of one partition asked afresh, ``GONE`` if it no longer exists, ``UNKNOWN`` if unsure.

    Only an answer that lists the topic without the partition (or lists the topic as unknown) proves it
    gone; an error or a time-out proves nothing, and calling it data loss would stop a ``failOnDataLoss``
    query on a broker that is merely slow, frozen or restarting.
    """
    from confluent_kafka import KafkaError, KafkaException

    ends = EndOffsets(options.kafka, timeout=timeout)
    try:
        metadata = ends.admin.list_topics(tp[0], timeout=timeout)
        topic = metadata.topics.get(tp[0])
        if topic is None or (
            topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        ):
            return GONE
        if topic.error is not None:
            log.warning("could not check %s/%d: %s", tp[0], tp[1], topic.error)
            return UNKNOWN
        if tp[1] not in topic.partitions:
            return GONE
        return ends([tp])[tp]
    except (KafkaException, BrokerError) as exc:
        log.warning("could not check %s/%d (the broker did not answer): %s", tp[0], tp[1], exc)
        return UNKNOWN


# --------------------------------------------------------------------------------------------- lag


def offsets_behind(source_progress: Mapping[str, Any]) -> Lag | None:
    """Lag of one trigger from a source's progress (``query.lastProgress["sources"][0]``).

    PySpark (4.2, 4.3) does not let a Python source add ``metrics`` to its progress, so this source reports the
    newest available offsets as the progress' ``latestOffset`` and the lag is computed from it and the
    batch's ``endOffset`` here, exactly as Spark's Kafka source computes ``maxOffsetsBehindLatest``. It works
    for Spark's own Kafka source too, whose progress has the same two fields. ``None`` when either is absent.
    """
    latest, consumed = source_progress.get("latestOffset"), source_progress.get("endOffset")
    if not latest or not consumed:
        return None
    try:
        return lag(offsets_from_json(consumed), offsets_from_json(latest))
    except (ValueError, json.JSONDecodeError):
        return None
