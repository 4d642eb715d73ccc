"""``window``: hold early messages back, apply in seq order; a hole older than the lateness is a gap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.integrity import Position
from pipeline.policies.base import Policy
from pipeline.state import Buffered, Envelope, Located, SessionState
from sotw.wire import Message, decode

if TYPE_CHECKING:
    from pipeline.records import Records


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


def _unbuffer(held: Buffered) -> tuple[Position, Message]:
    """Where a held-back message sat and the message itself (it was valid when it was held back)."""
    _, topic, partition, offset, key, value = held
    return Position(topic, partition, offset), decode(value, key)
