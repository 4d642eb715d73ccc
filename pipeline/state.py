"""Per-session state and the pure rules that rebuild a session's table under an integrity policy.

``SessionProcessor.apply`` takes a session's state and a batch of raw Kafka envelopes and returns the new
state and the output records; ``expire`` closes a session that went quiet. The processor does what is the
same under every policy (Kafka order, decoding, dead letters, the hot path for plain updates); what a policy
decides lives in one small class per policy (``Strict``, ``Ordered``, ``Once``, ``Window``, ``NoIntegrity``)
on the common base ``Policy``, chosen once per run from ``PolicyConfig``. Nothing here touches Spark, so
every rule is unit-tested on hand-built envelopes, and ``pipeline.reconstruct`` only converts between pandas
and envelopes around it. The rules are documented in ``docs/pipeline.md``.
"""

from __future__ import annotations

import bisect
import logging
import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, ClassVar, NamedTuple, NoReturn

import orjson

from pipeline.errors import IntegrityViolation, PipelineError
from pipeline.policies import PolicyConfig
from pipeline.records import Records
from sotw.wire import MalformedMessage, Message, canonical_row, decode, plain_update, table_digest

log = logging.getLogger(__name__)

_STATE_VERSION = 1


class Position(NamedTuple):
    """Where a message sits in Kafka: every record names it, and a strict stop points the user to it."""

    topic: str
    partition: int
    offset: int


class Envelope(NamedTuple):
    """One Kafka record as the stateful step sees it: where it sits, its raw key and value, its timestamp."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


Located = Position | Envelope
"""Where a message sits: its envelope, whose first fields are its position (the general path passes it as
it is rather than make a ``Position`` per message), or a ``Position`` where the envelope is gone."""


class End(NamedTuple):
    """What a session's ``end`` message says: its seq, the final row count and digest, its event time."""

    seq: int
    rows: int
    digest: str
    ts: int


# Spark hands a group's rows over in no particular order; Kafka's order is (partition, offset).
_POSITION = itemgetter(0, 1, 2)

# A held-back message in the window policy's reorder buffer: (event ts, topic, partition, offset, key, value).
# State holds plain tuples (here and in ``SessionState.end``) so that the pickled state names no class.
Buffered = tuple[int, str, int, int, bytes | None, bytes | None]

# (sensor, session, topic, partition, offset, seq, event_ms): the leading columns of every change a message
# makes; a change record is this plus (row_id, op, values), as ``pipeline.records.CHANGE_COLUMNS`` has it.
ChangeHead = tuple[str, str, str, int, int, int, int]


@dataclass(slots=True, eq=False)
class SessionState:
    """Everything kept between micro-batches for one session.

    An open session holds its table as ``{row_id: canonical row JSON}``; once closed only a small marker
    remains (``closed`` True, empty table) until ``deadline_ms``, so late messages of a closed session are
    recognised rather than opening a phantom session.

    Seq bookkeeping is shared by all policies: every seq below ``next_seq`` has been seen except those in
    ``missing`` (sorted, disjoint, inclusive ranges), so a stale seq is a duplicate unless it fills a hole.
    """

    session: str
    sensor: str
    closed: bool = False
    closed_by: str | None = None
    initialized: bool = False
    table: dict[int, str] = field(default_factory=dict)
    # once: the highest seq that touched each row, deleted rows included (their tombstones).
    row_seq: dict[int, int] = field(default_factory=dict)
    next_seq: int = 0
    missing: list[tuple[int, int]] = field(default_factory=list)
    # window: held-back messages by seq.
    buffer: dict[int, Buffered] = field(default_factory=dict)
    # once: the end message, kept until every seq up to it is present: (seq, rows, digest, ts).
    end: tuple[int, int, str, int] | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    max_ts: int | None = None
    last_ts: int | None = None
    topic: str = ""
    partition: int = 0
    last_offset: int | None = None
    applied_offset: int | None = None
    messages: int = 0
    gaps: int = 0
    duplicates: int = 0
    reordered: int = 0
    malformed: int = 0
    digest_mismatches: int = 0
    missing_snapshot: int = 0
    degraded_from_seq: int | None = None
    deadline_ms: int = 0

    def to_bytes(self) -> bytes:
        """Serialize for Spark's state store: a versioned tuple, pickled (protocol 5, no class path inside)."""
        return pickle.dumps((_STATE_VERSION, tuple(getattr(self, f) for f in _FIELD_NAMES)), protocol=5)

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray) -> SessionState:
        """Rebuild a state written by ``to_bytes``.

        Raises
        ------
        PipelineError
            If the blob was written by an incompatible version of sotw.
        """
        # The blob comes from this job's own checkpoint, written by to_bytes: it is trusted.
        version, values = pickle.loads(bytes(blob))  # noqa: S301
        if version != _STATE_VERSION or len(values) != len(_FIELD_NAMES):
            raise PipelineError(
                f"session state in the checkpoint has format version {version}, this sotw writes "
                f"{_STATE_VERSION}: start with a new checkpoint"
            )
        return cls(**dict(zip(_FIELD_NAMES, values, strict=True)))

    def missing_index(self, seq: int) -> int:
        """Index of the ``missing`` range that holds ``seq``, or -1."""
        i = bisect.bisect_right(self.missing, (seq, float("inf"))) - 1
        if i >= 0 and self.missing[i][0] <= seq <= self.missing[i][1]:
            return i
        return -1

    def take_missing(self, seq: int) -> bool:
        """Whether ``seq`` was missing; if so it is no longer (it arrived late)."""
        i = self.missing_index(seq)
        if i < 0:
            return False
        lo, hi = self.missing[i]
        self.missing[i : i + 1] = [(a, b) for a, b in ((lo, seq - 1), (seq + 1, hi)) if a <= b]
        return True

    def seen(self, seq: int) -> bool:
        """Whether ``seq`` has been seen already, so another copy of it is a duplicate."""
        return seq < self.next_seq and self.missing_index(seq) < 0

    @property
    def last_position(self) -> Position:
        """Where the session's last message sat (offset 0 if none), for records not tied to a message."""
        return Position(self.topic, self.partition, self.last_offset or 0)

    def rebuilt_digest(self) -> str:
        """The digest of the rebuilt table, by the wire format's own definition."""
        return table_digest(orjson.loads(v) for v in self.table.values())


_FIELD_NAMES = tuple(f.name for f in fields(SessionState))


_SORTED = orjson.OPT_SORT_KEYS
# Scalars orjson writes exactly as json.dumps does (exact types: a subclass takes the slow, exact path).
_PLAIN = frozenset((str, int, bool, type(None)))


def fast_canonical_row(row: dict[str, Any]) -> str:
    """``sotw.wire.canonical_row``, about eight times faster for the rows seen in practice.

    orjson with sorted keys writes exactly what the wire format's ``json.dumps`` writes for strings, integers,
    booleans, null and floats in [1e-4, 1e16) (checked on every code point and 300 000 random floats in
    ``tests/pipeline/test_state.py``). For anything else (nested values, floats written with an exponent by
    Python) it falls back to ``canonical_row`` itself, so the result is always the canonical form.
    """
    for value in row.values():
        kind = type(value)
        if kind is float:
            if value != 0.0 and not 1e-4 <= abs(value) < 1e16:
                return canonical_row(row)
        elif kind not in _PLAIN:
            return canonical_row(row)
    try:
        return orjson.dumps(row, option=_SORTED).decode()
    except orjson.JSONEncodeError:  # an integer beyond 64 bits (orjson.loads never makes one)
        return canonical_row(row)


def _sniff_sensor(value: bytes | None) -> str | None:
    """Best effort: the sensor of a malformed value, if it is a JSON object with a string ``sensor``."""
    try:
        obj = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return None
    sensor = obj.get("sensor") if isinstance(obj, dict) else None
    return sensor if isinstance(sensor, str) else None


def _unbuffer(held: Buffered) -> tuple[Position, Message]:
    """Where a held-back message sat and the message itself (it was valid when it was held back)."""
    _, topic, partition, offset, key, value = held
    return Position(topic, partition, offset), decode(value, key)


def _integrity(
    st: SessionState,
    pos: Located,
    out: Records,
    violation: str,
    *,
    event_ms: int | None,
    seq: int | None = None,
    expected_seq: int | None = None,
    got_seq: int | None = None,
    missing_from: int | None = None,
    missing_to: int | None = None,
    detail: str | None = None,
) -> None:
    """Write an integrity record of ``violation`` about the session ``st`` at ``pos``."""
    out.integrity(
        violation, sensor=st.sensor, session=st.session, topic=pos.topic, partition=pos.partition,
        offset=pos.offset, event_ms=event_ms, seq=seq, expected_seq=expected_seq, got_seq=got_seq,
        missing_from=missing_from, missing_to=missing_to, detail=detail,
    )  # fmt: skip


# ---------------------------------------------------------------------- the policies


class Policy(ABC):
    """What one integrity policy does with each message of an open session, and the steps all policies share.

    One subclass per policy, chosen once per run by ``policy_for``. A policy's own rule is ``admit`` (a
    message in seq order or not, a repeat, a skip); the shared steps (apply a message to the table, close at
    the end or at timeout, gap, duplicate, reorder, missing snapshot, a message after close) do what most
    policies do, and a subclass overrides the one that differs: ``Strict`` stops where others record,
    ``NoIntegrity`` only counts (``_report``), ``Once`` and ``Window`` settle what they wait for at timeout
    (``_settle``). Instances hold nothing but the run's configuration: every method is a function of the state
    and records it is given.

    Parameters
    ----------
    config
        The run's policy settings (the window's lateness and buffer bound).
    """

    name: ClassVar[str]
    """The policy's name in ``PolicyConfig.policy`` and on the command line."""
    keeps_row_seq: ClassVar[bool] = False
    """Whether ``SessionState.row_seq`` is kept (each row's highest seq): ``once`` rebuilds rows by it."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    # ------------------------------------------------------------------ what the processor calls

    def may_run_plain(self, st: SessionState) -> bool:
        """Whether the next in-order update would do nothing but change a row (see ``SessionProcessor``)."""
        return st.initialized and not st.closed

    def after_close(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """A message for a session that already closed: a duplicate or a late message, dropped."""
        violation = "duplicate" if st.seen(msg.seq) else "late_after_close"
        self._report(
            st, pos, out, violation, event_ms=msg.ts, seq=msg.seq, got_seq=msg.seq,
            detail=f"session already closed by {st.closed_by}; dropped",
        )  # fmt: skip

    def time_out(self, st: SessionState, out: Records) -> None:
        """Close the open session ``st``, quiet for the session timeout, with a ``timeout`` record.

        What the policy waits for is settled first (``_settle``); if that reaches the session's end, the end
        closes it instead.
        """
        pos = st.last_position
        status = self._settle(st, pos, out)
        if st.closed:
            return
        end = End._make(st.end) if st.end is not None else None
        quiet_ms = self.config.session_timeout_ms
        _integrity(
            st, pos, out, "timeout", event_ms=st.last_ts,
            expected_seq=end.seq if end is not None else st.next_seq,
            detail=f"no message for {quiet_ms} ms; session closed without a complete end",
        )  # fmt: skip
        self._close(
            st, pos, out, status=status, closed_by="timeout", event_ms=st.last_ts, digest=st.rebuilt_digest(),
            end=end,
        )  # fmt: skip

    # ------------------------------------------------------------------ what each policy decides

    @abstractmethod
    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Judge a valid message of the open session ``st`` by the policy's rule and apply it or not.

        The processor has done the bookkeeping every policy shares first (lowest and highest seq, event
        time, Kafka position), so the message arrived after a higher seq (it is reordered) if
        ``st.last_seq`` is above its seq.

        Raises
        ------
        IntegrityViolation
            Under ``strict``, if the message breaks the session's integrity.
        """

    def _settle(self, st: SessionState, pos: Located, out: Records) -> str:
        """Before a timeout closes the session, give up what the policy waits for; return its status."""
        return "timed_out"

    # An anomaly the policy tolerates becomes an integrity record (``NoIntegrity`` only counts it). An alias,
    # not a method that calls ``_integrity``: keyword arguments passed on cost more than the record itself.
    _report = staticmethod(_integrity)

    # ------------------------------------------------------------------ steps the policies share

    def _apply(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """Apply one message to the table in seq order (all policies but ``once``)."""
        seq = msg.seq
        if seq >= st.next_seq:
            st.next_seq = seq + 1
        st.messages += 1
        st.applied_offset = pos.offset
        head: ChangeHead = (st.sensor, st.session, pos.topic, pos.partition, pos.offset, seq, msg.ts)
        append = out.changes.append
        kind = msg.kind
        if kind == "update":
            if not st.initialized:
                self._no_snapshot(st, msg, pos, out)
            row = msg.row or {}
            row_id = row["id"]
            if msg.op == "delete":
                st.table.pop(row_id, None)
                append(head + (row_id, "delete", None))
            else:
                values = fast_canonical_row(row)
                st.table[row_id] = values
                append(head + (row_id, "upsert", values))
        elif kind == "snapshot":
            st.initialized = True
            old = st.table
            table: dict[int, str] = {}
            for row in msg.rows or []:
                row_id = row["id"]
                values = fast_canonical_row(row)
                table[row_id] = values
                append(head + (row_id, "snapshot", values))
            for row_id in old.keys() - table.keys():
                append(head + (row_id, "delete", None))
            st.table = table
        else:
            if not st.initialized:
                self._no_snapshot(st, msg, pos, out)
            self._end(st, End(seq, msg.row_count or 0, msg.digest or "", msg.ts), pos, out)

    def _end(self, st: SessionState, end: End, pos: Located, out: Records) -> None:
        """Check the rebuilt table against what ``end`` says, then close the session."""
        digest = st.rebuilt_digest()
        mismatch = len(st.table) != end.rows or digest != end.digest
        if mismatch:
            rebuilt = f"rebuilt {len(st.table)} rows, digest {digest}"
            detail = f"end says {end.rows} rows, digest {end.digest}; {rebuilt}"
            self._digest_mismatch(st, end, pos, out, detail)
        if st.degraded_from_seq is not None:
            status = "degraded"
        elif mismatch:
            status = "failed"
        else:
            status = "ok"
        self._close(st, pos, out, status=status, closed_by="end", event_ms=end.ts, digest=digest, end=end)

    def _digest_mismatch(self, st: SessionState, end: End, pos: Located, out: Records, detail: str) -> None:
        """The rebuilt table is not the one ``end`` describes."""
        st.digest_mismatches += 1
        self._report(st, pos, out, "digest_mismatch", event_ms=end.ts, seq=end.seq, detail=detail)

    def _close(
        self,
        st: SessionState,
        pos: Located,
        out: Records,
        *,
        status: str,
        closed_by: str,
        event_ms: int | None,
        digest: str,
        end: End | None,
    ) -> None:
        """Emit the session record and shrink the state to a closed marker (its deadline is the caller's)."""
        out.session(
            sensor=st.sensor, session=st.session, topic=pos.topic, partition=pos.partition, offset=pos.offset,
            event_ms=event_ms, status=status, closed_by=closed_by, row_count=len(st.table), digest=digest,
            expected_rows=end.rows if end is not None else None,
            expected_digest=end.digest if end is not None else None, first_seq=st.first_seq,
            last_seq=st.last_seq, messages=st.messages, gaps=st.gaps, duplicates=st.duplicates,
            reordered=st.reordered, malformed=st.malformed, digest_mismatches=st.digest_mismatches,
            missing_snapshot=st.missing_snapshot, degraded_from_seq=st.degraded_from_seq,
        )  # fmt: skip
        st.closed = True
        st.closed_by = closed_by
        st.table = {}
        st.row_seq = {}
        st.end = None

    def _gap(
        self,
        st: SessionState,
        pos: Located,
        out: Records,
        missing: tuple[int, int],
        *,
        got: int | None,
        event_ms: int | None,
        why: str,
        remember: bool = True,
    ) -> None:
        """Count the seqs ``missing`` (``lo, hi``, inclusive) as a gap; the session is degraded from ``lo``.

        ``remember`` keeps the range in ``SessionState.missing``, so that a late arrival of one of its seqs is
        known as one; ``once`` keeps that list itself.
        """
        lo, hi = missing
        st.gaps += hi - lo + 1
        if remember:
            st.missing.append(missing)
        if st.degraded_from_seq is None or lo < st.degraded_from_seq:
            st.degraded_from_seq = lo
        self._report(
            st, pos, out, "gap", event_ms=event_ms, seq=got, expected_seq=lo, got_seq=got, missing_from=lo,
            missing_to=hi, detail=f"seqs {lo}..{hi} {why}",
        )  # fmt: skip

    def _duplicate(self, st: SessionState, msg: Message, pos: Located, out: Records, what: str) -> None:
        """A seq that was already seen came again; ``what`` says what became of it."""
        st.duplicates += 1
        self._report(
            st, pos, out, "duplicate", event_ms=msg.ts, seq=msg.seq, expected_seq=st.next_seq,
            got_seq=msg.seq, detail=f"seq {msg.seq} was already seen; {what}",
        )  # fmt: skip

    def _reorder(self, st: SessionState, msg: Message, pos: Located, out: Records, detail: str) -> None:
        """A seq arrived after a higher one; ``detail`` says what became of it."""
        st.reordered += 1
        self._report(
            st, pos, out, "reorder", event_ms=msg.ts, seq=msg.seq, expected_seq=st.next_seq, got_seq=msg.seq,
            detail=detail,
        )  # fmt: skip

    def _no_snapshot(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """An update or end reached a table no snapshot initialized (reported once per session)."""
        if st.missing_snapshot:
            return
        st.missing_snapshot = 1
        st.degraded_from_seq = 0
        self._report(
            st, pos, out, "missing_snapshot", event_ms=msg.ts, seq=msg.seq, expected_seq=0, got_seq=msg.seq,
            detail=f"{msg.kind} seq {msg.seq} applied to a table no snapshot initialized",
        )  # fmt: skip


class Strict(Policy):
    """``strict``: every message in seq order from the snapshot on; anything else stops the query."""

    name = "strict"

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply the message if it is the next seq, the session's first being its snapshot; else stop."""
        seq, nxt = msg.seq, st.next_seq
        if not st.initialized and st.messages == 0 and (seq != 0 or msg.kind != "snapshot"):
            self._stop(st, env, "missing_snapshot", expected=0, got=seq)
        if seq > nxt:
            self._stop(st, env, "gap", expected=nxt, got=seq)
        if seq < nxt:
            self._stop(st, env, "duplicate", expected=nxt, got=seq)
        self._apply(st, msg, env, out)

    def after_close(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """Any message after the session closed stops the query."""
        violation = "duplicate" if st.seen(msg.seq) else "late_after_close"
        self._stop(st, pos, violation, expected=None, got=msg.seq, detail=f"session closed by {st.closed_by}")

    def _digest_mismatch(self, st: SessionState, end: End, pos: Located, out: Records, detail: str) -> None:
        self._stop(st, pos, "digest_mismatch", expected=end.seq, got=end.seq, detail=detail)

    def _stop(
        self,
        st: SessionState,
        pos: Located,
        violation: str,
        *,
        expected: int | None,
        got: int | None,
        detail: str = "",
    ) -> NoReturn:
        raise IntegrityViolation(
            violation,
            sensor=st.sensor,
            session=st.session,
            topic=pos.topic,
            partition=pos.partition,
            offset=pos.offset,
            expected_seq=expected,
            got_seq=got,
            last_offset=st.applied_offset,
            detail=detail,
        )


class Ordered(Policy):
    """``ordered``: apply in arrival order; a skip is a recorded gap, a stale seq is dropped and recorded."""

    name = "ordered"

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply in arrival order past a skip (a gap); drop a stale seq as a ``reorder`` or ``duplicate``."""
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            if st.take_missing(seq):
                why = f"arrived after seq {st.last_seq} was applied; dropped (its gap was recorded)"
                self._reorder(st, msg, env, out, why)
            else:
                self._duplicate(st, msg, env, out, "dropped")
            return
        if seq > nxt:
            self._gap(st, env, out, (nxt, seq - 1), got=seq, event_ms=msg.ts, why="skipped")
        self._apply(st, msg, env, out)


class NoIntegrity(Policy):
    """``none``: apply every valid message in arrival order, repeats included; anomalies are only counted."""

    name = "none"

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply every valid message in arrival order, counting skips, repeats and late arrivals."""
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            if st.take_missing(seq):
                self._reorder(st, msg, env, out, "applied")
            else:
                self._duplicate(st, msg, env, out, "applied again")
        elif seq > nxt:
            self._gap(st, env, out, (nxt, seq - 1), got=seq, event_ms=msg.ts, why="skipped")
        self._apply(st, msg, env, out)

    @staticmethod
    def _report(st: SessionState, pos: Located, out: Records, violation: str, **fields: Any) -> None:
        """No integrity records: the session record's counters are all this policy reports."""


class Once(Policy):
    """``once``: any order, each seq once; each row comes from the highest seq that touched it."""

    name = "once"
    keeps_row_seq = True

    def may_run_plain(self, st: SessionState) -> bool:
        """Not while an early ``end`` waits for missing seqs: each arrival may complete the session."""
        return st.initialized and not st.closed and st.end is None

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply by seq in any order, each seq once; close when the end and every seq before it are in."""
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            if not st.take_missing(seq):
                self._duplicate(st, msg, env, out, "dropped")
                return
        elif seq > nxt:
            st.missing.append((nxt, seq - 1))
        if st.last_seq is not None and seq < st.last_seq:
            self._reorder(st, msg, env, out, f"arrived after seq {st.last_seq}; applied by seq")
        st.next_seq = max(nxt, seq + 1)
        st.messages += 1
        st.applied_offset = env.offset
        if msg.kind == "snapshot":
            self._snapshot(st, msg, env, out)
        elif msg.kind == "update":
            self._update(st, msg, env, out)
        else:
            st.end = (seq, msg.row_count or 0, msg.digest or "", msg.ts)
        if st.end is not None:
            end = End._make(st.end)
            if st.next_seq > end.seq and not (st.missing and st.missing[0][0] <= end.seq):
                self._check_snapshot_seen(st, env, out)
                self._end(st, end, env, out)

    def _snapshot(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """Set the rows no later seq touched; delete those it lacks that only earlier seqs touched."""
        seq, append = msg.seq, out.changes.append
        head: ChangeHead = (st.sensor, st.session, pos.topic, pos.partition, pos.offset, seq, msg.ts)
        st.initialized = True
        ids = set()
        for row in msg.rows or []:
            row_id = row["id"]
            ids.add(row_id)
            if st.row_seq.get(row_id, -1) < seq:
                values = fast_canonical_row(row)
                st.table[row_id] = values
                st.row_seq[row_id] = seq
                append(head + (row_id, "snapshot", values))
        for row_id, touched in list(st.row_seq.items()):
            if touched < seq and row_id not in ids and row_id in st.table:
                del st.table[row_id]
                st.row_seq[row_id] = seq
                append(head + (row_id, "delete", None))

    def _update(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """Upsert or delete the row unless a later seq already touched it."""
        row = msg.row or {}
        row_id = row["id"]
        if st.row_seq.get(row_id, -1) >= msg.seq:
            return
        st.row_seq[row_id] = msg.seq
        head: ChangeHead = (st.sensor, st.session, pos.topic, pos.partition, pos.offset, msg.seq, msg.ts)
        if msg.op == "delete":
            st.table.pop(row_id, None)
            out.changes.append(head + (row_id, "delete", None))
        else:
            values = fast_canonical_row(row)
            st.table[row_id] = values
            out.changes.append(head + (row_id, "upsert", values))

    def _settle(self, st: SessionState, pos: Located, out: Records) -> str:
        """Seqs still missing are gaps, and make the session ``failed``."""
        status = "timed_out"
        if st.missing:
            status = "failed"
            for missing in st.missing:
                self._gap(
                    st, pos, out, missing, got=None, event_ms=st.last_ts, why="still missing", remember=False
                )
            st.missing = []
        self._check_snapshot_seen(st, pos, out)
        return status

    def _check_snapshot_seen(self, st: SessionState, pos: Located, out: Records) -> None:
        """At close: a session whose seqs never included a snapshot has no trustworthy table."""
        if st.initialized or st.missing_snapshot:
            return
        st.missing_snapshot = 1
        st.degraded_from_seq = 0
        self._report(
            st, pos, out, "missing_snapshot", event_ms=st.last_ts, expected_seq=0,
            detail="no snapshot was applied to this session",
        )  # fmt: skip


class Window(Policy):
    """``window``: hold early messages back, apply in seq order; a hole older than the lateness is a gap."""

    name = "window"

    def may_run_plain(self, st: SessionState) -> bool:
        """Not while messages are held back: each arrival may release them."""
        return st.initialized and not st.closed and not st.buffer

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply the next seq and what it releases, hold later ones back, give up holes past the lateness."""
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            if st.take_missing(seq):
                why = "arrived after the window closed on its hole; dropped (its gap was recorded)"
                self._reorder(st, msg, env, out, why)
            else:
                self._duplicate(st, msg, env, out, "dropped")
            return
        if seq in st.buffer:
            self._duplicate(st, msg, env, out, "already held back; dropped")
            return
        if seq > nxt:
            st.buffer[seq] = (msg.ts, env.topic, env.partition, env.offset, env.key, env.value)
        else:
            if st.last_seq is not None and seq < st.last_seq:
                self._reorder(
                    st, msg, env, out, f"arrived after seq {st.last_seq}; applied in order within the window"
                )
            self._apply(st, msg, env, out)
            self._drain(st, out)
        self._give_up_holes(st, out, everything=False)

    def _settle(self, st: SessionState, pos: Located, out: Records) -> str:
        """Every hole is given up and the buffer released (its end, if held back, closes the session)."""
        if st.buffer:
            self._give_up_holes(st, out, everything=True)
        return "timed_out"

    def _drain(self, st: SessionState, out: Records) -> None:
        """Apply held-back messages that are now next in line."""
        while not st.closed and st.next_seq in st.buffer:
            pos, msg = _unbuffer(st.buffer.pop(st.next_seq))
            self._apply(st, msg, pos, out)

    def _give_up_holes(self, st: SessionState, out: Records, *, everything: bool) -> None:
        """Give up holes the window has passed (or all of them), recording each as a gap."""
        limit_n, limit_ms, cap = self.config.window_messages, self.config.window_ms, self.config.max_buffer
        while st.buffer and not st.closed:
            lo = min(st.buffer)
            ts, topic, partition, offset, _, _ = st.buffer[lo]
            over = (
                everything
                or len(st.buffer) > cap
                or (limit_n is not None and len(st.buffer) > limit_n)
                or (limit_ms is not None and st.max_ts is not None and st.max_ts - ts > limit_ms)
            )
            if not over:
                break
            pos = Position(topic, partition, offset)
            self._gap(
                st, pos, out, (st.next_seq, lo - 1), got=lo, event_ms=ts, why="not arrived within the window"
            )
            st.next_seq = lo
            self._drain(st, out)
        if st.closed and st.buffer:
            # Messages held back beyond the end: the session is over, so they are late.
            for seq in sorted(st.buffer):
                pos, msg = _unbuffer(st.buffer[seq])
                self.after_close(st, msg, pos, out)
            st.buffer.clear()


POLICY_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Strict, Ordered, Once, Window, NoIntegrity)
}
"""The class of each policy name in ``pipeline.policies.POLICIES``."""


def policy_for(config: PolicyConfig) -> Policy:
    """The policy ``config`` names, with its settings."""
    return POLICY_CLASSES[config.policy](config)


# ---------------------------------------------------------------------- the processor


class SessionProcessor:
    """Rebuild sessions from their messages under one integrity policy; pure, so it is tested without Spark.

    The processor does what every policy does alike: Kafka order within the batch, decoding, dead letters,
    opening a session, the hot path for plain updates and the state's deadline; each message of an open
    session then goes to the run's ``Policy`` (chosen once, here), and each of a closed one to its
    ``after_close``.

    Parameters
    ----------
    policy
        The run's policy and timeouts.
    fast
        Apply runs of plain in-order updates on the hot path (``_plain_run``); False keeps every message on
        the general path, which is the reference the tests hold the hot path to.

    Attributes
    ----------
    policy : Policy
        The rules of the configured policy (``policy_for``).
    """

    def __init__(self, policy: PolicyConfig, fast: bool = True) -> None:
        self.policy = policy_for(policy)
        self.timeout_ms = policy.session_timeout_ms
        self.fast = fast

    # ------------------------------------------------------------------ the hot path

    def _plain_run(self, st: SessionState, envs: list[Envelope], i: int, out: Records) -> int:
        """Apply the run of plain updates starting at ``envs[i]``; return the index of the first one it left.

        A plain update is a valid update with the next expected seq, for a session whose snapshot was applied
        and which holds nothing back (``Policy.may_run_plain``). Under every policy such a message only moves
        the seq bookkeeping on and upserts or deletes one row, so this loop does just that with the state in
        local variables, at about half the general path's cost per message; it stops at the first message that
        is anything else, which the general path then takes. ``fast=False`` turns it off, and the tests check
        that both paths give the same state and records.
        """
        keeps_row_seq = self.policy.keeps_row_seq
        table, row_seq = st.table, st.row_seq
        sensor, session = st.sensor, st.session
        nxt, first, last, max_ts = st.next_seq, st.first_seq, st.last_seq, st.max_ts
        append = out.changes.append
        start, n = i, len(envs)
        last_ts_ = st.last_ts
        while i < n:
            topic, partition, offset, key, value, _ = envs[i]
            plain = plain_update(value, key) if key is not None else None
            if plain is None or plain[1] != nxt:
                break
            _, seq, ts, op, row = plain
            if first is None or seq < first:
                first = seq
            if last is None or seq > last:
                last = seq
            if max_ts is None or ts > max_ts:
                max_ts = ts
            nxt, last_ts_ = seq + 1, ts
            row_id = row["id"]
            if keeps_row_seq:
                row_seq[row_id] = seq
            if op == "delete":
                table.pop(row_id, None)
                append((sensor, session, topic, partition, offset, seq, ts, row_id, "delete", None))
            else:
                values = fast_canonical_row(row)
                table[row_id] = values
                append((sensor, session, topic, partition, offset, seq, ts, row_id, "upsert", values))
            i += 1
        if i > start:
            topic, partition, offset = envs[i - 1][:3]
            st.next_seq, st.first_seq, st.last_seq, st.max_ts = nxt, first, last, max_ts
            st.topic, st.partition, st.last_offset, st.applied_offset = topic, partition, offset, offset
            st.last_ts = last_ts_
            st.messages += i - start
        return i

    # ------------------------------------------------------------------ entry points

    def apply(
        self, state: SessionState | None, envelopes: Iterable[Envelope], now_ms: int
    ) -> tuple[SessionState | None, Records]:
        """Process one micro-batch of a session's envelopes, in Kafka order.

        Parameters
        ----------
        state
            The session's state from earlier batches, or None for a new session.
        envelopes
            The group's Kafka records of this batch, in any order: they are sorted by (topic, partition,
            offset) here because Spark does not keep Kafka's order within a group.
        now_ms
            Processing time of the batch; sets when a quiet session (or a closed marker) expires.

        Returns
        -------
        tuple
            The new state (None if there is nothing to keep) and the records to emit.

        Raises
        ------
        IntegrityViolation
            Under the ``strict`` policy, at the first gap, duplicate, out-of-order seq, missing snapshot,
            digest mismatch or message after close.
        """
        out = Records()
        envs = sorted(envelopes, key=_POSITION)
        policy = self.policy
        admit = policy.admit
        # A closed marker keeps the deadline its close set; a session open at the start of the batch gets a
        # new one, whether it is still open at the end or closed during it.
        was_closed = state is not None and state.closed
        i, n = 0, len(envs)
        while i < n:
            if self.fast and state is not None and policy.may_run_plain(state):
                i = self._plain_run(state, envs, i, out)
                if i == n:
                    break
            env = envs[i]
            i += 1
            topic, partition, offset, key, value, _ = env
            try:
                if key is None:
                    raise MalformedMessage("key is null: messages must be keyed by their session")
                msg = decode(value, key)
            except MalformedMessage as exc:
                self._malformed(state, env, exc.reason, out)
                continue
            if state is None:
                state = SessionState(session=msg.session, sensor=msg.sensor, topic=topic, partition=partition)
            if state.closed:
                policy.after_close(state, msg, env, out)
                continue
            # The bookkeeping every policy shares; here, not in a Policy method, to save a call per message.
            prev_max, seq, ts = state.last_seq, msg.seq, msg.ts
            if state.first_seq is None or seq < state.first_seq:
                state.first_seq = seq
            if prev_max is None or seq > prev_max:
                state.last_seq = seq
            if state.max_ts is None or ts > state.max_ts:
                state.max_ts = ts
            state.last_ts = ts
            state.topic, state.partition, state.last_offset = topic, partition, offset
            admit(state, msg, env, out)
        if state is not None and not was_closed:
            state.deadline_ms = now_ms + self.timeout_ms
        return state, out

    def expire(self, state: SessionState, now_ms: int) -> tuple[SessionState | None, Records]:
        """Handle a session whose processing-time timeout fired.

        An open session is closed: ``window`` first releases what it held back (holes become gaps),
        ``once`` reports the seqs still missing as gaps and fails; then the session record says
        ``timed_out`` (or ``failed``) with ``closed_by`` ``timeout``, plus an integrity ``timeout`` record, and
        a closed marker is kept for one more timeout. A closed marker that expires leaves nothing behind.

        Returns
        -------
        tuple
            The new state (None once nothing needs keeping) and the records to emit.
        """
        out = Records()
        if state.closed:
            return None, out
        self.policy.time_out(state, out)
        state.deadline_ms = now_ms + self.timeout_ms
        return state, out

    @staticmethod
    def _malformed(st: SessionState | None, env: Envelope, reason: str, out: Records) -> None:
        """Dead-letter a malformed message (with an integrity record); it never opens a session."""
        topic, partition, offset, key, value, kafka_ms = env
        session = key.decode("utf-8", "replace") if key is not None else None
        sensor = st.sensor if st is not None else _sniff_sensor(value)
        out.dead_letter(
            sensor=sensor, session=session, topic=topic, partition=partition, offset=offset, event_ms=kafka_ms,
            key=key, value=value, detail=reason,
        )  # fmt: skip
        out.integrity(
            "malformed", sensor=sensor, session=session, topic=topic, partition=partition, offset=offset,
            event_ms=kafka_ms, detail=reason,
        )  # fmt: skip
        if st is not None and not st.closed:
            st.malformed += 1
        log.debug("malformed message at %s[%d]@%d: %s", topic, partition, offset, reason)
