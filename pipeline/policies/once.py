"""``once``: any order, each seq once; each row comes from the highest seq that touched it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.integrity import IntegrityRecord
from pipeline.policies.base import Policy
from pipeline.state import End, Envelope, Located, SessionState, fast_canonical_row, position_of
from sotw.wire import Message

if TYPE_CHECKING:
    from pipeline.records import ChangeHead, Records


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
            out,
            IntegrityRecord(
                "missing_snapshot", st.sensor, st.session, position_of(pos), event_ms=st.last_ts, expected_seq=0,
                detail="no snapshot was applied to this session",
            ),
        )  # fmt: skip
