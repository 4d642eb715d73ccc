"""``ordered``: apply in arrival order; a skip is a recorded gap, a stale seq is dropped and recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.policies.base import Policy
from pipeline.state import Envelope, SessionState
from sotw.wire import Message

if TYPE_CHECKING:
    from pipeline.records import Records


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
