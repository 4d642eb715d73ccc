"""The integrity record: what a policy found wrong with a session's stream, and where in Kafka, as one value.

A policy that meets a gap, a duplicate or any other anomaly describes it once, as an ``IntegrityRecord``; the
same value becomes a row of the ``integrity`` dataset (``pipeline.records.Records.integrity``), the message of
the ``IntegrityViolation`` that stops a strict run, and, for a malformed message, its dead letter. Nothing here
imports Spark, Arrow or the rules, so every layer can take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


class Position(NamedTuple):
    """Where a message sits in Kafka: every record names it, and a strict stop points the user to it."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class IntegrityRecord:
    """One detected violation of a session's integrity, so the harness can match it with an injected fault.

    Parameters
    ----------
    violation
        Which rule was broken (``pipeline.records.VIOLATIONS``).
    sensor, session
        Whose stream broke (None where a malformed message does not say).
    at
        Where the message it is about sits (for a timeout or a gap given up at close: the session's last one).
    event_ms
        The message's event time (``ts``; the Kafka timestamp for a malformed message), if known.
    seq
        The seq of the message it is about, if known.
    expected_seq, got_seq
        The seq the policy expected next and the one that came.
    missing
        The seqs a gap skipped, ``(first, last)`` inclusive.
    detail
        What became of the message, in words.
    """

    violation: str
    sensor: str | None
    session: str | None
    at: Position
    event_ms: int | None = None
    seq: int | None = None
    expected_seq: int | None = None
    got_seq: int | None = None
    missing: tuple[int, int] | None = None
    detail: str | None = None

    def as_row(self) -> dict[str, Any]:
        """The record as a row of the stateful step's output (``record`` = ``integrity``), by column name."""
        missing_from, missing_to = self.missing if self.missing is not None else (None, None)
        return {
            "record": "integrity",
            "violation": self.violation,
            "sensor": self.sensor,
            "session": self.session,
            "topic": self.at.topic,
            "partition": self.at.partition,
            "offset": self.at.offset,
            "event_ms": self.event_ms,
            "seq": self.seq,
            "expected_seq": self.expected_seq,
            "got_seq": self.got_seq,
            "missing_from": missing_from,
            "missing_to": missing_to,
            "detail": self.detail,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> IntegrityRecord:
        """The record ``as_row`` describes (other keys of ``row``, such as ``record``, are ignored)."""
        lo, hi = row.get("missing_from"), row.get("missing_to")
        return cls(
            row["violation"], row.get("sensor"), row.get("session"),
            Position(row["topic"], int(row["partition"]), int(row["offset"])), event_ms=row.get("event_ms"),
            seq=row.get("seq"), expected_seq=row.get("expected_seq"), got_seq=row.get("got_seq"),
            missing=None if lo is None or hi is None else (int(lo), int(hi)), detail=row.get("detail"),
        )  # fmt: skip
