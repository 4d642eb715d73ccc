"""The tables contract row by row: what each row of a session's final table must be, and how a written row is compared with it.

``expected_rows`` says, for each row any message touched, which message a correct job's final row comes from
(``FROM_TRUTH``, ``FROM_SNAPSHOT``, ``FROM_MESSAGE``) or that it must be ``ABSENT``; ``plans`` turns that into
what each row must hold, and ``compare_plan`` holds the written rows to it. ``compare`` holds a session's rows
to its true table. ``loadtest.correctness.contracts`` judges whole sessions with them.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from loadtest.correctness.values import carries, plain, records

#: Where a correct job's final row comes from (``expected_rows``' ``source``).
FROM_TRUTH, FROM_SNAPSHOT, FROM_MESSAGE, ABSENT = "truth", "snapshot", "message", "absent"


def expected_rows(messages: pd.DataFrame, snapshots: pd.DataFrame) -> pd.DataFrame:
    """For each ``(session, row_id)`` any message touched: where a correct job's final row comes from.

    The rule: every message that reached the broker is applied in seq order (a copy applied again changes
    nothing), so each row holds what the highest delivered seq that touched it set: the snapshot (seq 0)
    touches every row it carried, an update its own row. When that is also the highest seq that touched
    the row at all, the row is the truth's (``truth``: as the sensor held it when the session closed,
    absent if the truth lacks it); otherwise a later touch never reached the broker, and the row is the
    snapshot's (``snapshot``), the update's (``message``: checked against its digest) or gone (``absent``,
    a delete). A row no delivered message touched is absent.

    A message whose delivery is unknown (``sent_messages``' ``unknown``) may be on the broker or not: a later
    touch of unknown delivery than the deciding one may decide the row instead, so each is an alternative.

    Returns ``session``, ``row_id``, ``source``, ``seq`` (the deciding seq, NaN if none), ``lost`` (the
    seqs after it that touched the row and never arrived, as text) and ``maybe``: the alternatives, a tuple
    of ``(source, seq)`` (empty when every touch's delivery is known).
    """
    columns = ["session", "seq", "row_id", "op", "delivered", "unknown"]
    updates = messages[messages["kind"] == "update"][columns]
    updates = updates[updates["row_id"].notna()].assign(row_id=lambda f: f["row_id"].astype("int64"))
    snap_sent = messages[messages["kind"] == "snapshot"][["session", "seq", "delivered", "unknown"]]
    snap = snapshots[["session", "id"]].rename(columns={"id": "row_id"})
    snap = snap.assign(session=snap["session"].astype(str), row_id=snap["row_id"].astype("int64"))
    snap = snap.merge(snap_sent, on="session", how="inner").assign(op="snapshot")
    touches = pd.concat([updates, snap[columns]], ignore_index=True)
    if touches.empty:
        return pd.DataFrame(columns=["session", "row_id", "source", "seq", "lost", "maybe"])
    touches = touches.sort_values(["session", "row_id", "seq"])
    keys = ["session", "row_id"]
    last = touches.groupby(keys, sort=False).tail(1).set_index(keys)["seq"].rename("last")
    got = touches[touches["delivered"]]
    decided = got.groupby(keys, sort=False).tail(1).set_index(keys)[["seq", "op"]]
    frame = last.to_frame().join(decided, how="left")
    frame["source"] = _sources(frame["seq"], frame["op"], frame["last"])
    after = touches[~touches["delivered"]].join(frame["seq"].rename("decided"), on=keys)
    after = after[after["decided"].isna() | (after["seq"] > after["decided"])]
    lost_touches = after[~after["unknown"].astype(bool)]
    lost = lost_touches.groupby(keys)["seq"].agg(lambda s: ", ".join(str(int(v)) for v in s)).rename("lost")
    frame = frame.join(lost, how="left")
    maybe_touches = after[after["unknown"].astype(bool)].join(frame["last"], on=keys)
    maybe_touches = maybe_touches.assign(
        source=_sources(maybe_touches["seq"], maybe_touches["op"], maybe_touches["last"])
    )
    maybe: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
    for session, row_id, src, seq in zip(
        maybe_touches["session"],
        maybe_touches["row_id"],
        maybe_touches["source"],
        maybe_touches["seq"],
        strict=True,
    ):
        key = (str(session), int(row_id))
        maybe[key] = (*maybe.get(key, ()), (str(src), int(seq)))
    alternatives = [maybe.get((str(k[0]), int(k[1])), ()) for k in frame.index]
    frame["maybe"] = pd.Series(alternatives, index=frame.index, dtype=object)
    return frame.reset_index()[["session", "row_id", "source", "seq", "lost", "maybe"]]


def _sources(seq: pd.Series, op: pd.Series, last: pd.Series) -> np.ndarray:
    """Where a row decided by the touch ``seq`` with ``op`` comes from, ``last`` the row's last touch."""
    return np.where(
        seq.isna(),
        ABSENT,
        np.where(
            seq == last,
            FROM_TRUTH,
            np.where(op == "snapshot", FROM_SNAPSHOT, np.where(op == "delete", ABSENT, FROM_MESSAGE)),
        ),
    )


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether two rows hold the same columns and values, numbers compared by value.

    ``21 == 21.0``, and an exact decimal equals the float it was written from (``values.plain``).
    """
    if set(got) != set(want):
        return False
    for name, value in want.items():
        mine = plain(got[name])
        if isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(value, bool):
            if float(value) != float(mine):
                return False
        elif mine != value:
            return False
    return True


def prefix_row_plans(
    messages: pd.DataFrame, snapshots: pd.DataFrame, sessions: set[str]
) -> dict[str, list[PlannedRow]]:
    """Per session, every row a delivered message touched: absent, or as any one of those messages set it."""
    carried: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    if not snapshots.empty:
        for s, i, v in zip(snapshots["session"], snapshots["id"], snapshots["values"], strict=True):
            carried.setdefault(str(s), []).append((int(i), json.loads(v)))
    delivered = messages[messages["delivered"] | messages["unknown"]]
    options: dict[tuple[str, int], list[PlannedRow]] = {}
    for m in records(delivered):
        session, seq = str(m["session"]), int(m["seq"])
        if session not in sessions:
            continue
        if m["kind"] == "snapshot":
            for row_id, values in carried.get(session, []):
                options.setdefault((session, row_id), []).append(
                    PlannedRow(row_id, FROM_SNAPSHOT, seq, "", values, None)
                )
        elif not pd.isna(m["row_id"]):
            row_id = int(m["row_id"])
            source = ABSENT if m["op"] == "delete" else FROM_MESSAGE
            options.setdefault((session, row_id), []).append(
                PlannedRow(row_id, source, seq, "", None, m if source == FROM_MESSAGE else None)
            )
    plans: dict[str, list[PlannedRow]] = {}
    for (session, row_id), alternatives in options.items():
        plans.setdefault(session, []).append(
            PlannedRow(row_id, ABSENT, None, "", None, None, tuple(alternatives))
        )
    return plans


@dataclass(frozen=True)
class PlannedRow:
    """What one row of a session that lost messages must be, and which message decides it.

    ``alternatives`` are what it may be instead, when a later message that touched it may or may not have
    reached the broker (its delivery is unknown).
    """

    row_id: int
    source: str
    seq: int | None
    lost: str
    want: dict[str, Any] | None  # the values, when the truth or the snapshot says them
    message: dict[str, Any] | None  # the deciding update, checked by digest
    alternatives: tuple[PlannedRow, ...] = ()


def row_plans(
    messages: pd.DataFrame,
    snapshots: pd.DataFrame,
    sessions: frozenset[str] | set[str],
    truth_rows: dict[str, dict[int, dict[str, Any]]],
) -> dict[str, list[PlannedRow]]:
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

    def planned_row(session: str, row_id: int, source: str, seq: int | None, lost: str) -> PlannedRow:
        want = message = None
        if source == FROM_TRUTH:
            want = truth_rows.get(session, {}).get(row_id)
            source = ABSENT if want is None else FROM_TRUTH
        elif source == FROM_SNAPSHOT:
            want = carried.get((session, row_id))
        elif source == FROM_MESSAGE and seq is not None:
            message = by_seq.get((session, seq))
        return PlannedRow(row_id, source, seq, lost, want, message)

    plans: dict[str, list[PlannedRow]] = {}
    for r in records(rows):
        session, row_id = str(r["session"]), int(r["row_id"])
        seq = None if pd.isna(r["seq"]) else int(r["seq"])
        lost = str(r["lost"]) if isinstance(r["lost"], str) else ""
        plan = planned_row(session, row_id, str(r["source"]), seq, lost)
        others = tuple(planned_row(session, row_id, src, other, "") for src, other in r["maybe"])
        plans.setdefault(session, []).append(replace(plan, alternatives=others))
    return plans


def compare_plan(
    plan: list[PlannedRow], got: pd.DataFrame, counts: Counter[str]
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
        problem = row_problem(p, mine)
        if problem is not None and any(row_problem(a, mine) is None for a in p.alternatives):
            problem = None  # a message of unknown delivery, taken as on the broker, decides it
        elif problem is not None and p.alternatives and mine is not None:
            seqs = [q for q in (p.seq, *(a.seq for a in p.alternatives)) if q is not None]
            detail = (
                f"row {p.row_id} is {row_text(mine)}, a value none of the messages that may decide it set "
                f"(seq {', '.join(map(str, seqs))})"
            )
            problem = ("wrong_row", detail, p.seq)
        counts["expected"] += p.source != ABSENT
        counts["checked"] += mine is not None and p.source != ABSENT
        if problem is None:
            continue
        kind = problem[0]
        counts[{"extra_row": "extra", "missing_row": "missing", "wrong_row": "wrong"}[kind]] += 1
        problems.append(problem)
    for row_id in sorted(set(seen) - set(planned)):
        counts["extra"] += 1
        problems.append(
            (
                "extra_row",
                f"row {row_id} should not exist (no message touched it): {row_text(seen[row_id])}",
                None,
            )
        )
    return problems


def row_problem(p: PlannedRow, mine: dict[str, Any] | None) -> tuple[str, str, int | None] | None:
    """What is wrong with the row written (``mine``, None if none) where ``p`` is expected; None if nothing."""
    why = f"seq {p.seq} set it" if p.seq is not None else "no message that reached the broker touched it"
    later = f"; seq {p.lost}, which touched it later, never reached the broker" if p.lost else ""
    if p.source == ABSENT:
        if mine is None:
            return None
        return ("extra_row", f"row {p.row_id} should not exist ({why}{later}): {row_text(mine)}", p.seq)
    if mine is None:
        return ("missing_row", f"row {p.row_id} missing ({why}{later})", p.seq)
    if p.message is not None:
        if not carries(p.message, "upsert", p.row_id, mine):
            return (
                "wrong_row",
                f"row {p.row_id} is {row_text(mine)}, not what seq {p.seq} set it to{later}",
                p.seq,
            )
        return None
    if p.want is not None and not same_row(mine, p.want):
        return (
            "wrong_row",
            f"row {p.row_id} is {row_text(mine)}, expected {row_text(p.want)} ({why}{later})",
            p.seq,
        )
    return None


def compare_to_truth(
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
            problems.append(("missing_row", f"row {row_id} missing, expected {row_text(row)}"))
            continue
        counts["checked"] += 1
        if not same_row(mine, row):
            counts["wrong"] += 1
            problems.append(("wrong_row", f"row {row_id} is {row_text(mine)}, expected {row_text(row)}"))
    for row_id in sorted(set(seen) - set(want)):
        counts["extra"] += 1
        problems.append(
            (
                "extra_row",
                f"row {row_id} should not exist (deleted or never written): {row_text(seen[row_id])}",
            )
        )
    return problems


def row_text(row: dict[str, Any]) -> str:
    """A row as sorted JSON, for a discrepancy's detail."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)
