"""The fault injector: what happens to a planned message that was given a fault.

``simulator.faults`` decides which message gets which fault; ``FaultInjector`` carries the decision out
through the sender: a gap or an abandoned end is recorded but never sent, a malformed message is sent
broken, and a delayed message or a duplicate copy is held back (``HeldMessage``) and sent when it falls due,
a delayed one only once a later seq of its session went out. It also counts the faults of the run.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace

from simulator.faults import ABANDONED, DELAYED, DUPLICATE, FAULT_NAMES, GAP, MALFORMED, NONE, malform
from simulator.ledger import KIND_NAMES
from simulator.planner import Message, Planned
from simulator.sender import Sender

#: How long a delayed message that is due waits before it looks again for a later seq of its session, ms of
#: schedule.
RECHECK_MS = 10


@dataclass(order=True)
class HeldMessage:
    """A message held back until ``due_ms`` (schedule time): a delayed one, or a duplicate's copy.

    Held messages are ordered by when they are due, then by when they were held.
    """

    due_ms: int
    order: int
    message: Message = field(compare=False)
    fault: int = field(compare=False)


class FaultInjector:
    """Carries out the faults planned for messages, and holds back the messages sent late.

    Parameters
    ----------
    sender
        Sends messages and records the ones never sent.
    """

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        #: Faults injected so far, by fault code (``faults.FAULT_NAMES``).
        self.counts = [0] * len(FAULT_NAMES)
        self._held: list[HeldMessage] = []  # a heap
        self._order = itertools.count()

    @property
    def next_due_ms(self) -> float:
        """When the first held message falls due (infinite when none is held)."""
        return self._held[0].due_ms if self._held else math.inf

    def inject(self, planned: Planned) -> None:
        """Carry out a message's fault (``planned.fault`` must not be ``NONE``)."""
        msg, fault = planned.message, planned.fault
        self.counts[fault] += 1
        if fault in (GAP, ABANDONED):
            self.sender.record_unsent(msg, fault)
        elif fault == MALFORMED:
            variant = int(planned.draw * 1_000_003) % 3
            broken = malform(msg.value, KIND_NAMES[msg.kind], msg.seq, variant)
            self.sender.send(replace(msg, value=broken), MALFORMED)
        elif fault == DELAYED:
            self._hold(msg.intended_ms + max(planned.delay_ms, 1), msg, DELAYED)
        elif fault == DUPLICATE:
            self.sender.send(msg, NONE)
            self._hold(msg.intended_ms + planned.delay_ms, msg, DUPLICATE)

    def _hold(self, due_ms: int, msg: Message, fault: int) -> None:
        heapq.heappush(self._held, HeldMessage(due_ms, next(self._order), msg, fault))

    def release(self, upto_ms: float, force: bool = False) -> None:
        """Send the held messages due by ``upto_ms``; a delayed one also waits until a later seq went out.

        With ``force`` (the end of the run) every one due goes, whatever its session sent.
        """
        held = self._held
        while held and held[0].due_ms <= upto_ms:
            item = heapq.heappop(held)
            sess, seq = item.message.session, item.message.seq
            if item.fault == DELAYED and not force and sess.hi <= seq and not sess.closed:
                # Look again a little later on the schedule; the session's next message will pass it.
                self._hold(int(upto_ms) + RECHECK_MS, item.message, DELAYED)
                continue
            self.sender.send(item.message, item.fault)

    def drop_held(self) -> None:
        """Record every message still held back as never sent (a run cut short): they were planned."""
        for item in self._held:
            self.sender.record_unsent(item.message, item.fault)
        self._held.clear()
