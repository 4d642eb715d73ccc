"""Triage: for each discrepancy, which layer lost or changed the message, checked the way on-call would.

The order is the on-call engineer's: did the producer send it (the ledger's ``sent_ts`` and delivery
report)? Is it in Kafka (read back with an independent assign-only consumer at the partition and offset
the delivery report gave, comparing the value's SHA-256 with the ledger's)? If both hold, the pipeline lost
it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pandas as pd
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from loadtest.correctness.brokerloss import partition_lives, reissued
from loadtest.reports.results import Discrepancy, Triage
from sotw.errors import BrokerError
from sotw.kafka import EndOffsets, KafkaConfig

log = logging.getLogger(__name__)

# Discrepancies about one message, whose seq can be traced through the layers.
MESSAGE_KINDS = frozenset(
    {
        "lost_row",
        "missing_session",
        "malformed_not_quarantined",
        "false_violation",
        "not_delivered",
        "broker_lost",
    }
)
# Rows with values other than a message carried: traced through the layers when they name that message's seq.
WRONG_KINDS = frozenset({"wrong_value", "wrong_row", "missing_row", "extra_row"})


class KafkaReader:
    """Reads single records by ``(topic, partition, offset)`` with an assign-only consumer, cached.

    Parameters
    ----------
    kafka
        The cluster the run used.
    timeout
        Seconds to wait for one record before calling it absent.
    """

    def __init__(self, kafka: KafkaConfig, timeout: float = 5.0) -> None:
        self._consumer = kafka.consumer(
            **{"enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 20}
        )
        self._timeout = timeout
        self._cache: dict[tuple[str, int, int], bytes | None] = {}

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

    def read(self, topic: str, partition: int, offset: int) -> bytes | None:
        """The value stored at that offset, ``b""`` for a null value, or None if the record is not there."""
        key = (topic, partition, offset)
        if key not in self._cache:
            self._cache[key] = self._fetch(topic, partition, offset)
        return self._cache[key]

    def find(self, topic: str, partition: int, start: int, end: int | None, sha256: str) -> int | None:
        """The offset of the record in ``[start, end)`` whose value has SHA-256 ``sha256``, or None.

        ``end`` None searches to the partition's end.
        """
        for msg in self._scan(topic, partition, start):
            if end is not None and msg.offset() >= end:
                return None
            if msg.offset() >= start and hashlib.sha256(msg.value() or b"").hexdigest() == sha256:
                return int(msg.offset())
        return None

    def _fetch(self, topic: str, partition: int, offset: int) -> bytes | None:
        for msg in self._scan(topic, partition, offset):
            if msg.offset() == offset:
                return bytes(msg.value() or b"")
            if msg.offset() > offset:
                return None
        return None

    def _scan(self, topic: str, partition: int, offset: int) -> Iterator[Any]:
        """The partition's records from ``offset`` on (some before it, too), until its end or the time-out."""
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout
            )
        except KafkaException as exc:
            log.warning("cannot read watermarks of %s[%d]: %s", topic, partition, exc)
            return
        start = max(offset, low)
        if start >= high:
            return  # past the end (or deleted by retention): nothing to read
        self._consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + self._timeout
        try:
            while time.monotonic() < deadline:
                msg = self._consumer.poll(0.2)  # returns on the first record, unlike consume(n)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF or not err.retriable():
                        return
                    continue
                yield msg
        finally:
            self._consumer.unassign()


#: How many message discrepancies of a run are read back from Kafka at most: each read can wait seconds.
READ_BACK_LIMIT = 200

#: A delivered copy whose place in Kafka was not looked up.
NOT_READ_BACK = Triage("unknown", True, True, detail="delivered per the ledger; Kafka not checked")


class Triager:
    """Names the layer at fault for each discrepancy (producer, broker, pipeline, or unknown if unchecked).

    Parameters
    ----------
    ledger
        The simulator's ledger (every copy a row).
    kafka
        The cluster to read back from; None skips the Kafka step (the layer is then ``unknown`` for
        messages the producer did deliver).
    limit
        At most this many message discrepancies are checked against Kafka; the rest are ``unknown``.

    Attributes
    ----------
    read_back
        How many message discrepancies it has checked against Kafka, so that a run verified a few sensors at a
        time can give the next Triager what is left of one budget.
    """

    def __init__(
        self, ledger: pd.DataFrame, kafka: KafkaConfig | None = None, limit: int = READ_BACK_LIMIT
    ) -> None:
        self._ledger = ledger
        self._index: dict[Any, Any] | None = None  # (session, seq) -> row positions, built on demand
        self._kafka = kafka
        self._reader = KafkaReader(kafka) if kafka is not None else None
        self._limit = limit
        self._reissued: pd.Series | None = None  # copies at offsets given out twice, computed on demand
        self._sent: set[tuple[str, int]] | None = None  # (session, seq) of copies sent, computed on demand
        self.read_back = 0
        self._lost_by_broker: pd.Index = pd.Index([])  # copies the broker no longer has (``gave_away``)

    def close(self) -> None:
        """Release the Kafka consumer."""
        if self._reader is not None:
            self._reader.close()

    def __enter__(self) -> Triager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def gave_away(self, copies: pd.Index) -> None:
        """Ledger rows the verifier found the broker no longer has (``Expectation.overwritten``).

        A message whose every acknowledged copy is among them is the broker's loss from the ledger alone, with
        no read back: beyond the read-back limit it would otherwise be ``unknown``.
        """
        self._lost_by_broker = copies

    def partition_ends(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int] | None:
        """Where each partition ends now (its next offset); None without Kafka or if the broker does not answer."""
        if self._kafka is None:
            return None
        try:
            return {tp: end for tp, (_, end) in EndOffsets(self._kafka)(partitions).items()}
        except BrokerError as exc:
            log.warning("could not read where the run's partitions end (%s): what the broker lost is found from "
                        "the ledger alone", exc)  # fmt: skip
            return None

    def triage_all(self, discrepancies: Iterable[Discrepancy]) -> list[Discrepancy]:
        """Each discrepancy with its ``triage`` filled in, in the same order.

        Messages are traced first: what the producer never delivered from the ledger alone, the rest read back
        from Kafka up to ``limit`` (beyond it, ``unknown``). A discrepancy about a whole session (its status,
        its table) in a session that lost messages before the pipeline (the producer never delivered them, the
        broker lost them), and none in the pipeline, is a consequence of that loss and is blamed on the same
        layer, as on-call would name the root cause; with messages of unknown layer it is unknown too; in
        other sessions it is the pipeline's own.
        """
        items = list(discrepancies)
        traced: dict[int, Triage] = {}
        checked = 0
        for i, d in enumerate(items):
            traced_kind = d.kind in MESSAGE_KINDS or (d.kind in WRONG_KINDS and d.seq is not None)
            if not traced_kind or (d.kind == "false_violation" and d.seq is None):
                continue
            # The ledger alone settles what the producer never delivered; only the rest costs a Kafka read.
            # The two kinds made from the ledger itself are settled in bulk: a broker's data loss makes them
            # by the hundred thousand, and a look-up each would take minutes.
            if d.kind == "broker_lost":
                traced[i] = self._given_away(d)
                continue
            if d.kind == "not_delivered" and d.seq is not None:
                traced[i] = self._undelivered(d)
                continue
            found = self._from_ledger(d)
            if isinstance(found, Triage):
                traced[i] = found
            elif d.kind == "broker_lost":
                traced[i] = self._given_away(d)
            elif self._reader is None:
                traced[i] = NOT_READ_BACK
            elif checked < self._limit:
                checked += 1
                self.read_back += 1
                traced[i] = self._from_kafka(found, wrote=d.kind in WRONG_KINDS)
            else:
                traced[i] = replace(
                    NOT_READ_BACK, detail=f"delivered per the ledger; not read back (limit {self._limit})"
                )
        upstream: dict[str, str] = {}
        own: set[str] = set()
        unknown: set[str] = set()
        for i, t in traced.items():
            if t.layer in ("producer", "broker") and items[i].session:
                upstream.setdefault(items[i].session, t.layer)
            elif t.layer == "pipeline":
                own.add(items[i].session)
            elif t.layer == "unknown":
                unknown.add(items[i].session)
        out: list[Discrepancy] = []
        for i, d in enumerate(items):
            if i in traced:
                out.append(replace(d, triage=traced[i]))
            elif d.session in own:  # the pipeline lost messages of it too: its damage is the pipeline's
                out.append(replace(d, triage=Triage("pipeline", detail="the pipeline's own output is wrong")))
            elif d.session in unknown:
                detail = "follows from messages of this session whose layer is unknown"
                out.append(replace(d, triage=Triage("unknown", detail=detail)))
            elif d.session in upstream:
                layer = upstream[d.session]
                detail = f"follows from messages of this session the {layer} lost"
                out.append(replace(d, triage=Triage(layer, detail=detail)))
            else:
                out.append(replace(d, triage=Triage("pipeline", detail="the pipeline's own output is wrong")))
        return out

    def triage(self, d: Discrepancy) -> Triage:
        """Walk the on-call checks for one message discrepancy."""
        found = self._from_ledger(d)
        if isinstance(found, Triage):
            return found
        return NOT_READ_BACK if self._reader is None else self._from_kafka(found)

    def _given_away(self, d: Discrepancy) -> Triage:
        """A message the ledger shows numbered over by the broker: the broker's, without reading Kafka.

        Reading its offset back would prove little (another record, or none yet: a read that waits) and cost a
        timeout per message.
        """
        where = f"{d.topic}[{d.partition}]@{d.offset}"
        return Triage(
            "broker", True, True, False, detail=f"acknowledged at {where}, an offset the broker numbered anew"
        )

    def _undelivered(self, d: Discrepancy) -> Triage:
        """A message no copy of which the broker acknowledged (``check_delivery``): the producer's."""
        if self._sent is None:
            sent = self._ledger[self._ledger["sent_ts"].notna()]
            self._sent = set(zip(sent["session"].astype(str), sent["seq"].astype("int64"), strict=True))
        if (d.session, d.seq) in self._sent:
            return Triage("producer", True, False, detail=f"sent but not acknowledged ({d.detail})")
        return Triage("producer", sent=False, delivered=False, detail=f"never sent ({d.detail})")

    def _from_ledger(self, d: Discrepancy) -> Triage | pd.DataFrame:
        """The layer if the ledger settles it (never sent, never acknowledged), else the acknowledged copies."""
        copies = self._ledger_copies(d)
        if copies is None or copies.empty:
            return Triage("pipeline", sent=False, detail="not in the ledger: the pipeline made it up")
        sent = copies["sent_ts"].notna()
        if not sent.any():
            faults = ", ".join(sorted(set(copies["fault"].astype(str))))
            return Triage("producer", sent=False, delivered=False, detail=f"never sent (fault: {faults})")
        acked = copies[copies["delivered"].fillna(False).astype(bool)]
        if acked.empty:
            errors = "; ".join(sorted({str(r["error"]) for r in _records(copies) if _present(r["error"])}))
            return Triage(
                "producer", True, False, detail=f"sent but not acknowledged: {errors or 'no report'}"
            )
        if self._reissued is None:
            self._reissued = reissued(self._ledger, partition_lives(self._ledger))
        if bool(self._reissued.loc[acked.index].all()):
            return Triage(
                "broker", True, True, None,
                detail=f"acknowledged at {_first_place(acked)}, an offset the broker had given out before its "
                "offsets started again lower: a reader past it never sees it",
            )  # fmt: skip
        if len(self._lost_by_broker) and bool(acked.index.isin(self._lost_by_broker).all()):
            return Triage(
                "broker", True, True, False,
                detail=f"acknowledged at {_first_place(acked)}, which the broker no longer has: its partition "
                "started again lower, or now ends before it",
            )  # fmt: skip
        return acked

    def _from_kafka(self, acked: pd.DataFrame, wrote: bool = False) -> Triage:
        """Where the acknowledged copies are in Kafka, if anywhere.

        ``wrote``: the pipeline wrote a row from the message (with other values), rather than losing it.
        """
        delivered = acked[acked["offset"].notna()]
        if delivered.empty:
            # librdkafka acknowledges an idempotent retry the broker already had without an offset (-1001).
            return self._search_kafka(acked)
        return self._check_kafka(
            delivered, "the pipeline wrote it wrong" if wrote else "the pipeline lost it"
        )

    def _ledger_copies(self, d: Discrepancy) -> pd.DataFrame | None:
        ledger = self._ledger
        if d.seq is None and d.offset is not None and d.partition is not None:
            hit = ledger[
                (ledger["offset"] == d.offset)
                & (ledger["partition"] == d.partition)
                & (ledger["topic"] == d.topic)
            ]
            return hit
        if d.seq is None:
            return None
        if self._index is None:
            self._index = dict(ledger.groupby(["session", "seq"], sort=False).indices)
        positions = self._index.get((d.session, d.seq))
        if positions is None:
            return None
        copies: pd.DataFrame = ledger.iloc[positions]
        if d.offset is not None:
            copies = copies[copies["offset"] == d.offset]
        return copies

    def _check_kafka(self, delivered: pd.DataFrame, verdict: str = "the pipeline lost it") -> Triage:
        assert self._reader is not None
        notes = []
        for r in _records(delivered):  # only copies with an offset reach here
            topic, partition, offset = str(r["topic"]), int(r["partition"]), int(r["offset"])
            where = f"{topic}[{partition}]@{offset}"
            value = self._reader.read(topic, partition, offset)
            if value is None:
                notes.append(f"absent at {where}")
            elif hashlib.sha256(value).hexdigest() != r["value_sha256"]:
                notes.append(f"different value at {where}")
            else:
                return Triage("pipeline", True, True, True, detail=f"in Kafka at {where}; {verdict}")
        return Triage("broker", True, True, False, detail="acknowledged but " + "; ".join(notes))

    def _search_kafka(self, acked: pd.DataFrame) -> Triage:
        """Look for a copy acknowledged without an offset between the offsets of its session's neighbours.

        A session's copies go to one partition in the order they were produced, so the record, if the broker
        kept it, lies between the last copy produced before it and the first produced after it that have
        offsets.
        """
        assert self._reader is not None
        notes = []
        for r in _records(acked):
            topic, partition = str(r["topic"]), int(r["partition"])
            before, after = self._neighbour_offsets(r)
            if before is None and after is None:
                notes.append(f"no neighbour of seq {r['seq']} in {topic}[{partition}] has an offset")
                continue
            where = f"{topic}[{partition}] between offsets {before} and {after}"
            found = self._reader.find(topic, partition, before or 0, after, str(r["value_sha256"]))
            if found is not None:
                return Triage(
                    "pipeline", True, True, True,
                    detail=f"acknowledged without an offset; in Kafka at {topic}[{partition}]@{found}; "
                    "the pipeline lost it",
                )  # fmt: skip
            notes.append(f"not in {where}")
        if any(n.startswith("not in") for n in notes):
            return Triage(
                "broker", True, True, False, detail="acknowledged without an offset but " + "; ".join(notes)
            )
        return Triage("unknown", True, True, detail="acknowledged without an offset; " + "; ".join(notes))

    def _neighbour_offsets(self, copy: dict[str, Any]) -> tuple[int | None, int | None]:
        """Offsets of the session's copies produced just before and just after ``copy`` (same partition)."""
        ledger = self._ledger
        same = ledger[
            (ledger["session"] == copy["session"])
            & (ledger["partition"] == copy["partition"])
            & ledger["offset"].notna()
            & ledger["sent_ts"].notna()
        ]
        earlier = same[same["sent_ts"] <= copy["sent_ts"]]["offset"]
        later = same[same["sent_ts"] > copy["sent_ts"]]["offset"]
        return (
            int(earlier.max()) if len(earlier) else None,
            int(later.min()) + 1 if len(later) else None,
        )


def _first_place(copies: pd.DataFrame) -> str:
    """``topic[partition]@offset`` of the first of ``copies`` (acknowledged ones, with an offset)."""
    r = _records(copies.iloc[:1])[0]
    return f"{r['topic']}[{int(r['partition'])}]@{int(r['offset'])}"


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts with string keys."""
    return [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)
