"""The verifier's run-wide checks, each adding what it finds to one ``Tally``.

Where each row is filed, every change row's values, the timeouts, the dead letters, delivery and what the
broker kept, and the score of each fault kind; each session's own record, changes and violations are
``loadtest.correctness.sessions``'.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from loadtest.correctness.delivery import acknowledged, unknown
from loadtest.correctness.expect import (
    Expectation,
)
from loadtest.correctness.output import PipelineOutput
from loadtest.correctness.stops import FoundStop
from loadtest.correctness.tally import FAULT_OF_VIOLATION, Tally, opt_int, ratio
from loadtest.correctness.values import check_changes, records, sent_messages
from loadtest.reports.results import FaultScore
from pipeline.sinks import HIVE_NULL
from simulator.config import FAULT_KINDS


def check_placement(exp: Expectation, output: PipelineOutput, tally: Tally) -> None:
    """Every change, session and integrity row names a session, and the sensor and topic that session is on.

    A row without a session belongs to no table (a ``malformed`` record of a message without a key excepted:
    it has none to name). A row under another sensor than its session's is misfiled: a reader of that
    sensor's partition of the output finds it, the session's own reader does not. Both are discrepancies of
    their own; a misfiled row still counts for its session in every other check.
    """
    where = {name: (readings[0].sensor, readings[0].topic) for name, readings in exp.sessions.items()}
    for dataset, frame in (
        ("changes", output.changes),
        ("sessions", output.sessions),
        ("integrity", output.integrity),
    ):
        if frame.empty or "session" not in frame.columns:
            continue
        nameless = frame["session"].isna() | (frame["session"].astype(str) == "")
        if dataset == "integrity" and "violation" in frame.columns:
            nameless &= frame["violation"] != "malformed"
        if nameless.any():
            if dataset == "changes":
                tally.counts["rows_unexpected"] += int(nameless.sum())
            kind = {
                "changes": "unexpected_row",
                "sessions": "unknown_session",
                "integrity": "false_violation",
            }
            tally.add(kind[dataset], None, f"{int(nameless.sum())} {dataset} rows name no session")
        named = frame[~nameless & frame["session"].astype(str).isin(where)]
        if dataset == "integrity" and "violation" in named.columns and "sensor" in named.columns:
            # A malformed message's sensor is what could be read of it, often nothing: filed under none.
            unread = named["sensor"].isna() | (named["sensor"].astype(str) == HIVE_NULL)
            named = named[~((named["violation"] == "malformed") & unread)]
        for column, place in (("sensor", 0), ("topic", 1)):
            if column not in named.columns or named.empty:
                continue
            owner = named["session"].astype(str).map({name: both[place] for name, both in where.items()})
            wrong = named[named[column].astype("string").fillna("") != owner]
            for session, rows in wrong.groupby(wrong["session"].astype(str)):
                want = exp.sessions[str(session)][0]
                found = ", ".join(sorted({str(v) for v in rows[column]}))
                tally.add(
                    f"wrong_{column}",
                    want,
                    f"{len(rows)} {dataset} rows under {column} {found}; the session is on {owner[rows.index[0]]}",
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


def check_dead_letters(
    exp: Expectation, output: PipelineOutput, tally: Tally, stops: Sequence[FoundStop] = ()
) -> None:
    """Every malformed copy the broker took, and kept, is quarantined with its bytes; no valid message is.

    A dead letter is matched to a malformed copy at its position, or, for a copy the ledger has no offset of
    (acknowledged without one, or of unknown outcome), by its bytes (the SHA-256 the ledger keeps) in its
    partition. A copy of unknown outcome may have its dead letter or not. A malformed copy the broker gave
    away (``Expectation.overwritten``) is not required: the pipeline may never have read it, and
    ``check_broker_kept`` counts it as the broker's loss. A dead letter holds its copy's bytes (a dead letter
    without a ``value`` holds none), and quarantines it once. After a strict stop only the copies the job read
    before it are required (``_was_read``).
    """
    ledger, dead = exp.ledger, output.dead_letters
    copies = ledger[(ledger["fault"] == "malformed") & (acknowledged(ledger) | unknown(ledger))]
    at: dict[tuple[str, int, int], Any] = {}
    unplaced: dict[tuple[str, int, str], list[Any]] = defaultdict(list)
    for label, r in zip(copies.index, records(copies), strict=True):
        if opt_int(r["offset"]) is not None:
            at[(str(r["topic"]), int(r["partition"]), int(r["offset"]))] = label
        elif isinstance(r["value_sha256"], str):
            unplaced[(str(r["topic"]), int(r["partition"]), r["value_sha256"])].append(label)
    matched: dict[Any, tuple[str, int, int]] = {}
    for r in records(dead) if not dead.empty else []:
        where = (str(r["topic"]), int(r["partition"]), int(r["offset"]))
        value = r.get("value")
        digest = hashlib.sha256(bytes(value)).hexdigest() if isinstance(value, bytes | bytearray) else None
        label = at.get(where)
        if label is None and digest is not None:
            waiting = unplaced.get((where[0], where[1], digest))
            label = waiting.pop(0) if waiting else None
        if label is None:
            tally.add(
                "false_dead_letter", None, "a dead letter the ledger does not call malformed", **_at(where)
            )
            continue
        if label in matched:
            tally.add("false_dead_letter", None, "a malformed copy quarantined again", **_at(where))
            continue
        matched[label] = where
        sent = ledger.at[label, "value_sha256"]
        if isinstance(sent, str) and digest != sent:
            tally.add(
                "wrong_dead_letter",
                exp.sessions.get(str(ledger.at[label, "session"]), (None,))[0],
                f"the dead letter of the malformed copy of seq {ledger.at[label, 'seq']} does not hold its bytes",
                session=str(ledger.at[label, "session"]),
                **_at(where),
            )
    given_away = set(exp.overwritten.index) if len(exp.overwritten) else set()
    read_to = _read_to(output) if exp.cut_by_stop else None
    stopped_at = {f.session: f.offset for f in stops if f.offset is not None}
    required = [
        label
        for label in copies.index[acknowledged(copies)]
        if (label not in given_away or label in matched)
        and _was_read(ledger.loc[label], read_to, label in matched, stopped_at)
    ]
    tally.counts["malformed_quarantined"] = sum(1 for label in required if label in matched)
    for label in required:
        if label in matched:
            continue
        r = ledger.loc[label]
        offset = opt_int(r["offset"])
        tally.add(
            "malformed_not_quarantined",
            exp.sessions.get(str(r["session"]), (None,))[0],
            f"malformed copy of seq {r['seq']} not in dead letters",
            session=str(r["session"]),
            seq=None,
            partition=int(r["partition"]),
            offset=offset,
        )
    needed = {matched.get(label) or _position(ledger.loc[label]) for label in required}
    _check_malformed_reports(output.integrity, at, matched, {w for w in needed if w is not None}, tally)
    detected = len(dead) if not dead.empty else 0
    if required or detected:
        hits = sum(1 for label in required if label in matched)
        tally.faults.append(
            FaultScore(
                "malformed",
                "malformed",
                exp.injected.get("malformed", 0),
                len(required),
                detected,
                hits,
                ratio(len(matched), detected),
                ratio(hits, len(required)),
            )
        )


def _at(where: tuple[str, int, int]) -> dict[str, Any]:
    return {"topic": where[0], "partition": where[1], "offset": where[2]}


def _read_to(output: PipelineOutput) -> dict[tuple[str, int], int]:
    """Per partition, the highest offset the job's output shows it read (changes, integrity, dead letters).

    A Kafka reader reads a partition in order: what it committed of a partition, it read up to there.
    """
    frames = [f for f in (output.changes, output.integrity, output.dead_letters) if not f.empty]
    columns = ["topic", "partition", "offset"]
    parts = [f[columns].dropna() for f in frames if set(columns) <= set(f)]
    if not parts:
        return {}
    both = pd.concat(parts, ignore_index=True)
    keys = [both["topic"].astype(str), both["partition"].astype("int64")]
    top = both.groupby(keys)["offset"].max().reset_index()
    return {
        (str(t), int(q)): int(o)
        for t, q, o in zip(top["topic"], top["partition"], top["offset"], strict=True)
    }


def _was_read(
    copy: pd.Series,
    read_to: Mapping[tuple[str, int], int] | None,
    matched: bool,
    stopped_at: Mapping[str, int],
) -> bool:
    """Whether the job must have read ``copy``: always, unless a strict stop ended its reading before it.

    A job a strict stop ended read each partition up to some offset (the highest its output shows), except
    that each session it stopped on reads nothing past its violation (``stopped_at``: the offset of each
    stopping violation's record); a malformed copy past either was never its to quarantine.
    """
    if read_to is None or matched:
        return True
    offset = opt_int(copy["offset"])
    if offset is None:
        return False
    stop = stopped_at.get(str(copy["session"]))
    if stop is not None and offset > stop:
        return False
    return offset < read_to.get((str(copy["topic"]), int(copy["partition"])), -1)


def _position(copy: pd.Series) -> tuple[str, int, int] | None:
    offset = opt_int(copy["offset"])
    return None if offset is None else (str(copy["topic"]), int(copy["partition"]), offset)


def _check_malformed_reports(
    integrity: pd.DataFrame,
    at: Mapping[tuple[str, int, int], Any],
    matched: Mapping[Any, tuple[str, int, int]],
    needed: set[tuple[str, int, int]],
    tally: Tally,
) -> None:
    """Each ``malformed`` integrity record is about a malformed copy, and each quarantined copy has one.

    A record is about a copy at its position or its dead letter's; every malformed copy the job must
    quarantine (``needed``: where each sits) has its record too (docs/pipeline-outputs.md).
    """
    reports = (
        integrity[integrity["violation"] == "malformed"]
        if not integrity.empty and "violation" in integrity.columns
        else integrity.iloc[0:0]
    )
    known = set(at) | set(matched.values())
    said = set()
    for r in records(reports):
        where = (str(r.get("topic")), opt_int(r.get("partition")), opt_int(r.get("offset")))
        said.add(where)
        if where in known:
            continue
        tally.add(
            "false_violation",
            None,
            f"malformed reported at {where[0]}[{where[1]}]@{where[2]}, where no malformed copy is",
            session=str(r.get("session") or ""),
            topic=where[0],
            partition=where[1],
            offset=where[2],
        )
    for where in sorted(needed - said):
        tally.add(
            "missed_violation",
            None,
            f"malformed not reported at {where[0]}[{where[1]}]@{where[2]}, where a malformed copy is",
            topic=where[0],
            partition=where[1],
            offset=where[2],
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


def faults_delivered(ledger: pd.DataFrame) -> dict[str, int]:
    """How many injected faults of each kind reached the broker, where the pipeline could meet them.

    A duplicate, delayed or malformed copy when the broker acknowledged it; a gap (a seq never sent) when a
    later seq of its session was acknowledged; an abandoned session when any of its copies was.
    """
    acked = acknowledged(ledger)
    out: dict[str, int] = {}
    for kind in FAULT_KINDS:
        if kind not in ("gap", "abandoned"):  # the faulted copy itself reaches the broker
            out[kind] = int((acked & (ledger["fault"] == kind)).sum())
    highest = ledger[acked].groupby("session")["seq"].max()
    gaps = ledger[ledger["fault"] == "gap"]
    out["gap"] = int((gaps["seq"].to_numpy() < gaps["session"].map(highest).fillna(-1).to_numpy()).sum())
    abandoned = set(ledger.loc[ledger["fault"] == "abandoned", "session"].astype(str))
    out["abandoned"] = len(abandoned & set(ledger.loc[acked, "session"].astype(str)))
    return out
