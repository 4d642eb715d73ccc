"""``none``: apply every valid message in arrival order, repeats included; anomalies are only counted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.integrity import IntegrityRecord
from pipeline.policies.base import Policy
from pipeline.state import Envelope, SessionState
from sotw.wire import Message

if TYPE_CHECKING:
    from pipeline.records import Records


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

    def _report(self, out: Records, record: IntegrityRecord) -> None:
        """No integrity records: the session record's counters are all this policy reports."""
