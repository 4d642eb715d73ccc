"""Kafka lag as a run samples it: from the pipeline's checkpoint, a consumer group's commits, or what the broker says, with the age of the oldest message not yet read."""

from __future__ import annotations

import json
import re
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from sotw.kafka import EndOffsets, KafkaConfig


def checkpoint_position(checkpoint: Path) -> dict[tuple[str, int], int]:
    """The source offsets of the last batch the query committed: where it will read next.

    Spark writes ``offsets/<batch>`` (version line, metadata line, one line per source) before a batch and
    ``commits/<batch>`` after it; the committed batch's end offsets are the query's position. A Kafka
    source's line, sotw's or Spark's own, is ``{"topic": {"partition": offset}}``; a query with several
    sources has one line each (all are merged), and a line that is not such an object (``-`` for a source
    without offsets yet, another kind of source) is skipped.
    """
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return {}
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    if not done:
        return {}
    try:
        lines = (checkpoint / "offsets" / str(done[-1])).read_text().splitlines()
    except OSError:
        return {}
    position: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if not isinstance(offsets, dict):
            continue
        for topic, parts in offsets.items():
            if isinstance(parts, dict):
                for part, offset in parts.items():
                    if str(part).lstrip("-").isdigit() and isinstance(offset, int):
                        position[(str(topic), int(part))] = offset
    return position


class LagSource(Protocol):
    """Where a job's position (the next offset it will read, per partition) is read from."""

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The job's position on ``partitions`` (a partition it has not started on may be absent)."""
        ...


class CheckpointLag:
    """The position of any Spark Structured Streaming query, from its checkpoint (``checkpoint_position``)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The last committed batch's end offsets."""
        return checkpoint_position(self.checkpoint)

    def describe(self) -> str:
        """For logs and the report."""
        return f"checkpoint {self.checkpoint}"


class GroupLag:
    """The position of a consumer that commits its offsets to Kafka (Kafka Streams, Flink, a plain consumer).

    Reads the group's committed offsets (OffsetFetch) with a consumer that never joins the group, so the
    job's own consumers are not rebalanced by being watched.
    """

    def __init__(self, kafka: KafkaConfig, group: str, timeout: float = 10.0) -> None:
        self.group = group
        self._consumer = kafka.consumer(**{"group.id": group, "enable.auto.commit": False})
        self._timeout = timeout

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The committed offsets (a partition without one is absent)."""
        from confluent_kafka import TopicPartition

        if not partitions:
            return {}
        committed = self._consumer.committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=self._timeout
        )
        return {(tp.topic, tp.partition): int(tp.offset) for tp in committed if tp.offset >= 0}

    def describe(self) -> str:
        """For logs and the report."""
        return f"consumer group {self.group}"

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class AppendTimes:
    """When each offset of one partition reached the broker, estimated from its end offset seen over time.

    Each end offset is kept with the first and the last time it was seen; the offsets from one end to the
    next were appended between the last time the first was seen and the first time the next was, and are
    dated by linear interpolation (the load is open-loop and steady within a second). This dates a
    partition's oldest unprocessed message without fetching it, as Kafka lag exporters estimate lag in time
    from an offset-time table. Entries the position has passed are dropped.
    """

    def __init__(self) -> None:
        self._points: deque[list[float]] = deque()  # [first seen, last seen, end offset]

    def seen(self, when: float, end: int) -> None:
        """The partition's end offset was ``end`` at ``when`` (epoch seconds)."""
        if self._points and end == self._points[-1][2]:
            self._points[-1][1] = when
        elif not self._points or end > self._points[-1][2]:
            self._points.append([when, when, end])

    def appended_at(self, offset: int) -> float | None:
        """When the record at ``offset`` was appended (epoch seconds), or None if not yet seen.

        A record below the first end seen is dated at the first sample: it was there then, and an age
        measured from it is a lower bound.
        """
        points = self._points
        while len(points) >= 2 and points[1][2] <= offset:
            points.popleft()  # the position has passed this entry for good
        if not points or points[-1][2] <= offset:
            return None
        first, _, end = points[0]
        if end > offset:
            return first
        _, since, start = points[0]
        until, _, end = points[1]
        return since + (until - since) * (offset + 1 - start) / (end - start)


class KafkaLagProbe:
    """Offsets behind the latest (total, max per partition) and the age of the oldest unprocessed message.

    The end of a partition is its high watermark (``sotw.kafka.EndOffsets``). The age is dated from the end
    offsets this probe reads anyway (``AppendTimes``), so no record is fetched.
    A partition that appears between two topic listings is dated from the earlier listing, when it did not
    exist yet.

    Parameters
    ----------
    kafka
        Cluster to read end offsets from.
    pattern
        The pipeline's topic regex.
    checkpoint
        The pipeline's checkpoint (its position), or another ``LagSource`` (``GroupLag``).
    list_every_s
        How often topics are listed again (new sensors' topics).
    report_consumed
        Also report ``consumed``, the offsets the job has passed on the run's topics (for a job without
        sotw's progress log; the run's topics are new, so they start at offset 0).

    Attributes
    ----------
    topics
        The last sample per topic: ``{topic: (offsets behind, age of its oldest unprocessed message, s)}``.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        pattern: str,
        checkpoint: Path | LagSource,
        list_every_s: float = 5.0,
        report_consumed: bool = False,
    ) -> None:
        self._regex = re.compile(pattern)
        self._source = CheckpointLag(checkpoint) if isinstance(checkpoint, Path) else checkpoint
        self._report_consumed = report_consumed
        self._ends = EndOffsets(kafka)
        self._partitions: list[tuple[str, int]] = []
        self._list_every_s = list_every_s
        self._listed: float | None = None  # epoch seconds of the last listing
        self._appended: dict[tuple[str, int], AppendTimes] = {}
        self.topics: dict[str, tuple[int, float]] = {}

    def _topic_partitions(self) -> list[tuple[str, int]]:
        now = time.time()
        if self._listed is None or now - self._listed > self._list_every_s:
            # Listed on the client the offsets are read with: its metadata cache finds new partitions' leaders.
            meta = self._ends.admin.list_topics(timeout=10)
            self._partitions = sorted(
                (name, p)
                for name, topic in meta.topics.items()
                if self._regex.fullmatch(name)
                for p in topic.partitions
            )
            for tp in self._partitions:
                if tp not in self._appended:
                    self._appended[tp] = AppendTimes()
                    if self._listed is not None:
                        self._appended[tp].seen(self._listed, 0)
            self._listed = now
        return self._partitions

    def sample(self) -> dict[str, Any]:
        """Lag totals now."""
        parts = self._topic_partitions()
        position = self._source.position(parts)
        ends = self._ends(parts)
        now = time.time()
        behind: dict[tuple[str, int], int] = {}
        oldest = now
        per_topic: dict[str, tuple[int, float]] = {}
        for tp, (low, end) in ends.items():
            at = max(position.get(tp, low), low)
            behind[tp] = max(0, end - at)
            appended = self._appended.setdefault(tp, AppendTimes())
            appended.seen(now, end)
            offsets, topic_oldest = per_topic.get(tp[0], (0, now))
            if behind[tp]:
                since = appended.appended_at(at) or now
                oldest, topic_oldest = min(oldest, since), min(topic_oldest, since)
            per_topic[tp[0]] = (offsets + behind[tp], topic_oldest)
        self.topics = {t: (n, round(now - since, 3)) for t, (n, since) in sorted(per_topic.items())}
        row = {
            "lag_offsets": sum(behind.values()),
            "lag_max_partition": max(behind.values(), default=0),
            "lag_age_s": round(now - oldest, 3),
            "topics": len({t for t, _ in parts}),
            "end_offsets_total": sum(end for _, end in ends.values()),
        }
        if self._report_consumed:
            row["consumed"] = sum(position.get(tp, 0) for tp in ends)
        return row

    def close(self) -> None:
        """Close the lag source's client, if it has one."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()
