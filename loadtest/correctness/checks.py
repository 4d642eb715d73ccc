"""The verifier's checks, each adding what it finds to one Tally: every session's record, change rows, seqs and violations against its expectation, then the whole run's dead letters, values, timeouts, delivery and stop, and the score of each fault kind."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from loadtest.correctness.expect import (
    Expectation,
    SessionExpectation,
)
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.policies import SESSION_LEVEL, Event
from loadtest.correctness.values import check_changes, sent_messages
from loadtest.reports.results import DamageWindow, Discrepancy, FaultScore
from sotw.wire import table_digest

# Violation kinds the pipeline reports, and the injected fault each one detects.
FAULT_OF_VIOLATION = {
    "gap": "gap",
    "duplicate": "duplicate",
    "reorder": "delayed",
    "timeout": "abandoned",
    "missing_snapshot": "gap",
    "digest_mismatch": "-",
    "late_after_close": "delayed",
}


@dataclass
class Tally:
    """What the checks found, accumulated before it becomes a ``Correctness``."""

    discrepancies: list[Discrepancy] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    damage: list[DamageWindow] = field(default_factory=list)
    faults: list[FaultScore] = field(default_factory=list)
    required: Counter[str] = field(default_factory=Counter)
    detected: Counter[str] = field(default_factory=Counter)
    hits: Counter[str] = field(default_factory=Counter)
    allowed_hits: Counter[str] = field(default_factory=Counter)

    def merge(self, other: Tally) -> None:
        """Add another tally's findings (one session's, under the reading chosen for it)."""
        self.discrepancies += other.discrepancies
        self.damage += other.damage
        self.faults += other.faults
        for mine, theirs in (
            (self.counts, other.counts),
            (self.statuses, other.statuses),
            (self.required, other.required),
            (self.detected, other.detected),
            (self.hits, other.hits),
            (self.allowed_hits, other.allowed_hits),
        ):
            mine.update(theirs)

    def add(self, kind: str, exp: SessionExpectation | None, detail: str, **where: Any) -> None:
        """Record one discrepancy; ``exp`` fills in session, sensor and topic unless ``where`` names them."""
        if exp is not None:
            where = {"session": exp.session, "sensor": exp.sensor, "topic": exp.topic, **where}
        where.setdefault("session", "")
        self.discrepancies.append(Discrepancy(kind=kind, detail=detail, **where))


def _by_session(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    if frame.empty or "session" not in frame.columns:
        return {}
    return {str(k): g for k, g in frame.groupby("session", sort=False)}


def _opt_int(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


@dataclass(frozen=True)
class _Observed:
    """What the pipeline wrote for one session."""

    records: pd.DataFrame
    changes: pd.DataFrame
    events: frozenset[Event]


def check_sessions(exp: Expectation, output: PipelineOutput, tally: Tally) -> None:
    """Each session's record, change rows and violations against the reading of the policy they fit best."""
    records, changes = _by_session(output.sessions), _by_session(output.changes)
    events = _observed_events(output.integrity)
    tally.counts["rows_written"] = len(output.changes)
    for name in sorted(set(records) | set(changes) | set(events)):
        if name not in exp.sessions:
            _unknown_session(name, records, changes, events, tally)
    for name, readings in exp.sessions.items():
        seen = _Observed(
            records.get(name, pd.DataFrame()),
            changes.get(name, pd.DataFrame(columns=["seq", "row_id"])),
            frozenset(events.get(name, set())),
        )
        candidates = []
        for want in readings:
            local = Tally()
            _check_session(want, seen, local)
            candidates.append(local)
        tally.merge(min(candidates, key=lambda t: len(t.discrepancies)))


def _unknown_session(
    name: str,
    records: dict[str, pd.DataFrame],
    changes: dict[str, pd.DataFrame],
    events: dict[str, set[Event]],
    tally: Tally,
) -> None:
    if name in records:
        tally.add(
            "unknown_session", None, "a session record for a session the ledger never had", session=name
        )
    if name in changes:
        tally.counts["rows_unexpected"] += len(changes[name])
        tally.add("unexpected_row", None, "change rows for a session the ledger never had", session=name)
    for kind, _ in events.get(name, set()):
        tally.detected[kind] += 1
    if name in events:
        tally.add("false_violation", None, "violations for a session the ledger never had", session=name)


def _check_session(want: SessionExpectation, seen: _Observed, tally: Tally) -> None:
    got = seen.records
    if got.empty:
        if want.must_be_present:
            tally.counts["exact_required"] += int(want.exact)
            tally.add(
                "missing_session",
                want,
                f"no session record; expected {sorted(want.statuses)}",
                seq=max(want.applied_max, default=None),
            )
    else:
        if len(got) > 1:
            tally.add("repeated_session", want, f"{len(got)} session records")
        _check_record(want, {str(k): v for k, v in got.iloc[0].to_dict().items()}, tally)
    # A session a strict stop cut short, and the output has not closed, holds only a prefix of its changes:
    # only the changes of every other session must replay to the true table.
    _check_changes(want, seen.changes, tally, whole=not (want.cut_short and got.empty))
    _check_events(want, seen.events, tally)


def _check_record(want: SessionExpectation, rec: dict[str, Any], tally: Tally) -> None:
    """Status, closing, table digest and degraded-from seq of one session record."""
    status = str(rec.get("status"))
    tally.statuses[status] += 1
    if status not in want.statuses:
        expected = sorted(want.statuses - {"absent"})
        tally.add("wrong_status", want, f"status {status!r}, expected one of {expected}")
    closed_by = rec.get("closed_by")
    if closed_by is not None and str(closed_by) not in want.closed_by:
        tally.add("wrong_closed_by", want, f"closed by {closed_by!r}, expected {sorted(want.closed_by)}")
    if want.exact:
        tally.counts["exact_required"] += 1
        if rec.get("digest") == want.truth_digest:
            tally.counts["exact"] += 1
        else:
            tally.add("table_mismatch", want, f"digest {rec.get('digest')} != truth {want.truth_digest}")
    observed_from = _opt_int(rec.get("degraded_from_seq"))
    if want.degraded_from:
        first = min(want.degraded_from)
        affected = sum(1 for s in want.update_seqs if s >= first)
        tally.damage.append(DamageWindow(want.session, want.sensor, first, observed_from, affected))
        if status == "degraded" and observed_from not in want.degraded_from:
            expected_from = sorted(want.degraded_from)
            tally.add(
                "wrong_degraded_from", want, f"degraded from seq {observed_from}, expected {expected_from}"
            )


def _check_changes(want: SessionExpectation, rows: pd.DataFrame, tally: Tally, *, whole: bool = True) -> None:
    """Every applied message has its change rows exactly as often as the policy allows; none extra.

    The counting is vectorized per session; only seqs that break a bound are looked at one by one.
    """
    mult = rows.groupby(["seq", "row_id"]).size() if not rows.empty else pd.Series(dtype="int64")
    seqs = mult.index.get_level_values(0) if len(mult) else pd.Index([], dtype="int64")
    per_seq = (
        mult.groupby(seqs).agg(["min", "max", "size"])
        if len(mult)
        else pd.DataFrame(columns=["min", "max", "size"])
    )
    bounds = pd.DataFrame(
        {"lo": pd.Series(want.applied_min, dtype="int64"), "hi": pd.Series(want.applied_max, dtype="int64")}
    )
    joined = per_seq.join(bounds, how="outer").astype("float64").fillna(0.0)
    tally.counts["rows_expected"] += int((joined["lo"] * joined["size"].clip(lower=1)).sum())
    bad = joined[(joined["min"] < joined["lo"]) | (joined["max"] > joined["hi"])]
    for seq in bad.index:
        counts = [int(n) for n in mult.xs(int(seq), level=0).tolist()] if int(seq) in per_seq.index else []
        _check_seq(want, int(seq), counts, tally)
    if want.exact and whole and not rows.empty and _replayed_digest(rows) != want.truth_digest:
        tally.add(
            "changes_table_mismatch",
            want,
            "replaying the change rows in seq order does not give the true table",
        )


def _check_seq(want: SessionExpectation, seq: int, mult: list[int], tally: Tally) -> None:
    lo, hi = want.applied_min.get(seq, 0), want.applied_max.get(seq, 0)
    if not mult:
        if lo:
            tally.counts["rows_lost"] += lo
            tally.add("lost_row", want, f"no change row for seq {seq} (expected {lo}x)", seq=seq)
        return
    short = sum(max(0, lo - n) for n in mult)
    extra = sum(max(0, n - hi) for n in mult)
    if short:
        tally.counts["rows_lost"] += short
        tally.add("lost_row", want, f"seq {seq}: {short} change rows missing", seq=seq)
    if extra and hi == 0:
        tally.counts["rows_unexpected"] += extra
        why = "the policy" if want.stop_at is None else f"strict (the query must stop at seq {want.stop_at})"
        tally.add("unexpected_row", want, f"seq {seq} must not be applied under {why}", seq=seq)
    elif extra:
        tally.counts["rows_repeated"] += extra
        tally.add("repeated_row", want, f"seq {seq}: {extra} change rows written more than {hi}x", seq=seq)


def _replayed_digest(rows: pd.DataFrame) -> str:
    """The table the change rows describe: from the last snapshot on, each row's change with the highest seq."""
    snapshots = rows.loc[rows["op"] == "snapshot", "seq"]
    since = rows[rows["seq"] >= snapshots.max()] if len(snapshots) else rows
    last = since.sort_values("seq", kind="stable").drop_duplicates("row_id", keep="last")
    live = last[(last["op"] != "delete") & last["values"].notna()]
    return table_digest(json.loads(v) for v in live["values"])


def _observed_events(integrity: pd.DataFrame) -> dict[str, set[Event]]:
    """The pipeline's integrity events as ``(violation, seq)`` per session; a gap names every missing seq."""
    events: dict[str, set[Event]] = defaultdict(set)
    if integrity.empty:
        return events
    for rec in integrity.to_dict("records"):
        kind, session = str(rec.get("violation")), str(rec.get("session"))
        if kind == "malformed":
            continue  # matched through dead letters, by offset
        if kind == "gap":
            lo, hi = _opt_int(rec.get("missing_from")), _opt_int(rec.get("missing_to"))
            if lo is None or hi is None:
                lo, hi = _opt_int(rec.get("expected_seq")) or 0, (_opt_int(rec.get("got_seq")) or 0) - 1
            events[session].update(("gap", m) for m in range(lo, hi + 1))
        elif kind in ("duplicate", "reorder", "late_after_close"):
            got = _opt_int(rec.get("got_seq"))
            events[session].add((kind, got if got is not None else SESSION_LEVEL))
        else:
            events[session].add((kind, SESSION_LEVEL))
    return events


def _check_events(want: SessionExpectation, got: frozenset[Event], tally: Tally) -> None:
    """Required violations reported (recall) and reported violations allowed (precision)."""
    need, allow = want.events_required, want.events_allowed
    tally.required.update(k for k, _ in need)
    tally.detected.update(k for k, _ in got)
    tally.hits.update(k for k, _ in got & need)
    tally.allowed_hits.update(k for k, _ in got & allow)
    for kind, seqs in _group(need - got).items():
        first = seqs[0] if seqs[0] != SESSION_LEVEL else None
        tally.add("missed_violation", want, f"{kind} not reported for seq {_seqs(seqs)}", seq=first)
    for kind, seqs in _group(got - allow).items():
        first = seqs[0] if seqs[0] != SESSION_LEVEL else None
        tally.add(
            "false_violation", want, f"{kind} reported for seq {_seqs(seqs)} but none happened", seq=first
        )


def score_faults(exp: Expectation, tally: Tally) -> None:
    """Precision and recall per violation kind, named with the injected fault it detects."""
    for kind in sorted(set(tally.required) | set(tally.detected)):
        fault = FAULT_OF_VIOLATION.get(kind, "-")
        tally.faults.append(
            FaultScore(
                kind=kind,
                fault=fault,
                injected=exp.injected.get(fault, 0),
                expected=tally.required[kind],
                detected=tally.detected[kind],
                true_positives=tally.hits[kind],
                precision=ratio(tally.allowed_hits[kind], tally.detected[kind]),
                recall=ratio(tally.hits[kind], tally.required[kind]),
            )
        )


def _group(events: Iterable[Event]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for kind, seq in sorted(events):
        grouped[kind].append(seq)
    return grouped


def _seqs(seqs: list[int]) -> str:
    shown = ", ".join("-" if s == SESSION_LEVEL else str(s) for s in seqs[:8])
    return shown + (f" and {len(seqs) - 8} more" if len(seqs) > 8 else "")


def ratio(num: int, den: int) -> float:
    """``num / den``, or NaN when there is nothing to divide by."""
    return num / den if den else math.nan


def check_dead_letters(exp: Expectation, dead: pd.DataFrame, tally: Tally) -> None:
    """Every malformed copy the broker took, and kept, is quarantined; no valid message is.

    A malformed copy the broker gave away (``Expectation.overwritten``) is not required: the pipeline may
    never have read it, and ``check_broker_kept`` counts it as the broker's loss.
    """

    def key(r: Mapping[Any, Any]) -> tuple[str, int, int]:
        return (str(r["topic"]), int(r["partition"]), int(r["offset"]))

    malformed = exp.malformed
    given_away = (
        malformed.index.isin(exp.overwritten.index) if len(exp.overwritten) else [False] * len(malformed)
    )
    every = {key(r): r for r in malformed.to_dict("records")}
    got: set[tuple[str, int, int]] = set()
    if not dead.empty:
        got = {
            (str(t), int(p), int(o))
            for t, p, o in zip(dead["topic"], dead["partition"], dead["offset"], strict=True)
        }
    # Required: what the broker kept, and what it gave away only if the pipeline got to read it first.
    kept = malformed[[not g for g in given_away]]
    wanted = {key(r): r for r in kept.to_dict("records")} | {k: r for k, r in every.items() if k in got}
    hits = got & set(wanted)
    tally.counts["malformed_quarantined"] = len(hits)
    for k in sorted(set(wanted) - got):
        r = wanted[k]
        want = exp.sessions.get(str(r["session"]), (None,))[0]
        tally.add(
            "malformed_not_quarantined",
            want,
            f"malformed copy of seq {r['seq']} not in dead letters",
            session=str(r["session"]),
            seq=None,
            partition=k[1],
            offset=k[2],
        )
    for k in sorted(got - set(every)):
        tally.add(
            "false_dead_letter",
            None,
            "a dead letter the ledger does not call malformed",
            topic=k[0],
            partition=k[1],
            offset=k[2],
        )
    if wanted or got:
        tally.faults.append(
            FaultScore(
                "malformed",
                "malformed",
                exp.injected.get("malformed", 0),
                len(wanted),
                len(got),
                len(hits),
                ratio(len(hits), len(got)),
                ratio(len(hits), len(wanted)),
            )
        )


def check_values(exp: Expectation, changes: pd.DataFrame, tally: Tally) -> None:
    """Every change row holds what the message it came from carried, in every session (``loadtest.correctness.values``).

    This does not depend on the policy's reading of a session: whatever a policy applies, it applies the
    message's own values.
    """
    findings, checked = check_changes(
        changes, sent_messages(exp.ledger), exp.snapshots, exp.policy.applies_whole_snapshots
    )
    tally.counts["rows_values_checked"] = checked
    for f in findings:
        want = exp.sessions.get(f.session, (None,))[0]
        tally.counts["rows_wrong" if f.kind == "wrong_value" else "rows_lost"] += 1
        tally.add(f.kind, want, f.detail, session=f.session, seq=f.seq)


def check_timeouts(exp: Expectation, output: PipelineOutput, tally: Tally) -> None:
    """A session closed by its timeout was quiet for the session timeout before it closed, within one trigger.

    Quiet since the later of two moments no message of the session can have come before: the last batch
    before the closing one that wrote a record of it, and the acknowledgement of its last copy the broker
    took. Both come no later than the pipeline's last sight of the session, so a correct pipeline always
    passes; one that closes a session a trigger after its last batch does not.
    """
    policy, sessions = exp.policy, output.sessions
    if policy.session_timeout_ms is None or sessions.empty or "closed_by" not in sessions.columns:
        return
    timed = sessions[(sessions["closed_by"] == "timeout") & sessions["processed_ms"].notna()]
    if timed.empty:
        return
    closed = timed.groupby(timed["session"].astype(str))["processed_ms"].min()
    last_batch = _last_batch_before(output, closed)
    ledger = exp.ledger
    acked_rows = ledger[ledger["acked_ts"].notna()]
    acked = acked_rows.groupby(acked_rows["session"].astype(str))["acked_ts"].max()
    trigger_ms = policy.trigger_ms or 0
    for session, when in closed.items():
        since = max(float(last_batch.get(session, -math.inf)), float(acked.get(session, -math.inf)))
        if math.isinf(since) or when - since >= policy.session_timeout_ms - trigger_ms:
            continue
        tally.add(
            "early_timeout",
            exp.sessions.get(str(session), (None,))[0],
            f"closed by its timeout {(when - since) / 1000:.1f} s after its last message; the session timeout "
            f"is {policy.session_timeout_ms / 1000:g} s (one trigger, {trigger_ms / 1000:g} s, allowed)",
            session=str(session),
        )


def _last_batch_before(output: PipelineOutput, closed: pd.Series) -> pd.Series:
    """Per session, the last ``processed_ms`` before it closed of its change and integrity rows."""
    frames = [output.changes]
    if not output.integrity.empty and "violation" in output.integrity.columns:
        frames.append(output.integrity[output.integrity["violation"] != "timeout"])
    parts = [
        pd.DataFrame({"session": f["session"].astype(str), "processed_ms": f["processed_ms"]})
        for f in frames
        if not f.empty and "processed_ms" in f.columns
    ]
    if not parts:
        return pd.Series(dtype="float64")
    activity = pd.concat(parts, ignore_index=True).join(closed.rename("closed"), on="session")
    before = activity[activity["processed_ms"] < activity["closed"]]
    return before.groupby("session")["processed_ms"].max()


def check_delivery(exp: Expectation, tally: Tally) -> None:
    """Messages the producer meant to send that never reached the broker (not injected faults)."""
    for r in exp.undelivered.to_dict("records"):
        want = exp.sessions.get(str(r["session"]), (None,))[0]
        tally.add(
            "not_delivered",
            want,
            f"seq {r['seq']} was not acknowledged: {r.get('error') or 'no report'}",
            session=str(r["session"]),
            seq=int(r["seq"]),
        )


def check_broker_kept(exp: Expectation, tally: Tally) -> None:
    """Acknowledged messages the broker gave away (``Expectation.overwritten``), read by the pipeline or not.

    A message already counted as lost from the output is not counted twice.
    """
    counted = {(d.session, d.seq) for d in tally.discrepancies}
    for r in exp.overwritten.to_dict("records"):
        session, seq = str(r["session"]), int(r["seq"])
        if (session, seq) in counted:
            continue
        counted.add((session, seq))
        where = f"{r['topic']}[{int(r['partition'])}]@{int(r['offset'])}"
        tally.add(
            "broker_lost",
            exp.sessions.get(session, (None,))[0],
            (
                f"seq {seq} was acknowledged at {where}; the partition now ends at {int(r['restart'])}"
                if r.get("seen") == "end"
                else f"seq {seq} was acknowledged at {where}; the partition's offsets later started again at "
                f"{int(r['restart'])}"
            )
            + ": the broker no longer has it",
            session=session,
            seq=seq,
            topic=str(r["topic"]),
            partition=int(r["partition"]),
            offset=int(r["offset"]),
        )


def check_stop(exp: Expectation, pipeline_stopped: bool | None, tally: Tally) -> None:
    """Under ``strict`` a violation must stop the query."""
    if not exp.must_stop or pipeline_stopped is not False:
        return
    first = next(e for readings in exp.sessions.values() for e in readings if e.stop_at is not None)
    tally.add(
        "did_not_stop",
        first,
        f"strict must stop the query at seq {first.stop_at} but it kept running",
        seq=first.stop_at,
    )
