"""Kafka offset bookkeeping for the ``sotw-kafka`` source: offset JSON, read limits, task packing and lag.

Everything here is pure (no broker, no Spark), so the arithmetic the source depends on for exactly-once reads
is tested on its own. Offsets travel between Spark and the source as Spark's Kafka source writes them:
``{"topic": {"0": 23, "1": 42}}``, where each number is the *next* offset to read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TP = tuple[str, int]
"""A topic-partition: ``(topic, partition)``."""

EARLIEST = -2
"""In a ``startingOffsets`` / ``endingOffsets`` JSON, the partition's earliest available offset."""
LATEST = -1
"""In a ``startingOffsets`` / ``endingOffsets`` JSON, the partition's end (last offset + 1)."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic-partition that one task reads.

    Parameters
    ----------
    topic, partition
        Which partition.
    start
        First offset to read.
    end
        One past the last offset to read; the reader stops there even if the partition has grown since.
    """

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(
                f"offset range of {self.topic}/{self.partition} must be 0 <= start <= end, got {self}"
            )

    @property
    def size(self) -> int:
        """How many offsets the range spans."""
        return self.end - self.start


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Turn ``{(topic, partition): offset}`` into Spark's Kafka offset JSON, in a canonical order.

    The order matters: Spark decides that a trigger has no new data by comparing the offset JSON it got
    from ``latestOffset`` with the batch start as strings, so equal offsets must serialize identically.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def offsets_from_json(data: Mapping[str, Any] | None) -> dict[TP, int]:
    """Inverse of ``offsets_to_json``; also accepts a JSON string, and ``None`` as no offsets."""
    if data is None:
        return {}
    if isinstance(data, str):
        data = json.loads(data)
        if not isinstance(data, Mapping):
            raise ValueError(f"offsets must be a JSON object, got {data!r}")
    out: dict[TP, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, Mapping):
            raise ValueError(
                f"offsets of topic {topic!r} must be an object of partition: offset, got {parts!r}"
            )
        for partition, offset in parts.items():
            try:
                out[(str(topic), int(partition))] = int(offset)
            except (TypeError, ValueError):
                raise ValueError(
                    f"offset of topic {topic!r} partition {partition!r} must be an integer, got {offset!r}"
                ) from None
    return out


def parse_offset_spec(option: str, value: str, allowed: tuple[str, ...]) -> str | dict[TP, int]:
    """Parse a ``startingOffsets`` / ``endingOffsets`` option: one of ``allowed`` words, or an offset JSON.

    In the JSON, ``-2`` means earliest and ``-1`` means latest, as in Spark's Kafka source.

    Raises
    ------
    ValueError
        Naming the option and the bad value.
    """
    text = value.strip()
    if text.lower() in allowed:
        return text.lower()
    if not text.startswith("{"):
        raise ValueError(f"{option} must be {' or '.join(allowed)} or a JSON object, got {value!r}")
    try:
        offsets = offsets_from_json(json.loads(text))
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"{option} is not a valid offset JSON ({exc}): {value!r}") from None
    for (topic, partition), offset in offsets.items():
        if offset < EARLIEST:
            raise ValueError(f"{option}: offset {offset} of {topic}/{partition} must be >= -2")
    return offsets


def rate_limit(start: Mapping[TP, int], end: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """Cut ``end`` down so that at most ``limit`` offsets lie between ``start`` and the result.

    The budget is shared in proportion to each partition's backlog, as Spark's Kafka source does, but the
    shares are rounded down and the remainder handed out by largest fraction, so the total never exceeds
    ``limit`` (Spark rounds small shares up and can overshoot). Partitions missing from ``start`` begin at 0;
    partitions whose end is before their start (an offset reset) are passed through unchanged.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    sizes = {tp: e - start.get(tp, 0) for tp, e in end.items() if e - start.get(tp, 0) > 0}
    total = sum(sizes.values())
    if total <= limit:
        return dict(end)
    shares = {tp: limit * size / total for tp, size in sizes.items()}
    grant = {tp: math.floor(share) for tp, share in shares.items()}
    left = limit - sum(grant.values())
    # Hand out what rounding left over, biggest fraction first (ties by name for determinism).
    for tp in sorted(shares, key=lambda t: (grant[t] - shares[t], t))[:left]:
        grant[tp] += 1
    out = dict(end)
    for tp, size in sizes.items():
        out[tp] = start.get(tp, 0) + min(size, grant[tp])
    return out


def pack_ranges(
    ranges: Iterable[OffsetRange], tasks: int, min_split: int = 10_000
) -> list[list[OffsetRange]]:
    """Group offset ranges into at most ``tasks`` balanced groups, one per Spark task.

    Each Spark task costs a Python worker round trip and a Kafka consumer, so hundreds of small partitions
    become a handful of tasks instead of one task each. A range larger than a fair share (and larger than
    ``min_split`` offsets) is split into pieces so that one busy partition does not leave the other cores
    idle; the pieces are then placed largest first onto the least loaded group. Empty ranges are dropped.
    """
    if tasks < 1:
        raise ValueError(f"tasks must be at least 1, got {tasks}")
    items = [r for r in ranges if r.size > 0]
    if not items:
        return []
    total = sum(r.size for r in items)
    share = max(math.ceil(total / tasks), min_split)
    pieces: list[OffsetRange] = []
    for r in items:
        if r.size <= share:
            pieces.append(r)
            continue
        n = math.ceil(r.size / share)
        step = math.ceil(r.size / n)
        for lo in range(r.start, r.end, step):
            pieces.append(OffsetRange(r.topic, r.partition, lo, min(lo + step, r.end)))
    groups: list[list[OffsetRange]] = [[] for _ in range(min(tasks, len(pieces)))]
    loads = [0] * len(groups)
    for piece in sorted(pieces, key=lambda r: (-r.size, r.topic, r.partition, r.start)):
        i = loads.index(min(loads))
        groups[i].append(piece)
        loads[i] += piece.size
    for group in groups:
        group.sort(key=lambda r: (r.topic, r.partition, r.start))
    return groups


@dataclass(frozen=True)
class Lag:
    """How far a query is behind the newest data, in offsets, after one trigger.

    Attributes mirror the metric names of Spark's Kafka source (``offsetsBehindLatest`` is the total, which
    Spark's source does not report).
    """

    offsetsBehindLatest: int  # noqa: N815 (named as Spark names the metric)
    maxOffsetsBehindLatest: int  # noqa: N815
    minOffsetsBehindLatest: int  # noqa: N815
    avgOffsetsBehindLatest: float  # noqa: N815
    partitions: int

    def as_metrics(self) -> dict[str, str]:
        """The lag as a progress ``metrics`` map (strings, as Spark's source metrics are)."""
        return {
            "offsetsBehindLatest": str(self.offsetsBehindLatest),
            "maxOffsetsBehindLatest": str(self.maxOffsetsBehindLatest),
            "minOffsetsBehindLatest": str(self.minOffsetsBehindLatest),
            "avgOffsetsBehindLatest": str(self.avgOffsetsBehindLatest),
        }


def lag(consumed: Mapping[TP, int], latest: Mapping[TP, int]) -> Lag | None:
    """Offsets between what a trigger consumed up to and the newest available, per partition of ``latest``.

    Partitions the query has not started yet count from 0 (all of them is lag). ``None`` when ``latest``
    is empty (nothing to be behind of).
    """
    if not latest:
        return None
    behind = [max(0, end - consumed.get(tp, 0)) for tp, end in latest.items()]
    return Lag(
        offsetsBehindLatest=sum(behind),
        maxOffsetsBehindLatest=max(behind),
        minOffsetsBehindLatest=min(behind),
        avgOffsetsBehindLatest=sum(behind) / len(behind),
        partitions=len(behind),
    )


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
