"""The session processor: rebuild a session's table from its messages, under the run's integrity policy.

``SessionProcessor.apply`` takes a session's state and a batch of raw Kafka envelopes and returns the new
state and the output records; ``expire`` closes a session that went quiet. The processor does what is the
same under every policy (Kafka order, decoding, dead letters, the hot path for plain updates); what a policy
decides lives in one small class per policy (``pipeline.policies``), chosen once per run from
``PolicyConfig``. Nothing here touches Spark, so every rule is unit-tested on hand-built envelopes, and
``pipeline.reconstruct`` only converts between pandas and envelopes around it. The rules are documented in
``docs/pipeline.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from operator import itemgetter

import orjson

from pipeline.errors import IntegrityViolation
from pipeline.integrity import IntegrityRecord, Position
from pipeline.policies import PolicyConfig, policy_for
from pipeline.records import Records
from pipeline.state import Envelope, SessionState, fast_canonical_row
from sotw.wire import MalformedMessage, decode, plain_update

log = logging.getLogger(__name__)

# Spark hands a group's rows over in no particular order; Kafka's order is (partition, offset).
_POSITION = itemgetter(0, 1, 2)


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
            digest mismatch or message after close; its ``records`` are the records of this batch's messages
            before that one.
        """
        out = Records()
        envs = sorted(envelopes, key=_POSITION)
        policy = self.policy
        admit = policy.admit
        # A closed marker keeps the deadline its close set; a session open at the start of the batch gets a
        # new one, whether it is still open at the end or closed during it.
        was_closed = state is not None and state.closed
        i, n = 0, len(envs)
        try:
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
                    state = SessionState(
                        session=msg.session, sensor=msg.sensor, topic=topic, partition=partition
                    )
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
        except IntegrityViolation as stop:
            # What the batch produced before the stop goes with it, so that the stateful step can commit it
            # beside the violation's own record; the messages after it are not applied.
            stop.records = out
            raise
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
        record = IntegrityRecord(
            "malformed", sensor, session, Position(topic, partition, offset), event_ms=kafka_ms, detail=reason
        )
        out.dead_letter(record, key, value)
        out.integrity(record)
        if st is not None and not st.closed:
            st.malformed += 1
        log.debug("malformed message at %s[%d]@%d: %s", topic, partition, offset, reason)


def _sniff_sensor(value: bytes | None) -> str | None:
    """Best effort: the sensor of a malformed value, if it is a JSON object with a string ``sensor``."""
    try:
        obj = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return None
    sensor = obj.get("sensor") if isinstance(obj, dict) else None
    return sensor if isinstance(sensor, str) else None
