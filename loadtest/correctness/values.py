"""What each message carried, checked against the rows a pipeline wrote, without a copy of the messages.

The ledger keeps the SHA-256 of every value the simulator sent and which row each update touched, with its op;
the truth keeps the rows each snapshot carried (``simulator.truth``). The simulator sends a row's keys
sorted, so an update's message can be rebuilt from the row a pipeline wrote (``sotw.wire``'s update layout)
and its digest compared with the ledger's: a row holds what its message carried exactly when the two agree.
This checks every value of every change, in every session, with no read of Kafka.

``check_changes`` does it for the full contract's change rows; ``expected_rows`` says, for the tables
contract, which message a correct job's final row must come from when some of a session's messages never
reached the broker (``loadtest.correctness.contracts``).
"""

from __future__ import annotations

import binascii
import hashlib
import math
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from loadtest.correctness.delivery import acknowledged, unknown
from loadtest.correctness.expect import of_sensors, read_parquet_dir, simulator_dirs
from simulator.native import Values
from sotw import wire

#: Columns of ``sent_messages``.
MESSAGE_COLUMNS = [
    "session",
    "seq",
    "sensor",
    "kind",
    "intended_ts",
    "value_sha256",
    "row_id",
    "op",
    "delivered",
    "unknown",
]


def read_truth_rows(run_dir: Path, folder: str, sensors: Collection[str] | None = None) -> pd.DataFrame:
    """``truth/<folder>`` of a run (the union of its parts'): ``sensor``, ``session``, ``id``, ``values``.

    ``tables`` are each session's final rows, ``snapshots`` the rows its snapshot carried (empty for a run
    written before the simulator kept them). ``sensors`` reads only their sessions' rows.
    """
    frames = [read_parquet_dir(d / "truth" / folder, of_sensors(sensors)) for d in simulator_dirs(run_dir)]
    kept = [f for f in frames if not f.empty]
    if not kept:
        return pd.DataFrame(columns=["sensor", "session", "id", "values"])
    return pd.concat(kept, ignore_index=True) if len(kept) > 1 else kept[0]


def read_snapshots(run_dir: Path, sensors: Collection[str] | None = None) -> pd.DataFrame:
    """The rows every session's snapshot carried (``read_truth_rows(run_dir, "snapshots")``), or ``sensors``'."""
    return read_truth_rows(run_dir, "snapshots", sensors)


def has_row_ids(ledger: pd.DataFrame) -> bool:
    """Whether the ledger says which row each update touched (runs since the simulator keeps it)."""
    return "row_id" in ledger.columns and "op" in ledger.columns


def sent_messages(ledger: pd.DataFrame) -> pd.DataFrame:
    """One row per meant message (``session``, ``seq``) of a snapshot or an update, with what it carried.

    ``value_sha256`` is the digest of an intact copy that was sent (None if none was: a gap, or only a
    malformed copy); ``delivered`` whether an intact copy reached the broker (acknowledged, with an offset or
    without one); ``unknown`` whether an intact copy's outcome is unknown (``loadtest.correctness.delivery``),
    so that the broker may have the message or not.
    """
    table = ledger[ledger["kind"] != "end"]
    keys = ["session", "seq"]
    intact = table["fault"] != "malformed"
    sent = table["sent_ts"].notna() & intact
    delivered = acknowledged(table) & intact
    maybe = unknown(table) & intact
    meant = table.drop_duplicates(keys)
    frame = pd.DataFrame(
        {
            "session": meant["session"].astype(str),
            "seq": meant["seq"].astype("int64"),
            "sensor": meant["sensor"].astype(str),
            "kind": meant["kind"].astype(str),
            "intended_ts": meant["intended_ts"].astype("int64"),
            "row_id": meant["row_id"] if has_row_ids(meant) else math.nan,
            "op": meant["op"] if has_row_ids(meant) else None,
        }
    )
    copies = table[sent].drop_duplicates(keys)
    sha = pd.DataFrame(
        {
            "session": copies["session"].astype(str),
            "seq": copies["seq"].astype("int64"),
            "value_sha256": copies["value_sha256"],
        }
    )
    flags = (
        pd.DataFrame(
            {
                "session": table["session"].astype(str),
                "seq": table["seq"].astype("int64"),
                "delivered": delivered,
                "unknown": maybe,
            }
        )
        .groupby(keys, sort=False)[["delivered", "unknown"]]
        .any()
    )
    out = frame.merge(sha, on=keys, how="left").join(flags, on=keys)
    out["unknown"] &= ~out["delivered"]
    return out[MESSAGE_COLUMNS].reset_index(drop=True)


# ------------------------------------------------------------------------------------------ one message


def update_digest(sensor: str, session: str, seq: int, ts: int, op: str, row: bytes) -> str:
    """The SHA-256 of the update ``encode_update`` writes, given its row's JSON text exactly as sent."""
    value = (
        wire.update_prefix(sensor, session)
        + b"%d" % seq
        + wire.UPDATE_AFTER_SEQ
        + b"%d" % ts
        + wire.update_after_ts(op)
        + row
        + b"}"
    )
    return hashlib.sha256(value).hexdigest()


def row_texts(row: Mapping[str, Any]) -> Iterator[bytes]:
    """The texts a message may have carried for this row: its keys sorted, as written, then numbers as floats.

    A pipeline may keep a measurement as an integer (``21`` for ``21.0``); the simulator sends every column
    but ``id`` that is a number as a float.
    """
    written = {str(k): plain(v) for k, v in sorted(row.items())}
    if any(isinstance(v, Decimal) for v in written.values()):
        return  # a decimal no float writes as: no message carried it
    yield wire.encode_row(written)
    floats = {
        k: float(v) if k != "id" and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in written.items()
    }
    if floats != written or any(
        type(a) is not type(b) for a, b in zip(floats.values(), written.values(), strict=True)
    ):
        yield wire.encode_row(floats)


def carries(message: Mapping[str, Any], op: str, row_id: int, values: Any) -> bool:
    """Whether an update with this ``op`` of row ``row_id`` with ``values`` is what ``message`` carried.

    ``message`` is a ``sent_messages`` row; ``values`` the row as JSON text (the full contract's ``values``),
    as a dict (a tables-contract row), or None for a delete.
    """
    sha = message["value_sha256"]
    if not isinstance(sha, str):
        return False
    head = (str(message["sensor"]), str(message["session"]), int(message["seq"]), int(message["intended_ts"]))
    if op == "delete":
        return update_digest(*head, "delete", b'{"id":%d}' % row_id) == sha
    if isinstance(values, str):
        if update_digest(*head, op, values.encode("utf-8")) == sha:
            return True
        try:
            values = orjson.loads(values)
        except orjson.JSONDecodeError:
            return False
    if not isinstance(values, Mapping):
        return False
    return any(update_digest(*head, op, text) == sha for text in row_texts({**values, "id": row_id}))


def what_it_was(message: Mapping[str, Any]) -> str:
    """The message as the ledger describes it, for a discrepancy's detail."""
    kind, seq = str(message["kind"]), int(message["seq"])
    if kind == "snapshot":
        return f"seq {seq} is the session's snapshot"
    op, row = message.get("op"), message.get("row_id")
    if isinstance(op, str) and row is not None and not _nan(row):
        return (
            f"seq {seq} was an {op} of row {int(row)}"
            if op == "upsert"
            else f"seq {seq} deleted row {int(row)}"
        )
    return f"seq {seq} was an update"


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as dicts with string keys."""
    return [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]


def plain(value: Any) -> Any:
    """``value`` as the simulator would have sent it: a numpy scalar as Python's, an exact decimal as its float.

    A job may keep a measurement as a ``DECIMAL``: it is the float it was written from when it holds the
    float's shortest text (``Decimal("50.347")``) or its exact binary value (``Decimal(50.347)``), at any
    scale; any other decimal (rounded, or with other digits) stays a ``Decimal``, which equals no float it is
    compared with.
    """
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Decimal) and value.is_finite():
        number = float(value)
        # The float's shortest text (50.347) or its exact binary value (Decimal(50.347)), at any scale.
        return number if value in (Decimal(repr(number)), Decimal(number)) else value
    return value


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ------------------------------------------------------------------------------- the full contract


@dataclass(frozen=True)
class Finding:
    """One change row that does not hold what its message carried (or a snapshot row it lacks)."""

    kind: str  # wrong_value | lost_row
    session: str
    seq: int
    row_id: int
    detail: str


def check_changes(
    changes: pd.DataFrame, messages: pd.DataFrame, snapshots: pd.DataFrame, whole_snapshots: bool
) -> tuple[list[Finding], int]:
    """Each change row's values against its message; returns the findings and how many rows were checked.

    An upsert or a delete must be what its seq's update carried (the digest of the message rebuilt from the
    row); a snapshot row must be the row the snapshot carried, and a delete at the snapshot's seq a row the
    snapshot lacked. With ``whole_snapshots``, an applied snapshot must have written every one of its rows
    (the ``once`` policy may skip rows a later seq touched first). Rows of seqs the broker never got are
    left to the counting checks (``loadtest.correctness.verify``), which say the seq must not be applied.
    """
    if changes.empty:
        return [], 0
    columns = ["session", "seq", "row_id", "op", "values"] + [
        c for c in ("event_ms", "offset") if c in changes
    ]
    rows = changes[columns].copy()
    rows["session"] = rows["session"].astype(str)
    rows["seq"] = rows["seq"].astype("int64")
    rows["row_id"] = rows["row_id"].astype("int64")
    joined = rows.merge(
        messages[messages["value_sha256"].notna()], on=["session", "seq"], how="inner", suffixes=("", "_sent")
    )
    findings: list[Finding] = []
    at_snapshot = joined["kind"] == "snapshot"
    findings += _check_updates(joined[~at_snapshot])
    findings += _check_event_times(joined)
    if not snapshots.empty:
        findings += _check_snapshots(joined[at_snapshot], snapshots, whole_snapshots, rows)
    return findings, len(joined)


def _check_event_times(rows: pd.DataFrame) -> list[Finding]:
    """Each change row's ``event_ms`` is its message's ``ts`` (the ledger's ``intended_ts``)."""
    if "event_ms" not in rows or rows.empty:
        return []
    wrong = rows[rows["event_ms"].astype("float64") != rows["intended_ts"].astype("float64")]
    return [
        Finding(
            "wrong_value",
            str(r["session"]),
            int(r["seq"]),
            int(r["row_id"]),
            f"row {r['row_id']} of seq {r['seq']} has event_ms {r['event_ms']}; the message's ts was {r['intended_ts']}",
        )
        for r in records(wrong.drop_duplicates(["session", "seq"]))
    ]


def _check_updates(rows: pd.DataFrame) -> list[Finding]:
    """Upserts and deletes against their messages: every digest at once, only mismatches one by one.

    A row must carry its message's op and row id as the ledger has them (when it has them): a digest is
    rebuilt from the row's values, which name their id themselves, and an op the contract does not know is
    hashed as an upsert's.
    """
    if rows.empty:
        return []
    fits = update_digests(rows) == rows["value_sha256"].to_numpy(dtype="S64")
    if "op_sent" in rows and "row_id_sent" in rows:
        known = rows["op_sent"].notna().to_numpy()
        same = (rows["op"] == rows["op_sent"]).to_numpy() & (rows["row_id"] == rows["row_id_sent"]).to_numpy()
        fits &= ~known | same
    findings = []
    for r in records(rows[~fits]):
        op, row_id = str(r["op"]), int(r["row_id"])
        sent = {**r, "op": r.get("op_sent"), "row_id": r.get("row_id_sent")}
        if op not in ("upsert", "delete"):
            detail = f"a {op} row for seq {r['seq']}, which was an update"
        elif isinstance(sent["op"], str) and (op != sent["op"] or row_id != int(sent["row_id"])):
            what = "deletes" if op == "delete" else "upserts"
            detail = (
                f"the row {what} row {row_id}, which is not what the message carried: {what_it_was(sent)}"
            )
        elif carries(r, op, row_id, r["values"]):
            continue  # the same row, written another way (key order, an integer for a float)
        else:
            what = "deletes it" if op == "delete" else f"is {_short(r['values'])}"
            detail = f"row {row_id} {what}, which is not what the message carried: {what_it_was(sent)}"
        findings.append(Finding("wrong_value", str(r["session"]), int(r["seq"]), row_id, detail))
    return findings


#: Rows whose messages ``update_digests`` builds and hashes at once: bounds the memory of the messages' text.
_DIGEST_BLOCK = 200_000


def update_digests(rows: pd.DataFrame) -> np.ndarray:
    """The hex SHA-256 (``S64``) of the update each row stands for, its values taken as written.

    ``rows`` has ``sensor``, ``session``, ``seq``, ``intended_ts``, ``op``, ``row_id`` and ``values`` (the row's
    JSON text; a delete's row is ``{"id":N}``). The messages are assembled with Arrow's string kernels and
    hashed by the simulator's compiled SHA-256 (``simulator.native.Values``), so a million rows take a
    second or two instead of a Python call each.
    """
    out = []
    for start in range(0, len(rows), _DIGEST_BLOCK):
        block = rows.iloc[start : start + _DIGEST_BLOCK]
        # One prefix per session (its sensor is the same in every row of it), taken by each row's code.
        sessions = pd.Categorical(block["session"])
        sensors = block.groupby(sessions.codes, sort=True)["sensor"].first()
        heads = [
            wire.update_prefix(str(sensors[i]), str(name)).decode("utf-8")
            for i, name in enumerate(sessions.categories)
        ]
        prefix = pa.array(heads, pa.string()).take(pa.array(sessions.codes))
        delete = pa.array(block["op"].to_numpy() == "delete")
        row_id = pc.cast(pa.array(block["row_id"].to_numpy(dtype="int64")), pa.string())
        values = pa.array(block["values"].to_numpy(dtype=object), pa.string())
        row = pc.if_else(delete, pc.binary_join_element_wise('{"id":', row_id, "}", ""), values)
        after = pc.if_else(
            delete, wire.update_after_ts("delete").decode(), wire.update_after_ts("upsert").decode()
        )
        text = pc.binary_join_element_wise(
            prefix,
            pc.cast(pa.array(block["seq"].to_numpy(dtype="int64")), pa.string()),
            wire.UPDATE_AFTER_SEQ.decode(),
            pc.cast(pa.array(block["intended_ts"].to_numpy(dtype="int64")), pa.string()),
            after,
            pc.fill_null(row, ""),
            "}\n",
            "",
        ).cast(pa.large_binary())
        _, offsets, data = text.buffers()
        assert offsets is not None and data is not None
        bounds = np.frombuffer(offsets, dtype=np.int64)[text.offset : text.offset + len(text) + 1]
        buffer = np.frombuffer(data, dtype=np.uint8)[bounds[0] : bounds[-1]].copy()
        hexed = binascii.hexlify(Values(buffer, bounds - bounds[0]).digests())
        out.append(np.frombuffer(hexed, dtype="S64"))
    return np.concatenate(out) if out else np.empty(0, dtype="S64")


def _check_snapshots(
    rows: pd.DataFrame, snapshots: pd.DataFrame, whole: bool, changes: pd.DataFrame
) -> list[Finding]:
    """Snapshot rows against the rows the snapshot carried; every carried row written, as the policy says.

    With ``whole`` an applied snapshot writes every row it carried. Without (``once``), it skips a row a
    later seq had set before the snapshot arrived: a skipped row is right only when ``changes`` hold an
    update of it from an earlier Kafka position than the snapshot's (any update of it, when the rows carry
    no position).
    """
    carried = snapshots.rename(columns={"id": "row_id", "values": "carried"})[
        ["session", "row_id", "carried"]
    ]
    carried = carried.assign(session=carried["session"].astype(str), row_id=carried["row_id"].astype("int64"))
    joined = rows.merge(carried, on=["session", "row_id"], how="left")
    findings = []
    for r in records(joined):
        op, row_id, seq, session = str(r["op"]), int(r["row_id"]), int(r["seq"]), str(r["session"])
        kept = r["carried"]
        if op == "delete":
            if isinstance(kept, str):
                detail = f"row {row_id} deleted by the snapshot (seq {seq}), which carried it"
                findings.append(Finding("wrong_value", session, seq, row_id, detail))
        elif op != "snapshot":
            detail = f"a {op} row for seq {seq}, the session's snapshot"
            findings.append(Finding("wrong_value", session, seq, row_id, detail))
        elif not isinstance(kept, str):
            detail = f"row {row_id} set by the snapshot (seq {seq}), which did not carry it"
            findings.append(Finding("wrong_value", session, seq, row_id, detail))
        elif r["values"] != kept and not same_values(r["values"], kept):
            detail = f"snapshot row {row_id} is {_short(r['values'])}, the snapshot carried {kept}"
            findings.append(Finding("wrong_value", session, seq, row_id, detail))
    written = joined[joined["op"] == "snapshot"]
    earlier = _updated_before_snapshot(changes, written) if not whole else set()
    carried_ids = (
        {str(k): set(g.tolist()) for k, g in carried.groupby("session")["row_id"]} if len(carried) else {}
    )
    for (name, at), group in written.groupby(["session", "seq"]):
        for missing in sorted(carried_ids.get(str(name), set()) - set(group["row_id"].tolist())):
            if (str(name), int(missing)) in earlier:
                continue
            why = "" if whole else ", and no update set it before the snapshot came"
            detail = f"snapshot row {missing} (seq {at}) has no change row{why}"
            findings.append(Finding("lost_row", str(name), int(str(at)), int(missing), detail))
    return findings


def _updated_before_snapshot(changes: pd.DataFrame, snapshot_rows: pd.DataFrame) -> set[tuple[str, int]]:
    """``(session, row id)`` of the rows an update set before their session's snapshot was applied."""
    updates = changes[changes["seq"] > 0]
    if updates.empty:
        return set()
    if "offset" not in changes or "offset" not in snapshot_rows:
        return {(str(s), int(i)) for s, i in zip(updates["session"], updates["row_id"], strict=True)}
    at = snapshot_rows.groupby("session")["offset"].min().rename("snapshot_at")
    first = updates.groupby(["session", "row_id"])["offset"].min().reset_index().join(at, on="session")
    before = first[first["offset"] < first["snapshot_at"]]
    return {(str(s), int(i)) for s, i in zip(before["session"], before["row_id"], strict=True)}


def same_values(got: Any, want: Any) -> bool:
    """Whether two rows (JSON texts or dicts) hold the same columns and values, numbers compared as numbers."""
    mine = orjson.loads(got) if isinstance(got, str | bytes) else got
    theirs = orjson.loads(want) if isinstance(want, str | bytes) else want
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping) or set(mine) != set(theirs):
        return False
    for name, value in theirs.items():
        other = plain(mine[name])
        if isinstance(value, int | float) and not isinstance(value, bool) and isinstance(other, int | float):
            if float(value) != float(other):
                return False
        elif other != value:
            return False
    return True


def _short(values: Any, most: int = 160) -> str:
    text = values if isinstance(values, str) else orjson.dumps(values, default=str).decode()
    return text if len(text) <= most else text[: most - 3] + "..."
