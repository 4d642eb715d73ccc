"""The output contracts the verifier reads, so it can judge any team's streaming job, not only sotw's.

Two contracts (docs/own-pipeline.md states them for users):

- **full**: sotw's own four datasets (changes, sessions, integrity, dead letters; docs/pipeline-outputs.md),
  verified change by change under the run's integrity policy (``loadtest.correctness.verify``).
- **tables**: the contract a team can meet in an afternoon: one table holding each session's (or each
  sensor's) current rows, a row per ``(session, row_id)`` with the row's columns. The final tables are
  compared row by row with what a correct job holds: exact, rows missing, rows extra, rows with wrong
  values.

Either is read from Parquet files or from a Delta Lake table (``loadtest.correctness.delta``), named or detected
(``OutputSpec.resolved_format``). A session whose messages all reached the broker intact must hold the
truth. One that lost some upstream (an injected gap, a malformed copy without an intact one, a send the
broker refused) must hold what its delivered messages build when applied in seq order: each row as the
highest delivered seq that touched it set it (``loadtest.correctness.tablerows.expected_rows``); a message
whose delivery is unknown may decide a row or not. Under ``strict`` a job that met a violation must stop,
and its tables hold nothing past it (``_strict_tables``).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from loadtest.correctness.expect import kafka_order, strict_reading
from loadtest.correctness.outputspec import COMMITTED, SEQ
from loadtest.correctness.stops import JobExit
from loadtest.correctness.tablerows import compare_plan, compare_to_truth, prefix_row_plans, row_plans
from loadtest.correctness.tables import TablesOutput
from loadtest.correctness.values import has_row_ids, sent_messages
from loadtest.reports.results import Correctness, Discrepancy

log = logging.getLogger(__name__)


def _list(values: Iterable[int], most: int = 6) -> str:
    items = list(values)
    shown = ", ".join(map(str, items[:most]))
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def session_faults(ledger: pd.DataFrame) -> dict[str, str]:
    """Per session, the faults that reorder or repeat what the pipeline receives, for a wrong table's story."""
    out: dict[str, str] = {}
    faulty = ledger[ledger["fault"].isin(["delayed", "duplicate"])]
    for session, rows in faulty.groupby("session"):
        parts = []
        for fault, what in (
            ("delayed", "delayed (arrived after later seqs)"),
            ("duplicate", "duplicated later"),
        ):
            seqs = sorted({int(s) for s in rows.loc[rows["fault"] == fault, "seq"]})
            if seqs:
                parts.append(f"seq {_list(seqs)} {what}")
        out[str(session)] = "; ".join(parts)
    return out


@dataclass(frozen=True)
class Judgement:
    """How each session is judged: against its truth, against what its delivered messages build, or not."""

    complete: frozenset[str]
    from_delivered: frozenset[str]
    not_judged: dict[str, str]
    lost: dict[str, str]  # session -> which seqs never reached the broker intact, and why


def judge_sessions(messages: pd.DataFrame, ledger: pd.DataFrame, snapshots: pd.DataFrame) -> Judgement:
    """Which sessions reached the broker whole, which lost messages, and which cannot be judged.

    A session every snapshot and update seq of which reached the broker intact is judged against the truth.
    One that lost some (an injected gap, a malformed copy without an intact one, a send the broker refused)
    or holds messages whose delivery is unknown (sent, never acknowledged nor refused: the broker may hold
    them or not) is judged against the table its delivered messages build, each message of unknown delivery
    taken either way (``loadtest.correctness.values.expected_rows``); that needs the ledger's row ids and, if
    its snapshot arrived, the snapshot's rows, without which it is not judged.
    """
    # The faults of each (session, seq) that had any; one without is "not delivered" where it is looked up. Only
    # the faulted rows are grouped: a 10x run's ledger has millions of rows, each group costs a Python call.
    faulted = ledger[(ledger["kind"] != "end") & (ledger["fault"].astype(str) != "none")]
    faults = faulted.groupby(["session", "seq"])["fault"].agg(lambda f: ", ".join(sorted(set(f.astype(str)))))
    known = set(snapshots["session"].astype(str)) if not snapshots.empty else set()
    row_ids = has_row_ids(ledger)
    complete: set[str] = set()
    lossy: set[str] = set()
    not_judged: dict[str, str] = {}
    lost: dict[str, str] = {}
    for session, rows in messages.groupby("session", sort=False):
        name = str(session)
        missing = rows[~rows["delivered"]]
        if missing.empty:
            complete.add(name)
            continue
        gone = missing[~missing["unknown"]]
        maybe = missing[missing["unknown"]]
        parts = []
        if not gone.empty:
            kinds = sorted({faults.get((session, int(s)), "not delivered") for s in gone["seq"]})
            parts.append(
                f"seq {_list(int(s) for s in gone['seq'])} never reached the broker intact ({', '.join(kinds)})"
            )
        if not maybe.empty:
            parts.append(
                f"seq {_list(int(s) for s in maybe['seq'])} sent and neither acknowledged nor refused "
                "(either way is right)"
            )
        lost[name] = "; ".join(parts)
        snapshot_arrived = bool(rows.loc[rows["kind"] == "snapshot", "delivered"].any())
        if not row_ids or (snapshot_arrived and name not in known):
            not_judged[name] = "the run's ledger or truth does not say which rows its messages touched"
        else:
            lossy.add(name)
    return Judgement(frozenset(complete), frozenset(lossy), not_judged, lost)


def verify_tables(
    ledger: pd.DataFrame,
    truth_sessions: pd.DataFrame,
    truth_tables: pd.DataFrame,
    output: TablesOutput,
    snapshots: pd.DataFrame | None = None,
    *,
    strict: bool = False,
    job_exit: JobExit | None = None,
) -> tuple[Correctness, list[Discrepancy]]:
    """Compare every session's (or sensor's) final table with what a correct job holds, row by row.

    A session whose messages all reached the broker must hold the truth; one that lost some, the table its
    delivered messages build (``judge_sessions``). Returns the ``Correctness`` (without triage) and its
    discrepancies, one per wrong, missing, extra or repeated row and per column the contract does not know,
    each naming the session, the row and the faults its session met.

    A ``strict`` job must stop at the first violation that reaches it, and the tables contract has no
    integrity output to name it: when a violation reached the broker, the job must have exited on its own
    with a non-zero code, and its tables must hold nothing past the first fault (``_strict_tables``).
    """
    if strict:
        ordered = kafka_order(ledger)
        readings = {str(name): strict_reading(rows) for name, rows in ordered.groupby("session", sort=False)}
        stopping = {name: r.stop_at for name, r in readings.items() if r.stop_at is not None}
        stopped = job_exit is not None and job_exit.on_its_own and job_exit.code != 0
        if stopping or (stopped and any(r.may_stop for r in readings.values())):
            applied = {name: r.applied for name, r in readings.items()}
            return _strict_tables(ledger, output, snapshots, stopping, applied, job_exit)
    snapshots = (
        snapshots if snapshots is not None else pd.DataFrame(columns=["sensor", "session", "id", "values"])
    )
    messages = sent_messages(ledger)
    judgement = judge_sessions(messages, ledger, snapshots)
    faults = session_faults(ledger)
    sensor_of = {str(s): str(n) for s, n in zip(ledger["session"], ledger["sensor"], strict=True)}
    truth_of = _truth_keys(ledger, truth_sessions, output.key)
    by_session = {str(s): g for s, g in truth_tables.groupby("session")} if not truth_tables.empty else {}
    truth_rows: dict[str, dict[int, dict[str, Any]]] = {}
    for session in truth_of.values():
        table = by_session.get(session)
        truth_rows[session] = (
            {int(i): json.loads(v) for i, v in zip(table["id"], table["values"], strict=True)}
            if table is not None
            else {}
        )
    found: list[Discrepancy] = []
    got = _without_unknown_columns(output, truth_rows, found)
    lossy = judgement.from_delivered & set(truth_of.values())
    plans = row_plans(messages, snapshots, lossy, truth_rows)
    got_by_key = {str(k): g for k, g in got.groupby("key")} if not got.empty else {}
    counts: Counter[str] = Counter()
    judged = exact = 0
    for key in sorted(set(truth_of) | set(got_by_key)):
        known = truth_of.get(key)
        sensor = sensor_of.get(known or "", key)
        if known is None:
            counts["extra"] += len(got_by_key[key])
            found.append(
                Discrepancy("unknown_session", key, f"rows for a {output.key} the ledger never had", sensor)
            )
            continue
        session = known
        if session in judgement.not_judged:
            counts["not_judged"] += 1
            continue
        judged += 1
        mine = got_by_key.get(key, got.iloc[0:0])
        found += _misfiled(session, sensor, mine)
        if session in lossy:
            counts["from_delivered"] += 1
            problems = compare_plan(plans.get(session, []), mine, counts)
            story = "; ".join(p for p in (faults.get(session), judgement.lost[session]) if p)
        else:
            counts["expected"] += len(truth_rows[session])
            problems = [(k, d, None) for k, d in compare_to_truth(truth_rows[session], mine, counts)]
            story = faults.get(session) or "no fault reached this session: the job's own error"
        exact += not problems
        for kind, detail, seq in problems:
            found.append(Discrepancy(kind, session, f"{detail}; {story}", sensor, seq=seq))
    kinds = Counter(d.kind for d in found)
    correctness = Correctness(
        policy="tables",
        passed=not found,
        sessions_expected=len(truth_of),
        sessions_exact_required=judged,
        sessions_exact=exact,
        exact_match_rate=exact / judged if judged else math.nan,
        rows_expected=counts["expected"],
        rows_written=len(got),
        rows_lost=counts["missing"],
        rows_repeated=counts["repeated"],
        rows_unexpected=counts["extra"],
        malformed_sent=0,
        malformed_quarantined=0,
        discrepancy_counts=dict(kinds),
        reasons=[f"{n} {k.replace('_', ' ')}" for k, n in sorted(kinds.items())],
        contract="tables",
        rows_wrong=counts["wrong"],
        sessions_not_judged=counts["not_judged"],
        rows_values_checked=counts["checked"],
        sessions_judged_from_delivered=counts["from_delivered"],
        sessions_judged=judged,
    )
    return correctness, found


def _misfiled(session: str, sensor: str, rows: pd.DataFrame) -> list[Discrepancy]:
    """A session-keyed table's rows whose ``sensor`` column names another sensor than their session's."""
    if rows.empty or "sensor" not in rows or rows["sensor"].isna().all():
        return []
    wrong = rows[rows["sensor"].astype("string").fillna("") != sensor]
    if wrong.empty:
        return []
    names = ", ".join(sorted({str(v) for v in wrong["sensor"]}))
    return [
        Discrepancy(
            "wrong_sensor",
            session,
            f"{len(wrong)} rows under sensor {names}; the session is on {sensor}",
            sensor,
        )
    ]


def _strict_tables(
    ledger: pd.DataFrame,
    output: TablesOutput,
    snapshots: pd.DataFrame | None,
    stopping: dict[str, int],
    applied: dict[str, frozenset[int]],
    job_exit: JobExit | None,
) -> tuple[Correctness, list[Discrepancy]]:
    """A strict job's tables once a violation reached it: its stop, and nothing past the first fault.

    The job stops at a moment the verifier cannot see, so every session may hold any prefix of what reached
    it: each row must be absent or hold what a message of its session set that strict applies (in Kafka
    order, up to the session's first violation: ``applied``). When a session must stop the query
    (``stopping``), the job must have exited on its own, with a non-zero code. A table keyed by sensor holds
    whichever of the sensor's sessions was current when the job stopped: the closest is taken.
    """
    snapshots = (
        snapshots if snapshots is not None else pd.DataFrame(columns=["sensor", "session", "id", "values"])
    )
    messages = sent_messages(ledger)
    keep = [
        int(q) in applied.get(str(n), frozenset())
        for n, q in zip(messages["session"], messages["seq"], strict=True)
    ]
    messages = messages[keep]
    sessions = sorted({str(s) for s in ledger["session"]})
    sensor_of = {str(s): str(n) for s, n in zip(ledger["session"], ledger["sensor"], strict=True)}
    plans = prefix_row_plans(messages, snapshots, set(sessions))
    got = output.rows
    got_by_key = {str(k): g for k, g in got.groupby("key")} if not got.empty else {}
    found: list[Discrepancy] = []
    first = min(stopping) if stopping else None
    if first is not None and (job_exit is None or not job_exit.on_its_own or job_exit.code == 0):
        how = job_exit.describe() if job_exit is not None else "the job's exit is not known"
        kind = "did_not_stop" if job_exit is not None and not job_exit.on_its_own else "no_policy_stop"
        found.append(
            Discrepancy(
                kind,
                first,
                f"strict must stop at the first violation (seq {stopping[first]} of this session, or another's), "
                f"exiting on its own with a non-zero code; {how}",
                sensor_of.get(first, ""),
                seq=stopping[first],
            )
        )
    counts: Counter[str] = Counter()
    candidates: dict[str, list[str]] = {}
    for session in sessions:
        key = session if output.key == "session" else sensor_of[session]
        candidates.setdefault(key, []).append(session)
    for key in sorted(set(candidates) | set(got_by_key)):
        mine = got_by_key.get(key, got.iloc[0:0])
        if key not in candidates:
            counts["extra"] += len(mine)
            found.append(Discrepancy("unknown_session", key, f"rows for a {output.key} the ledger never had"))
            continue
        tried = []
        for session in candidates[key]:
            local: Counter[str] = Counter()
            tried.append((compare_plan(plans.get(session, []), mine, local), local, session))
        problems, local, session = min(tried, key=lambda t: len(t[0]))
        counts.update(local)
        if output.key == "session":
            found += _misfiled(session, sensor_of[session], mine)
        stop = stopping.get(session)
        story = (
            f"strict must stop this session at seq {stop}" if stop is not None else "strict stopped the job"
        )
        for kind, detail, seq in problems:
            found.append(Discrepancy(kind, session, f"{detail}; {story}", sensor_of[session], seq=seq))
    kinds = Counter(d.kind for d in found)
    stopped = not any(d.kind in ("did_not_stop", "no_policy_stop") for d in found)
    correctness = Correctness(
        policy="strict",
        passed=not found,
        sessions_expected=len(sessions),
        sessions_exact_required=0,
        sessions_exact=0,
        exact_match_rate=math.nan,
        rows_expected=0,
        rows_written=len(got),
        rows_lost=0,
        rows_repeated=counts["repeated"],
        rows_unexpected=counts["extra"],
        malformed_sent=0,
        malformed_quarantined=0,
        must_stop=bool(stopping),
        discrepancy_counts=dict(kinds),
        reasons=[f"{n} {k.replace('_', ' ')}" for k, n in sorted(kinds.items())],
        contract="tables",
        rows_wrong=counts["wrong"],
        rows_values_checked=counts["checked"],
        sessions_judged=len({k for k in got_by_key if k in candidates}),
        policy_stop=f"the job exited with code {job_exit.code}" if stopped and job_exit is not None else None,
    )
    return correctness, found


def _without_unknown_columns(
    output: TablesOutput, truth_rows: dict[str, dict[int, dict[str, Any]]], found: list[Discrepancy]
) -> pd.DataFrame:
    """The job's rows without columns the truth's rows lack; one discrepancy per such column.

    A column the job adds beside the row's (a write time, a batch number) is not a wrong value in every row:
    it is named once, with the two ways out.
    """
    got = output.rows
    if got.empty:
        return got
    columns = {str(c) for rows in truth_rows.values() for row in rows.values() for c in row}
    if not columns:
        return got
    written = {str(c) for row in got["row"] for c in row}
    unknown = sorted(written - columns - {"id"} - set(output.ignored))
    for name in unknown:
        found.append(
            Discrepancy(
                "unknown_column",
                "",
                f"column {name!r} is not a column of the sensors' rows ({', '.join(sorted(columns))}) nor one "
                f"the tables contract knows (docs/own-pipeline.md); rename it '_{name}' or pass "
                f"--ignore-column {name}. Rows were compared without it",
            )
        )
    drop = set(unknown) | set(output.ignored)
    if not drop:
        return got
    kept: list[dict[str, Any]] = [{k: v for k, v in row.items() if k not in drop} for row in got["row"]]
    return got.assign(row=pd.Series(kept, index=got.index, dtype=object))


def _truth_keys(ledger: pd.DataFrame, truth_sessions: pd.DataFrame, key: str) -> dict[str, str]:
    """``{table key: the session whose truth it must hold}``: each session, or each sensor's last session."""
    sessions = sorted({str(s) for s in ledger["session"]})
    if key == "session":
        return {s: s for s in sessions}
    started = (
        dict(zip(truth_sessions["session"].astype(str), truth_sessions["started_ms"], strict=True))
        if not truth_sessions.empty
        else {}
    )
    last: dict[str, str] = {}
    for session, sensor in ledger.drop_duplicates("session")[["session", "sensor"]].itertuples(index=False):
        current = last.get(str(sensor))
        if current is None or started.get(str(session), 0) >= started.get(current, 0):
            last[str(sensor)] = str(session)
    return last


# --------------------------------------------------------------------------------------------- latency


def tables_end_to_end(ledger: pd.DataFrame, output: TablesOutput) -> pd.DataFrame:
    """Per row whose ``seq`` the output names: that message's ``intended_ts``, the row's commit time, latency.

    A table in files shows only each row's last change, so this is the latency of the messages that set the
    final rows (a sample of all messages, the last ones of each row). A topic holds every change: each message
    whose change it holds is dated, at the first change it wrote.
    """
    rows = output.rows
    if rows.empty or output.commit_source == "none" or output.key != "session":
        return pd.DataFrame(columns=LATENCY_COLUMNS)
    if output.changes is not None:
        return latencies(ledger, output.changes)
    have = rows[rows[SEQ].notna() & rows[COMMITTED].notna()]
    written = pd.DataFrame(
        {"session": have["key"], "seq": have[SEQ].astype("int64"), "committed_ms": have[COMMITTED]}
    )
    return latencies(ledger, written)


LATENCY_COLUMNS = ["session", "seq", "intended_ts", "committed_ms", "latency_ms"]


def latencies(ledger: pd.DataFrame, written: pd.DataFrame) -> pd.DataFrame:
    """Per message: its ``intended_ts`` (ledger), the first ``committed_ms`` it was written at, the latency.

    ``written`` has ``session``, ``seq`` and ``committed_ms``, a row per time a message's effect was written.
    """
    first = written.groupby(["session", "seq"], as_index=False)["committed_ms"].min()
    meant = ledger[ledger["fault"] != "duplicate"].drop_duplicates(["session", "seq"])
    joined = first.merge(meant[["session", "seq", "intended_ts"]], on=["session", "seq"])
    joined["latency_ms"] = joined["committed_ms"].astype("float64") - joined["intended_ts"].astype("float64")
    result: pd.DataFrame = joined[LATENCY_COLUMNS]
    return result
