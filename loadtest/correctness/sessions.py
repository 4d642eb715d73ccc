"""The verifier's checks of each session: its record, its change rows and its violations, against the reading of the policy it fits best.

``check_sessions`` holds each session's output to every reading of the policy the expectation allows
(``loadtest.correctness.expect``) and keeps the closest; ``observed_events`` turns the integrity output into
the events it names, bounded by the seqs the ledger has.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pandas as pd

from loadtest.correctness.expect import Expectation, SessionExpectation
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.policies import SESSION_LEVEL, Event, Policy
from loadtest.correctness.tally import Tally, opt_int
from loadtest.reports.results import DamageWindow
from pipeline.records import VIOLATIONS
from sotw.wire import table_digest


def _by_session(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    if frame.empty or "session" not in frame.columns:
        return {}
    return {str(k): g for k, g in frame.groupby("session", sort=False)}


@dataclass(frozen=True)
class _Observed:
    """What the pipeline wrote for one session."""

    records: pd.DataFrame
    changes: pd.DataFrame
    events: frozenset[Event]


def check_sessions(
    exp: Expectation,
    output: PipelineOutput,
    tally: Tally,
    events: Mapping[str, set[Event]],
    invalid: Iterable[tuple[str, str]] = (),
) -> None:
    """Each session's record, change rows and violations against the reading of the policy they fit best.

    ``events`` and ``invalid`` are the output's integrity records (``observed_events``). A session counts as
    judged (``sessions_judged``) when the output was held to something for it: it had to be there, or it
    wrote something, which was checked; a session allowed to be absent that is absent was not judged.
    """
    records, changes = _by_session(output.sessions), _by_session(output.changes)
    tally.counts["rows_written"] = len(output.changes)
    for session, detail in invalid:
        want = exp.sessions.get(session, (None,))[0]
        tally.add("false_violation", want, detail, session=session)
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
            _check_session(want, seen, local, exp.policy)
            candidates.append(local)
        best = min(range(len(readings)), key=lambda i: len(candidates[i].discrepancies))
        tally.merge(candidates[best])
        wrote = not (seen.records.empty and seen.changes.empty and not seen.events)
        tally.counts["sessions_judged"] += int(readings[best].must_be_present or wrote)


def _unknown_session(
    name: str,
    records: dict[str, pd.DataFrame],
    changes: dict[str, pd.DataFrame],
    events: Mapping[str, set[Event]],
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


def _check_session(want: SessionExpectation, seen: _Observed, tally: Tally, policy: Policy) -> None:
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
        record = {str(k): v for k, v in got.iloc[0].to_dict().items()}
        _check_record(want, record, tally)
        if not want.exact:  # an exact session's digest and change rows are each checked against the truth
            _check_record_table(want, record, seen.changes, policy, tally)
        want = _with_digest_report(want, record, policy)
    # The session whose violation the output names as the stop applied everything before it.
    named = bool(seen.events & want.stop_events)
    want = _prefix_of_stop(want, seen.changes, closed=not got.empty or named)
    # A session a strict stop cut short, and the output has not closed, holds only a prefix of its changes:
    # only the changes of every other session must replay to the true table.
    _check_changes(want, seen.changes, tally, whole=not (want.cut_short and got.empty))
    _check_events(want, seen.events, tally)


def _prefix_of_stop(want: SessionExpectation, rows: pd.DataFrame, *, closed: bool) -> SessionExpectation:
    """Under a strict stop, what a session must still hold: every change below the highest seq it wrote.

    The stop may cut a session anywhere, but the job applies in seq order and commits whole batches, so
    what it wrote is a prefix: a seq missing below one written is lost (a row dropped, a batch's commit gone).
    A session that closed before the stop holds all of it.
    """
    if want.before_stop is None:
        return want
    top = int(rows["seq"].max()) if not rows.empty and "seq" in rows else -1
    needed = {s: n for s, n in want.before_stop.items() if closed or s < top}
    return replace(
        want,
        applied_min={s: max(want.applied_min.get(s, 0), n) for s, n in needed.items()}
        | {s: n for s, n in want.applied_min.items() if s not in needed},
    )


def _with_digest_report(want: SessionExpectation, rec: dict[str, Any], policy: Policy) -> SessionExpectation:
    """A session closed by its ``end`` with another table than the end says must report ``digest_mismatch``.

    Whether the tables differ is read from the record itself (its digest and row count, held to its change
    rows or the truth, against its ``expected_*``, held to what the end carried): reported exactly then.
    ``none`` reports nothing, and under ``strict`` the mismatch is a stop.
    """
    said_digest, said_rows = rec.get("expected_digest"), opt_int(rec.get("expected_rows"))
    if rec.get("closed_by") != "end" or not policy.model.requires_reports or policy.name == "strict":
        return want
    if not isinstance(said_digest, str) or said_rows is None:
        return want
    event = ("digest_mismatch", SESSION_LEVEL)
    if rec.get("digest") != said_digest or opt_int(rec.get("row_count")) != said_rows:
        return replace(
            want, events_required=want.events_required | {event}, events_allowed=want.events_allowed | {event}
        )
    return replace(want, events_allowed=want.events_allowed - {event})


def _check_record(want: SessionExpectation, rec: dict[str, Any], tally: Tally) -> None:
    """Status, closing, table digest, what ``end`` said and the degraded-from seq of one session record."""
    status = str(rec.get("status"))
    tally.statuses[status] += 1
    if status not in want.statuses:
        expected = sorted(want.statuses - {"absent"})
        tally.add("wrong_status", want, f"status {status!r}, expected one of {expected}")
    closed_by = rec.get("closed_by")
    if not isinstance(closed_by, str) or closed_by not in want.closed_by:
        tally.add("wrong_closed_by", want, f"closed by {closed_by!r}, expected {sorted(want.closed_by)}")
    if want.exact:
        tally.counts["exact_required"] += 1
        rows = opt_int(rec.get("row_count"))
        if rec.get("digest") == want.truth_digest and (want.truth_rows is None or rows == want.truth_rows):
            tally.counts["exact"] += 1
        else:
            tally.add(
                "table_mismatch",
                want,
                f"digest {rec.get('digest')}, {rows} rows != truth {want.truth_digest}, {want.truth_rows} rows",
            )
    said_digest, said_rows = rec.get("expected_digest"), opt_int(rec.get("expected_rows"))
    if closed_by == "end" and (not isinstance(said_digest, str) or said_rows is None):
        tally.add(
            "wrong_end",
            want,
            "closed by its end, but expected_rows/expected_digest do not say what it carried",
        )
    if isinstance(said_digest, str) and want.truth_digest is not None and said_digest != want.truth_digest:
        tally.add(
            "wrong_end",
            want,
            f"expected_digest {said_digest}, but the end message carried {want.truth_digest}",
        )
    if said_rows is not None and want.truth_rows is not None and said_rows != want.truth_rows:
        tally.add(
            "wrong_end", want, f"expected_rows {said_rows}, but the end message carried {want.truth_rows}"
        )
    observed_from = opt_int(rec.get("degraded_from_seq"))
    if want.degraded_from:
        first = min(want.degraded_from)
        affected = sum(1 for s in want.update_seqs if s >= first)
        tally.damage.append(DamageWindow(want.session, want.sensor, first, observed_from, affected))
        if (
            observed_from is not None
            and observed_from not in want.degraded_from
            or (status == "degraded" and observed_from is None)
        ):
            expected_from = sorted(want.degraded_from)
            tally.add(
                "wrong_degraded_from", want, f"degraded from seq {observed_from}, expected {expected_from}"
            )


def _check_record_table(
    want: SessionExpectation, rec: dict[str, Any], rows: pd.DataFrame, policy: Policy, tally: Tally
) -> None:
    """The table a session record says it closed with (digest, row count) is the one its change rows build.

    A closed session's change rows are all written, so this holds for every session, the ones that lost
    messages included: a degraded session's digest is not the truth's, but it is its own change rows'.
    ``none`` applies messages as they arrive (a late or repeated one wins), the other policies by seq.
    """
    digest, count = replayed_table(rows, arrival_order=not policy.model.requires_reports)
    said_digest, said_rows = rec.get("digest"), opt_int(rec.get("row_count"))
    if said_digest != digest:
        tally.add("wrong_digest", want, f"digest {said_digest}, but the session's change rows build {digest}")
    if said_rows != count:
        tally.add(
            "wrong_row_count",
            want,
            f"row_count {said_rows}, but the session's change rows build {count} rows",
        )


def _check_changes(want: SessionExpectation, rows: pd.DataFrame, tally: Tally, *, whole: bool = True) -> None:
    """Every applied message has its change rows exactly as often as the policy allows; none extra.

    The counting is vectorized per session; only seqs that break a bound are looked at one by one.
    """
    # A delete at the snapshot's seq removes a row the snapshot lacks: no row the snapshot carried, so not
    # counted with them (the values check holds it to the snapshot; ``none`` writes one each time a copy of
    # the snapshot is applied again after updates).
    counted = rows[~((rows["op"] == "delete") & (rows["seq"] == 0))] if "op" in rows else rows
    mult = counted.groupby(["seq", "row_id"]).size() if not counted.empty else pd.Series(dtype="int64")
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
        why = (
            "the policy"
            if want.stop_at is None
            else f"strict (the session's first violation, seq {want.stop_at}, stops it)"
        )
        tally.add("unexpected_row", want, f"seq {seq} must not be applied under {why}", seq=seq)
    elif extra:
        tally.counts["rows_repeated"] += extra
        tally.add("repeated_row", want, f"seq {seq}: {extra} change rows written more than {hi}x", seq=seq)


def replayed_table(rows: pd.DataFrame, arrival_order: bool = False) -> tuple[str, int]:
    """The digest and row count of the table a session's change rows build.

    Each row ends as its last change: in seq order (a snapshot at seq 0 then each update), or, with
    ``arrival_order``, in the order the pipeline applied them (its batches, then Kafka's offsets), where a
    late or repeated message is applied again.
    """
    if rows.empty or "op" not in rows.columns:
        return table_digest([]), 0
    order = (
        ["batch_id", "offset"]
        if arrival_order and "batch_id" in rows
        else ["offset"]
        if arrival_order
        else ["seq"]
    )
    last = rows.sort_values(order, kind="stable").drop_duplicates("row_id", keep="last")
    live = last[(last["op"] != "delete") & last["values"].notna()]
    return table_digest(orjson.loads(v) for v in live["values"]), len(live)


def _replayed_digest(rows: pd.DataFrame) -> str:
    """The table the change rows describe, replayed in seq order (``replayed_table``)."""
    return replayed_table(rows)[0]


def observed_events(
    integrity: pd.DataFrame, tops: Mapping[str, int]
) -> tuple[dict[str, set[Event]], list[tuple[str, str]]]:
    """The pipeline's integrity events as ``(violation, seq)`` per session, and the records no run can have.

    A gap names every missing seq, from ``missing_from`` to ``missing_to``, taken only as far as seqs the
    session has (``tops``: its highest seq in the ledger): a range beyond them, reversed, or a violation the
    contract does not name is no event of the session but a record that cannot be right, returned with why.
    ``malformed`` records are matched through dead letters (``check_dead_letters``).
    """
    events: dict[str, set[Event]] = defaultdict(set)
    invalid: list[tuple[str, str]] = []
    if integrity.empty:
        return events, invalid
    for rec in integrity.to_dict("records"):
        kind, session = str(rec.get("violation")), str(rec.get("session"))
        if kind == "malformed":
            continue
        if kind not in VIOLATIONS:
            invalid.append((session, f"violation {kind!r} is not one the output contract names"))
        elif kind == "gap":
            lo, hi = opt_int(rec.get("missing_from")), opt_int(rec.get("missing_to"))
            if lo is None or hi is None:
                lo, hi = opt_int(rec.get("expected_seq")) or 0, (opt_int(rec.get("got_seq")) or 0) - 1
            top = tops.get(session, -1)
            if lo < 0 or hi < lo or hi > top:
                invalid.append(
                    (session, f"gap reported for seqs {lo}..{hi}; the session's seqs are 0..{top}")
                )
            else:
                events[session].update(("gap", m) for m in range(lo, hi + 1))
        elif kind in ("duplicate", "reorder", "late_after_close"):
            got = opt_int(rec.get("got_seq"))
            events[session].add((kind, got if got is not None else SESSION_LEVEL))
        else:
            events[session].add((kind, SESSION_LEVEL))
    return events, invalid


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


def _group(events: Iterable[Event]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for kind, seq in sorted(events):
        grouped[kind].append(seq)
    return grouped


def _seqs(seqs: list[int]) -> str:
    shown = ", ".join("-" if s == SESSION_LEVEL else str(s) for s in seqs[:8])
    return shown + (f" and {len(seqs) - 8} more" if len(seqs) > 8 else "")
