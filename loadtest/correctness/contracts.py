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
highest delivered seq that touched it set it (``loadtest.correctness.values.expected_rows``). Only a session with a
copy whose delivery is unknown (sent, never acknowledged) is not judged.
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

from loadtest.correctness.outputspec import COMMITTED, SEQ
from loadtest.correctness.tables import TablesOutput
from loadtest.correctness.values import (
    ABSENT,
    FROM_MESSAGE,
    FROM_SNAPSHOT,
    FROM_TRUTH,
    carries,
    expected_rows,
    has_row_ids,
    records,
    sent_messages,
)
from loadtest.reports.results import Correctness, Discrepancy

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------- reading


# --------------------------------------------------------------------------------------------- verdict


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether two rows hold the same columns and values (numbers compared as numbers: 21 == 21.0)."""
    if set(got) != set(want):
        return False
    for name, value in want.items():
        mine = got[name]
        if isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(value, bool):
            if float(value) != float(mine):
                return False
        elif mine != value:
            return False
    return True


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
    is judged against the table its delivered messages build (``loadtest.correctness.values.expected_rows``), which
    needs the ledger's row ids and, if its snapshot arrived, the snapshot's rows. One with a copy sent and
    never acknowledged nor refused is not judged: the broker may hold that message or not.
    """
    faults = (
        ledger[ledger["kind"] != "end"]
        .groupby(["session", "seq"])["fault"]
        .agg(lambda f: ", ".join(sorted(set(f.astype(str)) - {"none"})) or "not delivered")
    )
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
        kinds = sorted({faults.get((session, int(s)), "not delivered") for s in missing["seq"]})
        lost[name] = (
            f"seq {_list(int(s) for s in missing['seq'])} never reached the broker intact ({', '.join(kinds)})"
        )
        unknown = rows[rows["unknown"]]
        snapshot_arrived = bool(rows.loc[rows["kind"] == "snapshot", "delivered"].any())
        if not unknown.empty:
            not_judged[name] = f"seq {_list(int(s) for s in unknown['seq'])} was sent and never acknowledged"
        elif not row_ids or (snapshot_arrived and name not in known):
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
) -> tuple[Correctness, list[Discrepancy]]:
    """Compare every session's (or sensor's) final table with what a correct job holds, row by row.

    A session whose messages all reached the broker must hold the truth; one that lost some, the table its
    delivered messages build (``judge_sessions``). Returns the ``Correctness`` (without triage) and its
    discrepancies, one per wrong, missing, extra or repeated row and per column the contract does not know,
    each naming the session, the row and the faults its session met.
    """
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
    plans = _plans(messages, snapshots, lossy, truth_rows)
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
        if session in lossy:
            counts["from_delivered"] += 1
            problems = _compare_plan(plans.get(session, []), mine, counts)
            story = "; ".join(p for p in (faults.get(session), judgement.lost[session]) if p)
        else:
            counts["expected"] += len(truth_rows[session])
            problems = [(k, d, None) for k, d in _compare(truth_rows[session], mine, counts)]
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


@dataclass(frozen=True)
class _Planned:
    """What one row of a session that lost messages must be, and which message decides it."""

    row_id: int
    source: str
    seq: int | None
    lost: str
    want: dict[str, Any] | None  # the values, when the truth or the snapshot says them
    message: dict[str, Any] | None  # the deciding update, checked by digest


def _plans(
    messages: pd.DataFrame,
    snapshots: pd.DataFrame,
    sessions: frozenset[str] | set[str],
    truth_rows: dict[str, dict[int, dict[str, Any]]],
) -> dict[str, list[_Planned]]:
    """Per session that lost messages, every row any of its messages touched, as ``expected_rows`` decides."""
    if not sessions:
        return {}
    mine = messages[messages["session"].isin(sessions)]
    snaps = snapshots[snapshots["session"].astype(str).isin(sessions)] if not snapshots.empty else snapshots
    rows = expected_rows(mine, snaps)
    carried = (
        {
            (str(s), int(i)): json.loads(v)
            for s, i, v in zip(snaps["session"], snaps["id"], snaps["values"], strict=True)
        }
        if not snaps.empty
        else {}
    )
    by_seq = {(str(m["session"]), int(m["seq"])): m for m in records(mine)}
    plans: dict[str, list[_Planned]] = {}
    for r in records(rows):
        session, row_id, source = str(r["session"]), int(r["row_id"]), str(r["source"])
        seq = None if pd.isna(r["seq"]) else int(r["seq"])
        want = message = None
        if source == FROM_TRUTH:
            want = truth_rows.get(session, {}).get(row_id)
            source = ABSENT if want is None else FROM_TRUTH
        elif source == FROM_SNAPSHOT:
            want = carried.get((session, row_id))
        elif source == FROM_MESSAGE and seq is not None:
            message = by_seq.get((session, seq))
        lost = str(r["lost"]) if isinstance(r["lost"], str) else ""
        plans.setdefault(session, []).append(_Planned(row_id, source, seq, lost, want, message))
    return plans


def _compare_plan(
    plan: list[_Planned], got: pd.DataFrame, counts: Counter[str]
) -> list[tuple[str, str, int | None]]:
    """The differences between the rows a session's delivered messages build and the rows written for it."""
    problems: list[tuple[str, str, int | None]] = []
    seen: dict[int, dict[str, Any]] = {}
    for row_id, row in zip(got["row_id"], got["row"], strict=True):
        if int(row_id) in seen:
            counts["repeated"] += 1
            problems.append(("repeated_row", f"row {row_id} written more than once", None))
            continue
        seen[int(row_id)] = row
    planned = {p.row_id: p for p in plan}
    for p in plan:
        mine = seen.get(p.row_id)
        why = f"seq {p.seq} set it" if p.seq is not None else "no message that reached the broker touched it"
        later = f"; seq {p.lost}, which touched it later, never reached the broker" if p.lost else ""
        if p.source == ABSENT:
            if mine is not None:
                counts["extra"] += 1
                detail = f"row {p.row_id} should not exist ({why}{later}): {_json(mine)}"
                problems.append(("extra_row", detail, p.seq))
            continue
        counts["expected"] += 1
        if mine is None:
            counts["missing"] += 1
            problems.append(("missing_row", f"row {p.row_id} missing ({why}{later})", p.seq))
            continue
        counts["checked"] += 1
        if p.message is not None:
            if not carries(p.message, "upsert", p.row_id, mine):
                counts["wrong"] += 1
                detail = f"row {p.row_id} is {_json(mine)}, not what seq {p.seq} set it to{later}"
                problems.append(("wrong_row", detail, p.seq))
        elif p.want is not None and not same_row(mine, p.want):
            counts["wrong"] += 1
            detail = f"row {p.row_id} is {_json(mine)}, expected {_json(p.want)} ({why}{later})"
            problems.append(("wrong_row", detail, p.seq))
    for row_id in sorted(set(seen) - set(planned)):
        counts["extra"] += 1
        problems.append(
            (
                "extra_row",
                f"row {row_id} should not exist (no message touched it): {_json(seen[row_id])}",
                None,
            )
        )
    return problems


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


def _compare(
    want: dict[int, dict[str, Any]], got: pd.DataFrame, counts: Counter[str]
) -> list[tuple[str, str]]:
    """The differences between one true table and the rows written for it, with ``counts`` updated."""
    problems: list[tuple[str, str]] = []
    seen: dict[int, dict[str, Any]] = {}
    for row_id, row in zip(got["row_id"], got["row"], strict=True):
        if int(row_id) in seen:
            counts["repeated"] += 1
            problems.append(("repeated_row", f"row {row_id} written more than once"))
            continue
        seen[int(row_id)] = row
    for row_id, row in sorted(want.items()):
        mine = seen.get(row_id)
        if mine is None:
            counts["missing"] += 1
            problems.append(("missing_row", f"row {row_id} missing, expected {_json(row)}"))
            continue
        counts["checked"] += 1
        if not same_row(mine, row):
            counts["wrong"] += 1
            problems.append(("wrong_row", f"row {row_id} is {_json(mine)}, expected {_json(row)}"))
    for row_id in sorted(set(seen) - set(want)):
        counts["extra"] += 1
        problems.append(
            ("extra_row", f"row {row_id} should not exist (deleted or never written): {_json(seen[row_id])}")
        )
    return problems


def _json(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------------------------- latency


def tables_end_to_end(ledger: pd.DataFrame, output: TablesOutput) -> pd.DataFrame:
    """Per row whose ``seq`` the output names: that message's ``intended_ts``, the row's commit time, latency.

    The final table shows only each row's last change, so this is the latency of the messages that set the
    final rows (a sample of all messages, the last ones of each row).
    """
    rows = output.rows
    if rows.empty or output.commit_source == "none" or output.key != "session":
        return pd.DataFrame(columns=LATENCY_COLUMNS)
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
