"""``strict``: every message in seq order from the snapshot on; anything else stops the query."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from pipeline.errors import IntegrityViolation
from pipeline.integrity import IntegrityRecord
from pipeline.policies.base import Policy
from pipeline.state import End, Envelope, Located, SessionState, position_of
from sotw.wire import Message

if TYPE_CHECKING:
    from pipeline.records import Records


class Strict(Policy):
    """``strict``: every message in seq order from the snapshot on; anything else stops the query."""

    name = "strict"

    def admit(self, st: SessionState, msg: Message, env: Envelope, out: Records) -> None:
        """Apply the message if it is the next seq, the session's first being its snapshot; else stop."""
        seq, nxt, ts = msg.seq, st.next_seq, msg.ts
        if not st.initialized and st.messages == 0 and (seq != 0 or msg.kind != "snapshot"):
            self._stop(st, env, "missing_snapshot", expected=0, got=seq, event_ms=ts)
        if seq > nxt:
            self._stop(st, env, "gap", expected=nxt, got=seq, event_ms=ts, missing=(nxt, seq - 1))
        if seq < nxt:
            self._stop(st, env, "duplicate", expected=nxt, got=seq, event_ms=ts)
        self._apply(st, msg, env, out)

    def after_close(self, st: SessionState, msg: Message, pos: Located, out: Records) -> None:
        """Any message after the session closed stops the query."""
        violation = "duplicate" if st.seen(msg.seq) else "late_after_close"
        detail = f"session closed by {st.closed_by}"
        self._stop(st, pos, violation, expected=None, got=msg.seq, event_ms=msg.ts, detail=detail)

    def _digest_mismatch(self, st: SessionState, end: End, pos: Located, out: Records, detail: str) -> None:
        self._stop(st, pos, "digest_mismatch", expected=end.seq, got=end.seq, event_ms=end.ts, detail=detail)

    def _stop(
        self,
        st: SessionState,
        pos: Located,
        violation: str,
        *,
        expected: int | None,
        got: int,
        event_ms: int,
        missing: tuple[int, int] | None = None,
        detail: str = "",
    ) -> NoReturn:
        """Stop the query at the message at ``pos``, naming the session, the seqs and the last offset applied.

        The record is the integrity row the stop commits (``SessionFunction`` writes it with the session's
        records of the batch before it), so it says what any policy's record of the violation says: the
        message's seq and event time, and for a gap the seqs ``missing``.
        """
        record = IntegrityRecord(
            violation, st.sensor, st.session, position_of(pos), event_ms=event_ms, seq=got,
            expected_seq=expected, got_seq=got, missing=missing, detail=detail,
        )  # fmt: skip
        raise IntegrityViolation(record, last_offset=st.applied_offset)
