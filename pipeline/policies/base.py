"""What every integrity policy shares: the rule each one must give, and the steps most of them take alike.

``Policy`` is the common base of the five policies (one module each beside this one). A policy's own rule is
``admit``; the shared steps here (apply a message to the table, close at the end or at timeout, record a gap,
a duplicate, a reorder, a missing snapshot, a message after close) do what most policies do, and a policy
overrides the one step that differs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from pipeline.integrity import IntegrityRecord
from pipeline.policies.config import PolicyConfig
from pipeline.state import End, Envelope, Located, SessionState, fast_canonical_row, position_of
from sotw.wire import Message

if TYPE_CHECKING:
    from pipeline.records import ChangeHead, Records


class Policy(ABC):
    """What one integrity policy does with each message of an open session, and the steps all policies share.

    One subclass per policy, chosen once per run by ``pipeline.policies.policy_for``. A policy's own rule is
    ``admit`` (a message in seq order or not, a repeat, a skip); the shared steps (apply a message to the
    table, close at the end or at timeout, gap, duplicate, reorder, missing snapshot, a message after close)
    do what most policies do, and a subclass overrides the one that differs: ``Strict`` stops where others
    record, ``NoIntegrity`` only counts (``_report``), ``Once`` and ``Window`` settle what they wait for at
    timeout (``_settle``). Instances hold nothing but the run's configuration: every method is a function of
    the state and records it is given.

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
        detail = f"session already closed by {st.closed_by}; dropped"
        self._report(out, self._about(st, msg, pos, violation, expected=None, detail=detail))

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
        out.integrity(
            IntegrityRecord(
                "timeout", st.sensor, st.session, pos, event_ms=st.last_ts,
                expected_seq=end.seq if end is not None else st.next_seq,
                detail=f"no message for {quiet_ms} ms; session closed without a complete end",
            )
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

    def _report(self, out: Records, record: IntegrityRecord) -> None:
        """Record an anomaly the policy tolerates (``NoIntegrity`` only counts it)."""
        out.integrity(record)

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
        self._report(
            out,
            IntegrityRecord(
                "digest_mismatch", st.sensor, st.session, position_of(pos), event_ms=end.ts, seq=end.seq,
                detail=detail,
            ),
        )  # fmt: skip

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
            out,
            IntegrityRecord(
                "gap", st.sensor, st.session, position_of(pos), event_ms=event_ms, seq=got, expected_seq=lo,
                got_seq=got, missing=(lo, hi), detail=f"seqs {lo}..{hi} {why}",
            ),
        )  # fmt: skip

    def _duplicate(self, st: SessionState, msg: Message, pos: Located, out: Records, what: str) -> None:
        """A seq that was already seen came again; ``what`` says what became of it."""
        st.duplicates += 1
        detail = f"seq {msg.seq} was already seen; {what}"
        self._report(out, self._about(st, msg, pos, "duplicate", expected=st.next_seq, detail=detail))

    def _reorder(self, st: SessionState, msg: Message, pos: Located, out: Records, detail: str) -> None:
        """A seq arrived after a higher one; ``detail`` says what became of it."""
        st.reordered += 1
        self._report(out, self._about(st, msg, pos, "reorder", expected=st.next_seq, detail=detail))

    def _no_snapshot(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """An update or end reached a table no snapshot initialized (reported once per session)."""
        if st.missing_snapshot:
            return
        st.missing_snapshot = 1
        st.degraded_from_seq = 0
        detail = f"{msg.kind} seq {msg.seq} applied to a table no snapshot initialized"
        self._report(out, self._about(st, msg, pos, "missing_snapshot", expected=0, detail=detail))

    @staticmethod
    def _about(
        st: SessionState, msg: Message, pos: Located, violation: str, *, expected: int | None, detail: str
    ) -> IntegrityRecord:
        """The integrity record of ``violation`` about the message ``msg`` at ``pos``: its seq, the one expected."""
        return IntegrityRecord(
            violation, st.sensor, st.session, position_of(pos), event_ms=msg.ts, seq=msg.seq,
            expected_seq=expected, got_seq=msg.seq, detail=detail,
        )  # fmt: skip
