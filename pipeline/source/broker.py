"""What the ``sotw-kafka`` source asks the broker: which partitions match, and where each one starts and ends.

``OffsetReader`` is the driver's view, one admin client for the whole query (two requests per look, whatever
the partition count); ``partition_state`` is a reader's fresh look at one partition that stopped delivering,
which tells a partition that is gone from a broker that merely did not answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.source.offsets import TP
from pipeline.source.options import SourceOptions
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 10.0
"""How long the driver waits for the broker when listing topics and reading offsets."""


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

    def first_since(self, tp: TP, timestamp_ms: int) -> int | None:
        """The first offset of ``tp`` written at or after ``timestamp_ms``; None if the broker cannot say."""
        try:
            return self._ends.first_at(tp, timestamp_ms)
        except BrokerError as exc:
            log.warning("could not find where %s/%d diverged: %s", tp[0], tp[1], exc)
            return None


GONE = "gone"
"""``partition_state``: the listing positively says the topic or partition no longer exists."""
UNKNOWN = "unknown"
"""``partition_state``: the broker did not answer; a hang or a restart is not data loss."""


def partition_state(
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
