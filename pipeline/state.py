"""Per-session state and the pure processor that rebuilds a session's table under an integrity policy.

``SessionProcessor.apply`` takes a session's state and a batch of raw Kafka envelopes and returns the new
state and the output records; ``expire`` closes a session that went quiet. Neither touches Spark, so every
policy rule is unit-tested on hand-built envelopes, and ``pipeline.reconstruct`` only converts between
pandas and envelopes around it. The rules are documented in ``docs/pipeline.md``.
"""

from __future__ import annotations

import bisect
import logging
import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, NamedTuple, NoReturn

import orjson

from pipeline.errors import IntegrityViolation, PipelineError
from pipeline.policies import PolicyConfig
from pipeline.records import Records
from sotw.wire import MalformedMessage, Message, canonical_row, decode, plain_update, table_digest

log = logging.getLogger(__name__)

_STATE_VERSION = 1


class Envelope(NamedTuple):
    """One Kafka record as the stateful step sees it: where it sits, its raw key and value, its timestamp."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


# Spark hands a group's rows over in no particular order; Kafka's order is (partition, offset).
_POSITION = itemgetter(0, 1, 2)

# A held-back message in the window policy's reorder buffer: (event ts, topic, partition, offset, key, value).
Buffered = tuple[int, str, int, int, bytes | None, bytes | None]


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

    def fill_missing(self, i: int, seq: int) -> None:
        """Remove ``seq`` from the missing range at index ``i`` (it arrived late)."""
        lo, hi = self.missing[i]
        parts = [(a, b) for a, b in ((lo, seq - 1), (seq + 1, hi)) if a <= b]
        self.missing[i : i + 1] = parts

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


class SessionProcessor:
    """Apply one integrity policy to a session's messages; pure, so it is tested without Spark.

    Parameters
    ----------
    policy
        The run's policy and timeouts.
    fast
        Apply runs of plain in-order updates on the hot path (``_plain_run``); False keeps every message on
        the general path, which is the reference the tests hold the hot path to.
    """

    def __init__(self, policy: PolicyConfig, fast: bool = True) -> None:
        self.policy = policy
        self.timeout_ms = policy.session_timeout_ms
        self._name = policy.policy
        self.fast = fast

    # ------------------------------------------------------------------ the hot path

    def _plain_run_may_start(self, st: SessionState) -> bool:
        """Whether the next in-order update would do nothing but change a row (see ``_plain_run``)."""
        if not st.initialized or st.closed:
            return False
        if self._name == "window":
            return not st.buffer
        if self._name == "once":
            return st.end is None
        return True

    def _plain_run(self, st: SessionState, envs: list[Envelope], i: int, out: Records) -> int:
        """Apply the run of plain updates starting at ``envs[i]``; return the index of the first one it left.

        A plain update is a valid update with the next expected seq, for a session whose snapshot was applied
        and which holds nothing back (no window buffer, no early ``end``). Under every policy such a message
        only moves the seq bookkeeping on and upserts or deletes one row, so this loop does just that with
        the state in local variables, at about half the general path's cost per message; it stops at the first
        message that is anything else, which the general path then takes. ``fast=False`` turns it off, and the tests
        check that both paths give the same state and records.
        """
        once = self._name == "once"
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
            if once:
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
        i, n = 0, len(envs)
        while i < n:
            if self.fast and state is not None and self._plain_run_may_start(state):
                i = self._plain_run(state, envs, i, out)
                if i == n:
                    break
            env = envs[i]
            i += 1
            topic, partition, offset, key, value, kafka_ms = env
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
                self._after_close(state, msg, topic, partition, offset, out)
                continue
            prev_max = state.last_seq
            seq = msg.seq
            if state.first_seq is None or seq < state.first_seq:
                state.first_seq = seq
            if prev_max is None or seq > prev_max:
                state.last_seq = seq
            if state.max_ts is None or msg.ts > state.max_ts:
                state.max_ts = msg.ts
            state.last_ts = msg.ts
            state.topic, state.partition, state.last_offset = topic, partition, offset
            if self._name == "once":
                self._once(state, msg, topic, partition, offset, prev_max, out, now_ms)
            elif self._name == "window":
                self._window(state, msg, env, prev_max, out, now_ms)
            else:
                self._in_order(state, msg, topic, partition, offset, prev_max, out, now_ms)
        if state is not None and not state.closed:
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
        if self._name == "window" and state.buffer:
            self._flush_window(state, out, now_ms, everything=True)
            if state.closed:  # the held-back end closed it
                return state, out
        topic, partition, offset = state.topic, state.partition, state.last_offset or 0
        status = "timed_out"
        if self._name == "once" and state.missing:
            status = "failed"
            for lo, hi in state.missing:
                self._gap(state, lo, hi, topic, partition, offset, None, state.last_ts, out, "still missing")
            state.missing = []
        if self._name == "once":
            self._check_snapshot_seen(state, topic, partition, offset, out)
        out.integrity(
            "timeout",
            sensor=state.sensor,
            session=state.session,
            topic=topic,
            partition=partition,
            offset=offset,
            event_ms=state.last_ts,
            expected_seq=state.end[0] if state.end else state.next_seq,
            detail=f"no message for {self.timeout_ms} ms; session closed without a complete end",
        )
        digest = state.rebuilt_digest()
        expected_rows = state.end[1] if state.end else None
        expected_digest = state.end[2] if state.end else None
        self._close(
            state, out, now_ms, status=status, closed_by="timeout", topic=topic, partition=partition,
            offset=offset, event_ms=state.last_ts, digest=digest, expected_rows=expected_rows,
            expected_digest=expected_digest,
        )  # fmt: skip
        return state, out

    # ------------------------------------------------------------------ policies

    def _in_order(
        self,
        st: SessionState,
        msg: Message,
        topic: str,
        partition: int,
        offset: int,
        prev_max: int | None,
        out: Records,
        now_ms: int,
    ) -> None:
        """``strict``, ``ordered`` and ``none``: apply in arrival order, differing in what an anomaly does."""
        seq, nxt, name = msg.seq, st.next_seq, self._name
        if name == "strict":
            if not st.initialized and st.messages == 0 and (seq != 0 or msg.kind != "snapshot"):
                self._violation("missing_snapshot", st, topic, partition, offset, 0, seq)
            if seq > nxt:
                self._violation("gap", st, topic, partition, offset, nxt, seq)
            if seq < nxt:
                self._violation("duplicate", st, topic, partition, offset, nxt, seq)
            self._apply(st, msg, topic, partition, offset, out, now_ms)
            return
        if seq < nxt:
            i = st.missing_index(seq)
            if i >= 0:
                st.fill_missing(i, seq)
                st.reordered += 1
                if name == "none":
                    self._apply(st, msg, topic, partition, offset, out, now_ms)
                else:
                    out.integrity(
                        "reorder", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                        offset=offset, event_ms=msg.ts, seq=seq, expected_seq=nxt, got_seq=seq,
                        detail=f"arrived after seq {prev_max} was applied; dropped (its gap was recorded)",
                    )  # fmt: skip
            elif name == "none":
                st.duplicates += 1
                self._apply(st, msg, topic, partition, offset, out, now_ms)
            else:
                self._duplicate(st, msg, topic, partition, offset, out, "dropped")
            return
        if seq > nxt:
            self._gap(
                st, nxt, seq - 1, topic, partition, offset, seq, msg.ts, out, "skipped", record=name != "none"
            )
        self._apply(st, msg, topic, partition, offset, out, now_ms)

    def _window(
        self, st: SessionState, msg: Message, env: Envelope, prev_max: int | None, out: Records, now_ms: int
    ) -> None:
        """``window``: hold early messages back and release them in seq order within the lateness."""
        topic, partition, offset, key, value, _ = env
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            i = st.missing_index(seq)
            if i >= 0:
                st.fill_missing(i, seq)
                st.reordered += 1
                out.integrity(
                    "reorder", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                    offset=offset, event_ms=msg.ts, seq=seq, expected_seq=nxt, got_seq=seq,
                    detail="arrived after the window closed on its hole; dropped (its gap was recorded)",
                )  # fmt: skip
            else:
                self._duplicate(st, msg, topic, partition, offset, out, "dropped")
            return
        if seq in st.buffer:
            self._duplicate(st, msg, topic, partition, offset, out, "already held back; dropped")
            return
        if seq > nxt:
            st.buffer[seq] = (msg.ts, topic, partition, offset, key, value)
        else:
            if prev_max is not None and prev_max > seq:
                st.reordered += 1
                out.integrity(
                    "reorder", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                    offset=offset, event_ms=msg.ts, seq=seq, expected_seq=nxt, got_seq=seq,
                    detail=f"arrived after seq {prev_max}; applied in order within the window",
                )  # fmt: skip
            self._apply(st, msg, topic, partition, offset, out, now_ms)
            self._drain(st, out, now_ms)
        self._flush_window(st, out, now_ms, everything=False)

    def _drain(self, st: SessionState, out: Records, now_ms: int) -> None:
        """Apply held-back messages that are now next in line."""
        while not st.closed and st.next_seq in st.buffer:
            _, topic, partition, offset, key, value = st.buffer.pop(st.next_seq)
            self._apply(st, decode(value, key), topic, partition, offset, out, now_ms)

    def _flush_window(self, st: SessionState, out: Records, now_ms: int, everything: bool) -> None:
        """Give up holes the window has passed (or all of them, at timeout), recording each as a gap."""
        limit_n, limit_ms, cap = self.policy.window_messages, self.policy.window_ms, self.policy.max_buffer
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
            self._gap(
                st,
                st.next_seq,
                lo - 1,
                topic,
                partition,
                offset,
                lo,
                ts,
                out,
                "not arrived within the window",
            )
            st.next_seq = lo
            self._drain(st, out, now_ms)
        if st.closed and st.buffer:
            # Messages held back beyond the end: the session is over, so they are late.
            for seq in sorted(st.buffer):
                _, topic, partition, offset, key, value = st.buffer[seq]
                self._after_close(st, decode(value, key), topic, partition, offset, out)
            st.buffer.clear()

    def _once(
        self,
        st: SessionState,
        msg: Message,
        topic: str,
        partition: int,
        offset: int,
        prev_max: int | None,
        out: Records,
        now_ms: int,
    ) -> None:
        """``once``: any order, dedupe by seq, each row from the highest seq that touched it."""
        seq, nxt = msg.seq, st.next_seq
        if seq < nxt:
            i = st.missing_index(seq)
            if i < 0:
                self._duplicate(st, msg, topic, partition, offset, out, "dropped")
                return
            st.fill_missing(i, seq)
        elif seq > nxt:
            st.missing.append((nxt, seq - 1))
        st.next_seq = max(nxt, seq + 1)
        if prev_max is not None and seq < prev_max:
            st.reordered += 1
            out.integrity(
                "reorder", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                offset=offset, event_ms=msg.ts, seq=seq, expected_seq=nxt, got_seq=seq,
                detail=f"arrived after seq {prev_max}; applied by seq",
            )  # fmt: skip
        st.messages += 1
        st.applied_offset = offset
        ts = msg.ts
        if msg.kind == "snapshot":
            st.initialized = True
            rows = msg.rows or []
            ids = set()
            for row in rows:
                row_id = row["id"]
                ids.add(row_id)
                if st.row_seq.get(row_id, -1) < seq:
                    values = fast_canonical_row(row)
                    st.table[row_id] = values
                    st.row_seq[row_id] = seq
                    out.change(
                        st.sensor, st.session, topic, partition, offset, seq, ts, row_id, "snapshot", values
                    )
            for row_id, touched in list(st.row_seq.items()):
                if touched < seq and row_id not in ids and row_id in st.table:
                    del st.table[row_id]
                    st.row_seq[row_id] = seq
                    out.change(
                        st.sensor, st.session, topic, partition, offset, seq, ts, row_id, "delete", None
                    )
        elif msg.kind == "update":
            row = msg.row or {}
            row_id = row["id"]
            if st.row_seq.get(row_id, -1) < seq:
                st.row_seq[row_id] = seq
                if msg.op == "delete":
                    st.table.pop(row_id, None)
                    out.change(
                        st.sensor, st.session, topic, partition, offset, seq, ts, row_id, "delete", None
                    )
                else:
                    values = fast_canonical_row(row)
                    st.table[row_id] = values
                    out.change(
                        st.sensor, st.session, topic, partition, offset, seq, ts, row_id, "upsert", values
                    )
        else:
            st.end = (seq, msg.row_count or 0, msg.digest or "", ts)
        if st.end is not None:
            end_seq = st.end[0]
            if st.next_seq > end_seq and not (st.missing and st.missing[0][0] <= end_seq):
                self._check_snapshot_seen(st, topic, partition, offset, out)
                _, rows_expected, digest_expected, end_ts = st.end
                self._end(
                    st, end_seq, rows_expected, digest_expected, end_ts, topic, partition, offset, out, now_ms
                )

    # ------------------------------------------------------------------ shared steps

    def _apply(
        self,
        st: SessionState,
        msg: Message,
        topic: str,
        partition: int,
        offset: int,
        out: Records,
        now_ms: int,
    ) -> None:
        """Apply one message to the table in order (all policies but ``once``)."""
        seq, ts = msg.seq, msg.ts
        if seq >= st.next_seq:
            st.next_seq = seq + 1
        st.messages += 1
        st.applied_offset = offset
        sensor, session = st.sensor, st.session
        kind = msg.kind
        if kind == "update":
            if not st.initialized:
                self._no_snapshot(st, msg, topic, partition, offset, out)
            row = msg.row or {}
            row_id = row["id"]
            if msg.op == "delete":
                st.table.pop(row_id, None)
                out.change(sensor, session, topic, partition, offset, seq, ts, row_id, "delete", None)
            else:
                values = fast_canonical_row(row)
                st.table[row_id] = values
                out.change(sensor, session, topic, partition, offset, seq, ts, row_id, "upsert", values)
        elif kind == "snapshot":
            st.initialized = True
            old = st.table
            table: dict[int, str] = {}
            for row in msg.rows or []:
                row_id = row["id"]
                values = fast_canonical_row(row)
                table[row_id] = values
                out.change(sensor, session, topic, partition, offset, seq, ts, row_id, "snapshot", values)
            for row_id in old.keys() - table.keys():
                out.change(sensor, session, topic, partition, offset, seq, ts, row_id, "delete", None)
            st.table = table
        else:
            if not st.initialized:
                self._no_snapshot(st, msg, topic, partition, offset, out)
            self._end(
                st, seq, msg.row_count or 0, msg.digest or "", ts, topic, partition, offset, out, now_ms
            )

    def _end(
        self,
        st: SessionState,
        seq: int,
        expected_rows: int,
        expected_digest: str,
        ts: int,
        topic: str,
        partition: int,
        offset: int,
        out: Records,
        now_ms: int,
    ) -> None:
        """Check the rebuilt table against what ``end`` says, then close the session."""
        digest = st.rebuilt_digest()
        mismatch = len(st.table) != expected_rows or digest != expected_digest
        if mismatch:
            detail = (
                f"end says {expected_rows} rows, digest {expected_digest}; "
                f"rebuilt {len(st.table)} rows, digest {digest}"
            )
            if self._name == "strict":
                self._violation("digest_mismatch", st, topic, partition, offset, seq, seq, detail)
            st.digest_mismatches += 1
            if self._name != "none":
                out.integrity(
                    "digest_mismatch", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                    offset=offset, event_ms=ts, seq=seq, detail=detail,
                )  # fmt: skip
        if st.degraded_from_seq is not None:
            status = "degraded"
        elif mismatch:
            status = "failed"
        else:
            status = "ok"
        self._close(
            st, out, now_ms, status=status, closed_by="end", topic=topic, partition=partition, offset=offset,
            event_ms=ts, digest=digest, expected_rows=expected_rows, expected_digest=expected_digest,
        )  # fmt: skip

    def _close(
        self,
        st: SessionState,
        out: Records,
        now_ms: int,
        *,
        status: str,
        closed_by: str,
        topic: str,
        partition: int,
        offset: int,
        event_ms: int | None,
        digest: str,
        expected_rows: int | None,
        expected_digest: str | None,
    ) -> None:
        """Emit the session record and shrink the state to a closed marker kept for one timeout."""
        out.session(
            sensor=st.sensor, session=st.session, topic=topic, partition=partition, offset=offset,
            event_ms=event_ms, status=status, closed_by=closed_by, row_count=len(st.table), digest=digest,
            expected_rows=expected_rows, expected_digest=expected_digest, first_seq=st.first_seq,
            last_seq=st.last_seq, messages=st.messages, gaps=st.gaps, duplicates=st.duplicates,
            reordered=st.reordered, malformed=st.malformed, digest_mismatches=st.digest_mismatches,
            missing_snapshot=st.missing_snapshot, degraded_from_seq=st.degraded_from_seq,
        )  # fmt: skip
        st.closed = True
        st.closed_by = closed_by
        st.table = {}
        st.row_seq = {}
        st.end = None
        st.deadline_ms = now_ms + self.timeout_ms

    def _gap(
        self,
        st: SessionState,
        lo: int,
        hi: int,
        topic: str,
        partition: int,
        offset: int,
        got: int | None,
        event_ms: int | None,
        out: Records,
        why: str,
        record: bool = True,
    ) -> None:
        """Count and record seqs ``lo..hi`` as missing; the session is degraded from the first of them."""
        st.gaps += hi - lo + 1
        if self._name != "once":
            st.missing.append((lo, hi))
        if st.degraded_from_seq is None or lo < st.degraded_from_seq:
            st.degraded_from_seq = lo
        if record:
            out.integrity(
                "gap", sensor=st.sensor, session=st.session, topic=topic, partition=partition, offset=offset,
                event_ms=event_ms, seq=got, expected_seq=lo, got_seq=got, missing_from=lo, missing_to=hi,
                detail=f"seqs {lo}..{hi} {why}",
            )  # fmt: skip

    def _duplicate(
        self, st: SessionState, msg: Message, topic: str, partition: int, offset: int, out: Records, what: str
    ) -> None:
        st.duplicates += 1
        out.integrity(
            "duplicate", sensor=st.sensor, session=st.session, topic=topic, partition=partition, offset=offset,
            event_ms=msg.ts, seq=msg.seq, expected_seq=st.next_seq, got_seq=msg.seq,
            detail=f"seq {msg.seq} was already seen; {what}",
        )  # fmt: skip

    def _no_snapshot(
        self, st: SessionState, msg: Message, topic: str, partition: int, offset: int, out: Records
    ) -> None:
        """An update or end reached a table no snapshot initialized (reported once per session)."""
        if st.missing_snapshot:
            return
        st.missing_snapshot = 1
        st.degraded_from_seq = 0
        if self._name != "none":
            out.integrity(
                "missing_snapshot", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
                offset=offset, event_ms=msg.ts, seq=msg.seq, expected_seq=0, got_seq=msg.seq,
                detail=f"{msg.kind} seq {msg.seq} applied to a table no snapshot initialized",
            )  # fmt: skip

    def _check_snapshot_seen(
        self, st: SessionState, topic: str, partition: int, offset: int, out: Records
    ) -> None:
        """``once`` at close: a session whose seqs never included a snapshot has no trustworthy table."""
        if st.initialized or st.missing_snapshot:
            return
        st.missing_snapshot = 1
        st.degraded_from_seq = 0
        out.integrity(
            "missing_snapshot", sensor=st.sensor, session=st.session, topic=topic, partition=partition,
            offset=offset, event_ms=st.last_ts, expected_seq=0, detail="no snapshot was applied to this session",
        )  # fmt: skip

    def _after_close(
        self, st: SessionState, msg: Message, topic: str, partition: int, offset: int, out: Records
    ) -> None:
        """A message for a session that already closed: a duplicate, or a late message (never a new session)."""
        seq = msg.seq
        late = seq >= st.next_seq or st.missing_index(seq) >= 0
        violation = "late_after_close" if late else "duplicate"
        if self._name == "strict":
            self._violation(
                violation, st, topic, partition, offset, None, seq, f"session closed by {st.closed_by}"
            )
        if self._name == "none":
            return
        out.integrity(
            violation, sensor=st.sensor, session=st.session, topic=topic, partition=partition, offset=offset,
            event_ms=msg.ts, seq=seq, got_seq=seq,
            detail=f"session already closed by {st.closed_by}; dropped",
        )  # fmt: skip

    def _malformed(self, st: SessionState | None, env: Envelope, reason: str, out: Records) -> None:
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

    def _violation(
        self,
        violation: str,
        st: SessionState,
        topic: str,
        partition: int,
        offset: int,
        expected: int | None,
        got: int | None,
        detail: str = "",
    ) -> NoReturn:
        raise IntegrityViolation(
            violation,
            sensor=st.sensor,
            session=st.session,
            topic=topic,
            partition=partition,
            offset=offset,
            expected_seq=expected,
            got_seq=got,
            last_offset=st.applied_offset,
            detail=detail,
        )


def envelopes_from_columns(
    topics: list[Any],
    partitions: list[Any],
    offsets: list[Any],
    keys: list[Any],
    values: list[Any],
    timestamps: list[Any],
) -> list[Envelope]:
    """Zip column lists into envelopes (the cheap path from a pandas/Arrow batch)."""
    return list(map(Envelope._make, zip(topics, partitions, offsets, keys, values, timestamps, strict=True)))
