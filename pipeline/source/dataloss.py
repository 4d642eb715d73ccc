"""Data-loss diagnosis for the ``sotw-kafka`` source: which offsets the query needed are gone, and what then.

Data is lost when offsets the query has still to read no longer exist: a topic or partition deleted, a
partition that now ends before the query's position (recreated, or a broker that lost its data), a low
watermark past it (retention). With ``failOnDataLoss`` the query stops with ``DataLossError``; without, the
same one-line message is logged and the query goes on from what exists (``report_data_loss``). It is judged
in two places:

* the driver, at every trigger: ``LossDetector`` holds the query's positions against the broker's view and
  remembers where each partition ended, so a partition that vanishes or comes back reset is recognised;
* a reader whose partition stopped delivering: ``judge_stall`` turns a fresh look at the partition
  (``pipeline.source.broker.partition_state``) into what the reader does next.

A broker that does not answer is an outage, never data loss: only an answer proves data gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import PipelineError
from pipeline.source.broker import GONE, BrokerView
from pipeline.source.offsets import TP
from pipeline.source.options import SourceOptions

log = logging.getLogger(__name__)

DIVERGENCE_MARGIN_MS = 2000
"""How far before the last look a truncated partition is read on from: a record made just before the look
(its timestamp is the producer's) may reach the new leader only after it, as a retry."""


class DataLossError(PipelineError):
    """Offsets the query still had to read are gone from Kafka, and ``failOnDataLoss`` is true.

    The message names the topic, the partition, the missing offset range and what happened.
    """


class SourceTimeoutError(PipelineError):
    """The broker reports records that a reader could not fetch within ``kafkaConsumer.pollTimeoutMs``."""


def report_data_loss(fail: bool, tp: TP, start: int, end: int | None, reason: str) -> None:
    """Stop with ``DataLossError`` or log a warning, as Spark's Kafka source does with ``failOnDataLoss``.

    The message is one line (it has to survive being quoted inside Spark's error) and names the topic,
    the partition and the missing offsets ``[start, end)`` (``end=None``: from ``start`` on, extent unknown).
    """
    topic, partition = tp
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


class LossDetector:
    """The driver's memory of the partitions it has seen, to tell data that is gone from data that is new.

    One per query, in the driver's long-lived source runner. It remembers the end of every partition at the
    last look (``remember``), and where a partition that vanished after being read to its end was, so that
    one coming back starting below that is known to have been reset while the query ran.

    Parameters
    ----------
    fail
        ``failOnDataLoss``: stop at lost data rather than warn.
    first_since
        ``(tp, timestamp_ms) -> offset``: the first offset of a partition written at or after a time, or None
        if the broker cannot say (``OffsetReader.first_since``); it finds where a truncated log parts from
        what the query read. Without it such a partition is read again from its earliest offset.
    """

    def __init__(self, fail: bool, first_since: Callable[[TP, int], int | None] | None = None) -> None:
        self.fail = fail
        self._first_since = first_since
        self._seen_end: dict[TP, int] = {}
        # When each partition was last listed (wall-clock ms): records written after it are new to the query.
        self._seen_at: dict[TP, int] = {}
        # Partitions that disappeared after the query had read them to the end, and where it was: if one comes
        # back starting below that, it was reset (recreated, or a broker that lost its data) while running.
        self._left_at: dict[TP, int] = {}

    def remember(self, view: BrokerView) -> None:
        """Keep the end of every partition ``view`` lists, for the next trigger's judgement."""
        now = int(time.time() * 1000)
        for tp, (_, end) in view.available.items():
            self._seen_end[tp] = end
            self._seen_at[tp] = now

    def resume(self, begin: dict[TP, int], view: BrokerView) -> tuple[dict[TP, int], dict[TP, int]]:
        """Where each partition's next batch ends and where its read really begins, reporting what is lost.

        ``begin`` is the query's position (the last batch's end offsets); ``view`` the broker's look at this
        trigger. A partition positively gone, one that now ends before the position, one whose low watermark
        passed it, and one that came back reset are data loss; a partition not listed this time keeps its
        position; a new one is read from its earliest offset. Call ``remember(view)`` afterwards.

        Returns
        -------
        tuple
            ``(end, origin)``: ``{tp: offset}`` of the newest offsets to read up to, and of the offsets the
            reads begin at (past any loss), which the read limit is shared from.
        """
        fail = self.fail
        end: dict[TP, int] = {}
        origin: dict[TP, int] = {}
        for tp, pos in begin.items():
            if tp in view.gone:
                self._vanished(tp, pos)
                continue
            if tp not in view.available:
                end[tp] = origin[tp] = pos  # not listed right now: keep the position, decide later
                continue
            low, stop = view.available[tp]
            if stop < pos:
                # The partition now ends before our position: its log was truncated (an unclean leader
                # election), recreated, or lost by the broker. What the query had seen beyond it is gone.
                seen = self._seen_end.get(tp, pos)
                begin_at = self._diverged(tp, low, stop)
                report_data_loss(
                    fail, tp, pos, seen if seen > pos else None,
                    f"the partition was reset and now ends at {stop}; it is read on from offset {begin_at}, "
                    "the first record written since the query last saw it",
                )  # fmt: skip
                end[tp], origin[tp] = stop, begin_at
            elif low > pos:
                report_data_loss(fail, tp, pos, low, "the broker deleted them (retention or reset)")
                end[tp], origin[tp] = stop, low
            else:
                end[tp], origin[tp] = stop, pos
        for tp, (low, stop) in view.available.items():
            if tp not in begin:
                left_at = self._left_at.pop(tp, None)
                if left_at is not None and low < left_at:
                    report_data_loss(
                        fail, tp, left_at, None,
                        f"the partition disappeared while the query was at this offset and came back starting at "
                        f"{low} (recreated, or the broker lost its data); it is read again from offset {low}",
                    )  # fmt: skip
                log.info("new partition %s/%d: reading from offset %d", tp[0], tp[1], low)
                end[tp], origin[tp] = stop, low
        return end, origin

    def _diverged(self, tp: TP, low: int, stop: int) -> int:
        """Where the truncated log of ``tp`` parts from what the query read: the first record since the last look.

        That is the first record written since the last look that still saw the query's position (less
        ``DIVERGENCE_MARGIN_MS``). The records below it are the ones the query has read already: after an unclean leader election they
        are the new leader's copy of the old log, written at least ``replica.lag.time.max.ms`` before the
        election (the follower had fallen that far behind to leave the in-sync replicas). Reading from the
        earliest offset instead would repeat every row of them; reading from the new end would miss the
        records written since the election. A recreated topic or a broker that lost its data holds only
        new records, and they are all read. If the broker cannot say, the partition is read from ``low``.
        """
        seen_at = self._seen_at.get(tp)
        if self._first_since is None or seen_at is None:
            return low
        found = self._first_since(tp, seen_at - DIVERGENCE_MARGIN_MS)
        return low if found is None else max(low, min(found, stop))

    def _vanished(self, tp: TP, pos: int) -> None:
        """The listing says ``tp`` is gone while the query was at ``pos``: loss if it had not been read to its end."""
        seen = self._seen_end.pop(tp, None)
        if seen is None:
            log.warning(
                "topic %r partition %d disappeared before this run saw its end; offsets from %d on may be lost",
                tp[0],
                tp[1],
                pos,
            )
        elif seen > pos:
            report_data_loss(self.fail, tp, pos, seen, "the topic or partition was deleted")
        else:
            self._left_at[tp] = pos
            log.info("topic %r partition %d disappeared after it was read to the end (%d)", tp[0], tp[1], pos)


# ---------------------------------------------------------------------------------------- reader side


@dataclass(frozen=True)
class StallVerdict:
    """What a reader does with a partition that stopped delivering before the end of its range.

    All defaults: nothing proven, ask again at the next stall check.

    Attributes
    ----------
    finish
        Nothing more of the range exists: stop reading the partition.
    resume_at
        The records before this offset are gone: read on from it.
    end_at
        The partition now ends here, before the range's end: read only up to it.
    """

    finish: bool = False
    resume_at: int | None = None
    end_at: int | None = None


WAIT = StallVerdict()
FINISH = StallVerdict(finish=True)


def judge_stall(
    options: SourceOptions, tp: TP, pos: int, stop: int, state: tuple[int, int] | str, quiet_s: float
) -> StallVerdict:
    """Judge a partition that delivered nothing at ``pos`` of its range ``[pos, stop)``.

    ``state`` is ``partition_state``'s fresh answer (``(low, end)``, ``GONE`` or ``UNKNOWN``) and ``quiet_s``
    how long the reader has gone without any record. Lost offsets are reported (``report_data_loss``: raises
    under ``failOnDataLoss``).

    Raises
    ------
    SourceTimeoutError
        When the reader has waited longer than ``kafkaConsumer.pollTimeoutMs`` for records that exist, or for
        a broker that does not answer whether they do.
    """
    fail, patience_s = options.fail_on_data_loss, options.poll_timeout_ms / 1000
    if state == GONE:
        report_data_loss(fail, tp, pos, stop, "the topic or partition was deleted")
        return FINISH
    if isinstance(state, str):  # UNKNOWN: ask again at the next stall check, up to the poll time-out
        if quiet_s > patience_s:
            raise SourceTimeoutError(
                f"no records from topic {tp[0]!r} partition {tp[1]} at offset {pos} within "
                f"{options.poll_timeout_ms} ms, and the broker did not answer whether they exist "
                "(raise kafkaConsumer.pollTimeoutMs to wait out longer broker outages)"
            )
        return WAIT
    low, end = state
    if end <= pos:
        report_data_loss(fail, tp, pos, stop, f"the partition was reset and now ends at {end}")
        return FINISH
    if low > pos:
        report_data_loss(fail, tp, pos, min(low, stop), "the broker deleted them")
        return FINISH if low >= stop else StallVerdict(resume_at=low)
    if end < stop:
        report_data_loss(fail, tp, end, stop, f"the partition now ends at {end}")
        return StallVerdict(end_at=end)
    if quiet_s > patience_s:
        raise SourceTimeoutError(
            f"no records from topic {tp[0]!r} partition {tp[1]} at offset {pos} within "
            f"{options.poll_timeout_ms} ms although the broker has offsets up to {end} "
            "(raise kafkaConsumer.pollTimeoutMs if the broker is just slow)"
        )
    return WAIT
