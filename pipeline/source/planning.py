"""The ``sotw-kafka`` source's planning, in the driver: which offsets each micro-batch reads, in which tasks.

``KafkaStreamReader`` is what Spark drives for a streaming query: the starting offsets, each trigger's end
offsets (capped by ``maxOffsetsPerTrigger``, fixed once under ``availableNow``), the lag it reports, and the
input partitions: the batch's offset ranges packed into ``minPartitions`` balanced tasks. ``KafkaBatchReader``
does the same once for ``spark.read``. One stream reader lives in the driver's Python source runner for the
whole query; the copies Spark pickles to the workers only run ``read`` (``pipeline.source.reading``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.errors import ConfigError
from pipeline.source.broker import BrokerView, OffsetReader
from pipeline.source.dataloss import LossDetector, report_data_loss
from pipeline.source.offsets import (
    EARLIEST,
    LATEST,
    TP,
    OffsetRange,
    offsets_from_json,
    offsets_to_json,
    pack_ranges,
    rate_limit,
)
from pipeline.source.options import SourceOptions
from pipeline.source.reading import read_ranges
from sotw.errors import BrokerError

log = logging.getLogger(__name__)


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
        self._losses = LossDetector(
            options.fail_on_data_loss, first_since=lambda tp, ms: self.broker.first_since(tp, ms)
        )
        # Where each partition found shorter than the query's position at the last trigger is read on from.
        self._read_on_from: dict[TP, int] = {}
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
        self._losses.remember(view)
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
                    why = "startingOffsets is before the earliest offset"
                    report_data_loss(self._opts.fail_on_data_loss, tp, wanted, low, why)
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

        This is also where vanished data is detected (``LossDetector.resume``): a partition the broker no
        longer has, an offset reset (the partition now ends before where we are), or a low watermark past
        where we are.
        """
        begin = offsets_from_json(start)
        first_available_now = self._available_now and self._target is None
        try:
            view = self.broker.look(set(begin), force_listing=first_available_now)
        except BrokerError as exc:
            return self._wait_for_broker(start, exc)
        self._unreachable_since = None
        # Where each partition's read begins and ends; what is gone since the last trigger is data loss.
        end, origin = self._losses.resume(begin, view)
        self._read_on_from = {tp: origin[tp] for tp, stop in end.items() if tp in begin and stop < begin[tp]}
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

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:  # noqa: N802
        """The newest available offsets at the last trigger; Spark shows them as the source's ``latestOffset``.

        With the batch's ``endOffset`` they give the lag (``pipeline.source.offsets.offsets_behind``): PySpark
        (4.2, 4.3) has no way for a Python source to add its own ``metrics`` to the query progress.
        """
        return offsets_to_json(self._latest) if self._latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Pack the batch's offset ranges into ``minPartitions`` (default 2) tasks."""
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        need_low = [tp for tp, e in stop.items() if tp not in begin or e < begin[tp]]
        # A truncated partition goes on from where its log diverged (``LossDetector``); after a restart,
        # when that is no longer known, from its earliest offset.
        known = {tp: self._read_on_from[tp] for tp in need_low if tp in self._read_on_from}
        ask = [tp for tp in need_low if tp not in known]
        lows = (self.broker.lows(ask) if ask else {}) | known
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
                    self._opts.fail_on_data_loss, tp, start[tp], low, "before the earliest offset"
                )
                start[tp] = low
            start[tp] = min(start[tp], stop[tp])
        return plan_partitions(self._opts, start, stop, {}) or [KafkaInputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Read the partition's offset ranges as Arrow record batches."""
        assert isinstance(partition, KafkaInputPartition)
        return read_ranges(self._opts, partition.ranges)
