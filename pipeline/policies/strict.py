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
        """Stop the query at the message at ``pos``, naming the session, the seqs and the last offset applied."""
        record = IntegrityRecord(
            violation,
            st.sensor,
            st.session,
            position_of(pos),
            expected_seq=expected,
            got_seq=got,
            detail=detail,
        )
        raise IntegrityViolation(record, last_offset=st.applied_offset)
