"""The verifier's model of each integrity policy: one class per policy, mirroring ``pipeline.policies``.

``Policy`` is a run's policy as the verifier knows it (its name and settings); ``Policy.model`` is its class
here. Each class replays a session's delivered copies in Kafka order under its policy and says which statuses the
session may close with; ``loadtest.correctness.expect`` turns the replays into what the pipeline must write.
The classes share names with the pipeline's (``Strict``, ``Ordered``, ``Once``, ``Window``, ``NoIntegrity``) and no code:
the verifier stays an independent model of the specification. Where the specification leaves the pipeline a
choice, a class gives one replay per reading (``readings``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

SESSION_LEVEL = -1  # the seq used for violations about a whole session (timeout, digest mismatch, ...)
Event = tuple[str, int]
Arrival = tuple[int, str, int]  # seq, kind, event time (intended_ts)


@dataclass
class Outcome:
    """One replay of a session under one reading of the policy."""

    applied: Counter[int] = field(default_factory=Counter)
    events: set[Event] = field(default_factory=set)
    optional_events: set[Event] = field(default_factory=set)
    optional_applied: set[int] = field(default_factory=set)
    closed_by: str | None = None
    via_timeout: bool = False
    at_timeout: set[Event] = field(default_factory=set)  # reported only when the session times out
    degraded_from: int | None = None
    missing: bool = False
    exact: bool = False
    clean: bool = True
    stop_at: int | None = None
    #: Under ``strict``, the violations a job may name as the one that stopped it at ``stop_at``.
    stop_events: set[Event] = field(default_factory=set)

    def late(self, seq: int) -> None:
        """A copy that came after the session closed: reported as late or as a duplicate, never applied."""
        self.optional_events.update({("late_after_close", seq), ("duplicate", seq), ("reorder", seq)})

    def gap(self, start: int, stop: int) -> None:
        """Record seqs ``start .. stop-1`` as a required gap; the session degrades from the first."""
        self.events.update(("gap", m) for m in range(start, stop))
        if start < stop and self.degraded_from is None:
            self.degraded_from = start
        if start == 0 < stop:
            self.optional_events.add(("missing_snapshot", SESSION_LEVEL))


def _replay_ordered(arrivals: Sequence[Arrival], strict: bool) -> Outcome:
    """``ordered``: in order, stale and repeated seqs dropped; ``strict`` stops at the first violation.

    A strict stop may be named in more than one way (``Outcome.stop_events``): a gap names every seq it
    skipped, and a first message that is not the snapshot a missing snapshot; a seq below the next expected
    is a duplicate or a reorder (the job cannot tell them apart without remembering every seq); a copy after
    the session closed is late or a duplicate.
    """
    out, expected, seen = Outcome(), 0, set[int]()
    for seq, kind, _ts in arrivals:
        if out.closed_by is not None:
            out.late(seq)
            if strict:
                out.stop_at, out.clean = seq, False
                out.stop_events = {("late_after_close", seq), ("duplicate", seq)}
                return out
            continue
        violation: Event | None = None
        if seq < expected:
            violation = ("duplicate" if seq in seen else "reorder", seq)
        elif seq > expected:
            violation = ("gap", expected)
        if violation is not None and strict:
            out.stop_at, out.clean = seq, False
            if seq > expected:
                out.stop_events = {("gap", m) for m in range(expected, seq)}
                if expected == 0:
                    out.stop_events.add(("missing_snapshot", SESSION_LEVEL))
            else:
                out.stop_events = {("duplicate", seq), ("reorder", seq)}
            out.optional_events |= out.stop_events
            return out
        if seq < expected:
            out.events.add(violation)  # type: ignore[arg-type]
            continue
        out.gap(expected, seq)
        seen.add(seq)
        expected = seq + 1
        if kind == "end":
            out.closed_by = "end"
        else:
            out.applied[seq] += 1
    return out


def _replay_once(arrivals: Sequence[Arrival], end_seq: int | None, wait_for_missing: bool) -> Outcome:
    """``once``: each distinct seq once in any order; seqs missing when it closes are gaps and a failure.

    ``wait_for_missing`` is the reading where ``end`` closes the session only once every earlier seq has come
    (a late seq is then still applied); otherwise ``end`` closes it at once.
    """
    out, seen, highest = Outcome(), set[int](), -1
    for seq, kind, _ts in arrivals:
        if out.closed_by is not None:
            out.late(seq)
            continue
        if seq in seen:
            out.events.add(("duplicate", seq))
            continue
        if seq < highest:
            out.optional_events.add(("reorder", seq))
            out.optional_applied.add(seq)  # may be superseded per row by a higher seq: no change row then
        seen.add(seq)
        highest = max(highest, seq)
        if kind != "end":
            out.applied[seq] += 1
        complete = end_seq is not None and all(m in seen for m in range(end_seq))
        if end_seq in seen and (complete or not wait_for_missing):
            out.closed_by = "end"
    if out.closed_by is None:
        out.via_timeout = True
    upto = end_seq if end_seq is not None and end_seq in seen else highest + 1
    missing = [m for m in range(upto) if m not in seen]
    before = set(out.events)
    for m in missing:
        out.gap(m, m + 1)
    out.missing = bool(missing)
    out.degraded_from = None
    if missing and wait_for_missing:
        out.closed_by = None  # it waited for them until the timeout
    if out.closed_by is None:
        out.at_timeout = out.events - before
    return out


def _replay_window(arrivals: Sequence[Arrival], policy: Policy, flush_at_end: bool) -> Outcome:
    """``window``: hold out-of-order seqs, release in order; a hole that outlives the window is a gap.

    A hole expires when more than ``window_messages`` messages wait behind it, or when the newest event time
    is more than ``window_ms`` past the first message waiting. ``flush_at_end`` is the reading where a
    waiting ``end`` gives up every hole at once; otherwise they wait until the timeout flushes them.
    """
    out, buffer, seen = Outcome(), dict[int, tuple[str, int]](), set[int]()
    expected, newest, highest = 0, None, -1

    def release() -> None:
        nonlocal expected
        while expected in buffer and out.closed_by is None:
            kind, _ = buffer.pop(expected)
            seen.add(expected)
            if kind == "end":
                out.closed_by = "end"
            else:
                out.applied[expected] += 1
            expected += 1

    def expired(everything: bool) -> bool:
        if not buffer or out.closed_by is not None:
            return False
        first_ts = buffer[min(buffer)][1]
        by_count = policy.window_messages is not None and len(buffer) > policy.window_messages
        by_time = policy.window_ms is not None and newest is not None and newest - first_ts > policy.window_ms
        return everything or by_count or by_time

    def expire(everything: bool) -> None:
        nonlocal expected
        while expired(everything):
            first = min(buffer)
            out.gap(expected, first)
            expected = first
            release()

    for seq, kind, ts in arrivals:
        newest = ts if newest is None else max(newest, ts)
        if out.closed_by is not None:
            out.late(seq)
            continue
        if seq < expected:
            out.events.add(("duplicate" if seq in seen else "reorder", seq))
            continue
        if seq < highest:
            out.optional_events.add(
                ("reorder", seq)
            )  # came after a higher seq, within the window: may be said
        highest = max(highest, seq)
        if seq in buffer:
            out.events.add(("duplicate", seq))
            continue
        buffer[seq] = (kind, ts)
        release()
        expire(everything=flush_at_end and any(k == "end" for k, _ in buffer.values()))
    if buffer and out.closed_by is None:
        out.via_timeout = True  # the timeout flushes what still waits; a waiting end then closes it
        before, applied = set(out.events), Counter(out.applied)
        expire(everything=True)
        out.at_timeout = out.events - before
        if not policy.timeouts_expire:
            out.optional_applied |= set(out.applied - applied)
    for seq in buffer:
        out.late(seq)
    return out


def _replay_none(arrivals: Sequence[Arrival]) -> Outcome:
    """``none``: everything applied as it comes; violations only counted, so none is required."""
    out, seen, highest = Outcome(), set[int](), -1
    for seq, kind, _ts in arrivals:
        if out.closed_by is not None:
            out.late(seq)
            continue
        if seq in seen:
            out.optional_events.add(("duplicate", seq))
            out.clean = False
        elif seq < highest:
            out.optional_events.add(("reorder", seq))
            out.clean = False
        elif seq > highest + 1:
            out.optional_events.update(("gap", m) for m in range(highest + 1, seq))
            out.clean = False
        seen.add(seq)
        highest = max(highest, seq)
        if kind == "end":
            out.closed_by = "end"
        else:
            out.applied[seq] += 1
    return out


@dataclass(frozen=True)
class Policy:
    """The integrity policy of a run, as the verifier needs to know it.

    Parameters
    ----------
    name
        One of ``strict``, ``ordered``, ``once``, ``window``, ``none``.
    window_messages
        For ``window``: a hole expires when more than this many later messages wait behind it.
    window_ms
        For ``window`` with a time-based lateness: the outcome then depends on timing the ledger cannot
        replay, so the model accepts anything between no window and an unbounded one.
    timeouts_expire
        Whether the pipeline's session timeout passed before the run ended, so that sessions without
        ``end`` must be closed ``timed_out`` (otherwise their session record may be absent).
    session_timeout_ms, trigger_ms
        The pipeline's session timeout and micro-batch interval: a session closed by its timeout must have
        been quiet that long, within one trigger. None leaves that unchecked.
    """

    name: str
    window_messages: int | None = None
    window_ms: int | None = None
    timeouts_expire: bool = True
    session_timeout_ms: int | None = None
    trigger_ms: int | None = None

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise ValueError(f"policy name must be one of {tuple(MODELS)}, got {self.name!r}")
        if self.window_messages is not None and self.window_messages < 0:
            raise ValueError(f"window_messages must be >= 0, got {self.window_messages!r}")
        if self.window_ms is not None and self.window_ms < 0:
            raise ValueError(f"window_ms must be >= 0, got {self.window_ms!r}")
        for name in ("session_timeout_ms", "trigger_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.model  # noqa: B018 -- the model checks the settings its policy needs

    @property
    def model(self) -> PolicyModel:
        """The verifier's model of this policy (``loadtest.correctness.policies``)."""
        return MODELS[self.name](self)

    @property
    def applies_whole_snapshots(self) -> bool:
        """Whether an applied snapshot sets every row it carries (``once`` skips rows a later seq set first)."""
        return self.model.applies_whole_snapshots


class PolicyModel(ABC):
    """What one integrity policy makes of a session's delivered copies, as the verifier models it.

    Parameters
    ----------
    policy
        The run's policy settings (``loadtest.correctness.expect.Policy``): the window's bounds, whether timeouts expired.
    """

    name: ClassVar[str]
    """The policy's name, as ``--policy`` gives it."""
    applies_whole_snapshots: ClassVar[bool] = True
    """Whether an applied snapshot sets every row it carries (``once`` skips rows a later seq set first)."""
    requires_reports: ClassVar[bool] = True
    """Whether the violations a replay meets must be reported (``none`` only counts them)."""
    damaged_at_timeout: ClassVar[frozenset[str]] = frozenset()
    """Statuses besides ``timed_out`` a session that timed out with seqs missing may close with."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @abstractmethod
    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """One replay per reading of the policy the specification allows."""

    def exact(self, out: Outcome, table_seqs: frozenset[int]) -> bool:
        """Whether this replay leaves the true table: every table seq applied once, equivalent to seq order."""
        if out.stop_at is not None or out.missing or out.degraded_from is not None:
            return False
        return set(out.applied) == table_seqs and all(n == 1 for n in out.applied.values())

    def statuses_at_end(self, out: Outcome, exact: bool) -> set[str]:
        """The statuses a session closed by its ``end`` may have: degraded after a gap, else ok."""
        return {"degraded"} if out.degraded_from is not None else {"ok"}

    def statuses_at_timeout(self, out: Outcome) -> set[str]:
        """The statuses a session closed by its timeout may have."""
        damaged = out.degraded_from is not None or out.missing
        return {"timed_out"} | (self.damaged_at_timeout if damaged else set())


class Strict(PolicyModel):
    """``strict``: in seq order until the first violation, which must stop the query."""

    name = "strict"

    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """One reading: the replay stops at the first violation."""
        return [_replay_ordered(arrivals, strict=True)]


class Ordered(PolicyModel):
    """``ordered``: seqs above the next expected applied; stale and repeated seqs dropped and reported."""

    name = "ordered"
    damaged_at_timeout = frozenset({"degraded"})

    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """One reading: every violation recorded, none stops."""
        return [_replay_ordered(arrivals, strict=False)]


class Once(PolicyModel):
    """``once``: every distinct seq once, in any order; a seq missing when the session closes fails it."""

    name = "once"
    applies_whole_snapshots = False
    damaged_at_timeout = frozenset({"failed"})

    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """Two readings: ``end`` closes the session at once, or only once every earlier seq has come."""
        return [_replay_once(arrivals, end_seq, wait) for wait in (False, True)]

    def statuses_at_end(self, out: Outcome, exact: bool) -> set[str]:
        """Failed when a seq never came, else ok."""
        return {"failed"} if out.missing else {"ok"}


class Window(PolicyModel):
    """``window``: out-of-order seqs held and released in order; a hole that outlives the window is a gap."""

    name = "window"
    damaged_at_timeout = frozenset({"degraded"})

    def __init__(self, policy: Policy) -> None:
        if policy.window_messages is None and policy.window_ms is None:
            raise ValueError("policy 'window' needs window_messages or window_ms")
        super().__init__(policy)

    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """Two readings: a waiting ``end`` gives up every hole at once, or the holes wait for the timeout."""
        return [_replay_window(arrivals, self.policy, flush) for flush in (True, False)]


class NoIntegrity(PolicyModel):
    """``none``: everything applied as it comes; violations only counted, so none is required."""

    name = "none"
    requires_reports = False

    def readings(self, arrivals: Sequence[Arrival], end_seq: int | None) -> list[Outcome]:
        """One reading: everything applied."""
        return [_replay_none(arrivals)]

    def exact(self, out: Outcome, table_seqs: frozenset[int]) -> bool:
        """Exact only when nothing went wrong: duplicates and reorders are applied as they come."""
        return super().exact(out, table_seqs) and out.clean

    def statuses_at_end(self, out: Outcome, exact: bool) -> set[str]:
        """Ok when the session was clean; otherwise the pipeline may call it anything."""
        return {"ok"} if exact else {"ok", "degraded", "failed"}


MODELS: dict[str, type[PolicyModel]] = {cls.name: cls for cls in (Strict, Ordered, Once, Window, NoIntegrity)}
"""The model of each policy name."""
