"""The sender: hands planned messages to the producer when they are due, and keeps the ledger of what it sent.

``Sender`` owns everything between a planned message and its ledger row:

- pacing: ahead of the schedule it sleeps until the next message is due, waking at most once a tick
  (``tick_s``), so each wake sends everything that fell due meanwhile and the loop costs the same few
  wakes a second whatever the rate. Behind the schedule it never sleeps and never skips: lateness (sent
  minus intended) is measured instead (open loop).
- producing one message, or a stretch of a run straight from the encoder's buffer (``StagedRun``), and
  backpressure: a full local queue is served until the message goes in (``backpressure_waits``); a queue
  that stays full ``stall_timeout_s``, or a message the client refuses, stops the run with a reason. A
  message refused because its topic no longer exists (deleted, or gone with a broker's data) is a failed
  delivery instead: its ledger row says so, and the run goes on, as an application's producer would.
- delivery reports: each message is produced with its ledger row number, and each report gives it back with
  its offset or its error; they reach the ledger as arrays, dated by the clock read after the poll that
  served them.

It is the only writer of ledger rows, so rows are numbered in the order messages went out, and a message
is in the ledger as soon as it is produced: nothing reaches the topics that the ledger lacks.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.client import MessageProducer
from simulator.config import SimulatorError
from simulator.faults import MALFORMED, NONE
from simulator.interrupts import held_interrupts
from simulator.ledger import UPDATE, Ledger
from simulator.planner import Message, UpdateRun
from simulator.rdkafka import (
    FATAL,
    MSG_SIZE_TOO_LARGE,
    QUEUE_FULL,
    UNKNOWN_PARTITION,
    UNKNOWN_TOPIC,
    error_text,
)

log = logging.getLogger(__name__)

#: Messages produced between two polls at full speed (each slice: one compiled call, one poll).
SLICE = 256
#: The longest single sleep while waiting for the schedule: reports are served at least this often.
MAX_SLEEP_S = 0.01


@dataclass
class StagedRun:
    """An ``UpdateRun`` with what the producer needs per message, and what the sender learns as it sends.

    Parameters
    ----------
    run
        The planned run.
    session_codes
        Each message's session code, for its ledger row.
    topics, partitions
        Each message's topic handle (``MessageProducer.topic``) and partition.
    keys, key_at
        The keys of the run's sessions in one buffer: session ``s``'s is ``keys[key_at[s]:key_at[s + 1]]``.
    rows
        Each message's ledger row number, set just before it is produced.
    sent
        Each message's send time (epoch seconds; -1 until it is produced), set as it is produced.
    """

    run: UpdateRun
    session_codes: np.ndarray
    topics: np.ndarray
    partitions: np.ndarray
    keys: np.ndarray
    key_at: np.ndarray
    rows: np.ndarray
    sent: np.ndarray

    def produce_args(self) -> tuple[np.ndarray, ...]:
        """``MessageProducer.produce_run``'s arrays."""
        values = self.run.values
        return (
            self.topics,
            self.partitions,
            values.text,
            values.bounds,
            self.keys,
            self.key_at,
            self.run.session_index,
            self.rows,
            self.sent,
        )


class Sender:
    """Sends planned messages on schedule and records them, with their delivery reports, in the ledger.

    Parameters
    ----------
    producer
        The Kafka producer (``simulator.rdkafka.DirectProducer`` or ``simulator.client.ClientProducer``).
    ledger
        The run's ledger.
    clock
        Epoch seconds, advancing with real time: send times, report times, and the schedule's waits.
    bootstrap
        The brokers' address, for error messages.
    stall_timeout_s
        Give up when the producer's queue stays full this long.
    flush_timeout_s
        How long ``flush`` waits for outstanding reports.
    tick_s
        The shortest time between two wakes of a loop waiting for the schedule.
    """

    def __init__(
        self,
        producer: MessageProducer,
        ledger: Ledger,
        clock: Callable[[], float],
        *,
        bootstrap: str,
        stall_timeout_s: float,
        flush_timeout_s: float,
        tick_s: float,
    ) -> None:
        self.producer = producer
        self.ledger = ledger
        self.clock = clock
        self.bootstrap = bootstrap
        self.stall_timeout_s = stall_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.tick_ms = tick_s * 1000.0
        #: Messages handed to the producer (duplicate copies included).
        self.sent = 0
        #: Times the producer's queue was full and a message waited for the broker.
        self.backpressure_waits = 0
        #: The producer met a fatal error and refuses every message: it needs replacing (``renew``).
        self.fatal = False
        #: Producers replaced after a fatal error.
        self.renewals = 0
        self._woke_ms = -np.inf  # when the loop last woke from waiting for the schedule

    # ---- pacing and reports ---------------------------------------------------------------------------

    def wait_until(self, due_ms: float) -> None:
        """Wait for ``due_ms`` (epoch ms), and at least a tick after the last wake, serving reports meanwhile.

        Returns at once when it is already due. Whoever calls it sends everything due by the time it
        returns before asking again, so the loop wakes at most once a tick whatever the rate, and a message
        is late by about a tick at most while the loop keeps up.
        """
        now_ms = self.clock() * 1000.0
        if due_ms <= now_ms:
            return
        wake_ms = max(due_ms, self._woke_ms + self.tick_ms)
        while now_ms < wake_ms:
            time.sleep(min(wake_ms - now_ms, MAX_SLEEP_S * 1000.0) / 1000.0)
            now_ms = self.serve() * 1000.0
        self._woke_ms = now_ms

    def serve(self, timeout_s: float = 0.0) -> float:
        """Poll the producer (waiting up to ``timeout_s``) and record its reports; return the clock read after."""
        self.producer.poll(timeout_s)
        return self.record_reports()

    def record_reports(self) -> float:
        """Hand the reports served since the last call to the ledger, dated by the clock read now; return it."""
        now = self.clock()
        self._record(self.producer, now)
        return now

    # ---- sending --------------------------------------------------------------------------------------

    def send(self, msg: Message, fault: int = NONE) -> None:
        """Produce one message now and add its ledger row (off the hot path: its digest is computed here).

        The row is added first and taken back if the client refuses the message: a Ctrl-C landing between
        the two then leaves a row recorded as sent that never was (reported as not acknowledged), never a
        message on a topic without its row.
        """
        producer, ledger, session = self.producer, self.ledger, msg.session
        topic = producer.topic(session.topic)
        now, digest = self.clock(), hashlib.sha256(msg.value).digest()
        row = ledger.add_row(
            session.code, msg.seq, msg.kind, fault, msg.intended_ms, now, digest, msg.row_id, msg.op
        )
        try:
            refused = self._produce_or_wait(
                functools.partial(producer.produce, topic, session.partition, msg.value, session.key, row),
                session.topic,
                len(msg.value),
            )
        except SimulatorError:
            ledger.unsend_last()
            raise
        if refused:
            self._failed(row, refused, now)
        self.sent += 1
        if fault in (NONE, MALFORMED) and msg.seq > session.hi:
            session.hi = msg.seq

    def record_unsent(self, msg: Message, fault: int) -> None:
        """Add the ledger row of a message planned but never sent (a gap, an abandoned end, one held back)."""
        self.ledger.add_row(
            msg.session.code, msg.seq, msg.kind, fault, msg.intended_ms, row_id=msg.row_id, op=msg.op
        )

    def stage(self, run: UpdateRun) -> StagedRun:
        """What the producer needs to send ``run``'s messages (topic handles, partitions, keys)."""
        sessions, index, m = run.sessions, run.session_index, len(run)
        topic = self.producer.topic
        key_at = np.zeros(len(sessions) + 1, dtype=np.int64)
        key_at[1:] = np.cumsum([len(sess.key) for sess in sessions])
        handles = [topic(sess.topic) if sess.code >= 0 else 0 for sess in sessions]
        return StagedRun(
            run=run,
            session_codes=np.array([sess.code for sess in sessions], dtype=np.int32)[index],
            topics=np.array(handles, dtype=np.int64)[index],
            partitions=np.array([sess.partition for sess in sessions], dtype=np.int32)[index],
            keys=np.frombuffer(b"".join(sess.key for sess in sessions) + b"\0", dtype=np.uint8).copy(),
            key_at=key_at,
            rows=np.zeros(m, dtype=np.int64),
            sent=np.full(m, -1.0),
        )

    def send_stretch(self, staged: StagedRun, start: int, stop: int, paced: bool) -> None:
        """Send messages ``start:stop`` of a staged run (none with a fault) and add their ledger rows.

        Paced, each message waits until it is due; unpaced, they go as fast as the producer takes them.
        Whatever stops it (a Ctrl-C, a refused message, a stalled broker), the messages already produced get
        their rows.
        """
        ledger, run = self.ledger, staged.run
        index, seqs = run.session_index[start:stop], run.seqs[start:stop]
        staged.rows[start:stop] = np.arange(ledger.next_index, ledger.next_index + (stop - start))
        # Each session's highest seq sent in order (delayed messages wait for a later one).
        last = np.full(len(run.sessions), -1, dtype=np.int64)
        np.maximum.at(last, index, seqs)
        for k in np.flatnonzero(last >= 0).tolist():
            run.sessions[k].hi = int(last[k])
        sent = staged.sent[start:stop]
        try:
            self._produce_stretch(staged, start, stop, paced)
        finally:
            done = int(np.count_nonzero(sent >= 0))  # produced in order: a prefix
            if done:
                ledger.add_block(
                    staged.session_codes[start : start + done],
                    seqs[:done],
                    UPDATE,
                    NONE,
                    run.due_ms_array[start : start + done],
                    sent[:done],
                    run.values[start : start + done],
                    run.row_ids[start : start + done],
                    run.deletes[start : start + done],
                )
                self.sent += done

    def _produce_stretch(self, staged: StagedRun, start: int, stop: int, paced: bool) -> None:
        """Produce messages ``start:stop`` in slices of what is due (at most ``SLICE``).

        ``staged.sent`` gets each produced message's send time as it is produced: the clock read before its
        slice, as the ledger's ``sent_ts`` promises. Unpaced (or catching up), reports are served after
        each full slice; paced, while waiting for the next message.
        """
        producer, clock, due_ms = self.producer, self.clock, staged.run.due_ms
        args = staged.produce_args()
        now = clock()
        i = start
        while i < stop:
            if paced:
                if due_ms[i] > now * 1000.0:
                    self.wait_until(due_ms[i])
                    now = clock()
                j = bisect.bisect_right(due_ms, now * 1000.0, i, min(stop, i + SLICE))
            else:
                j = min(stop, i + SLICE)
            k = i
            while k < j:
                k, err = producer.produce_run(args, k, j, now)
                if err:
                    topic = staged.run.sessions[staged.run.session_index[k]].topic
                    size = int(args[3][k + 1] - args[3][k] - 1)
                    refused = self._produce_or_wait(
                        functools.partial(self._produce_one, args, k, now), topic, size, err
                    )
                    if refused:
                        staged.sent[k] = now  # tried then, like the messages around it
                        self._failed(int(staged.rows[k]), refused, now)
                    k += 1
            if not paced or j - i == SLICE:
                self.serve()
            i = j
            now = clock()

    def _produce_one(self, args: tuple[np.ndarray, ...], k: int, now: float) -> int:
        """Message ``k`` of a staged run: 0, or librdkafka's error."""
        return self.producer.produce_run(args, k, k + 1, now)[1]

    def _produce_or_wait(
        self, produce: Callable[[], int], topic: str, size: int, err: int | None = None
    ) -> int:
        """Produce one message (``produce`` returns librdkafka's error code), waiting while the queue is full.

        ``err`` is the error of a try already made. A full local queue is served until the message goes in
        (never dropped); if it stays full ``stall_timeout_s``, or the client refuses the message outright,
        the run stops with an error saying why. Returns 0 once the message is queued, or the error code when
        the client refused it because its topic or partition no longer exists, or because the producer met a
        fatal error (``fatal`` is then set, for the simulator to make a new producer between blocks).
        """
        if err is None:
            err = produce()
        if err == QUEUE_FULL:
            self.backpressure_waits += 1
            deadline = time.monotonic() + self.stall_timeout_s
            while err == QUEUE_FULL:
                if time.monotonic() > deadline:
                    raise SimulatorError(
                        f"the broker at {self.bootstrap} took no messages for "
                        f"{self.stall_timeout_s:g} s (producer queue full); is it still running?"
                    )
                self.serve(0.01)
                err = produce()
        if err in (UNKNOWN_TOPIC, UNKNOWN_PARTITION):
            return err
        if err == FATAL:
            self.fatal = True
            return err
        if err:
            hint = (
                " (fewer --rows or columns, or a larger message.max.bytes via -P and on the broker)"
                if err == MSG_SIZE_TOO_LARGE
                else ""
            )
            raise SimulatorError(
                f"the producer refused a {size:,}-byte message for {topic}: {error_text(err)}{hint}"
            )
        return 0

    def _failed(self, row: int, err: int, now: float) -> None:
        """Record the message of ledger row ``row`` as failed with ``err``, as its delivery report would."""
        one = np.array([row], dtype=np.int64)
        self.ledger.acknowledge(
            one, np.array([-1], dtype=np.int64), np.array([err], dtype=np.int64), now, error_text
        )

    def renew(self, producer: MessageProducer) -> None:
        """Send through ``producer`` from now on, after the current one met a fatal error.

        The old producer's outstanding messages are purged (their reports say so, or give the fatal error)
        and it is closed. Call it between blocks: a staged run holds the old producer's topic handles.
        """
        old, self.producer = self.producer, producer
        with contextlib.suppress(Exception):
            old.purge()
        deadline = time.monotonic() + 2.0
        while len(old) and time.monotonic() < deadline:
            old.poll(0.05)
            self._record(old, self.clock())
        self._record(old, self.clock())
        old.close()
        self.fatal = False
        self.renewals += 1
        log.warning(
            "the producer met a fatal error (librdkafka's log says which); a new one sends from now on, and "
            "%d messages of the old one were never acknowledged",
            self.ledger.outstanding(),
        )

    def _record(self, producer: MessageProducer, now: float) -> None:
        """Hand ``producer``'s reports served so far to the ledger, dated ``now``."""
        with held_interrupts():  # once taken from the producer, the reports must reach the ledger
            rows, offsets, codes = producer.take()
            if len(rows):
                self.ledger.acknowledge(rows, offsets, codes, now, error_text)

    # ---- the end --------------------------------------------------------------------------------------

    def flush(self) -> int:
        """Wait for outstanding reports, purge what is left so its reports say so; return how many never came."""
        remaining = self._flush_for(self.flush_timeout_s)
        if remaining:
            log.warning(
                "%d messages not acknowledged after %g s; purging them", remaining, self.flush_timeout_s
            )
            with contextlib.suppress(Exception):
                self.producer.purge()
            self._flush_for(2.0)
        return max(remaining, self.ledger.outstanding())

    def give_up(self) -> int:
        """Cut the flush short (a second Ctrl-C): purge, take what reports come at once; return those missing."""
        with contextlib.suppress(Exception):
            self.producer.purge()
            self.serve(0.5)
        return self.ledger.outstanding()

    def _flush_for(self, timeout_s: float) -> int:
        """``producer.flush`` in short slices, dating the reports of each slice for ``acked_ts``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = self.producer.flush(max(0.0, min(0.02, deadline - time.monotonic())))
            self.record_reports()
            if remaining == 0 or time.monotonic() >= deadline:
                return remaining
