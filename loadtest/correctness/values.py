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
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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
    malformed copy); ``delivered`` whether an intact copy reached the broker (acknowledged with an offset);
    ``unknown`` whether a copy was sent and never acknowledged nor refused, so that the broker may have it or
    not. ``row_id`` and ``op`` are NaN for snapshots and for a ledger that does not keep them.
    """
    table = ledger[ledger["kind"] != "end"]
    keys = ["session", "seq"]
    intact = table["fault"] != "malformed"
    sent = table["sent_ts"].notna() & intact
    delivered = table["delivered"].fillna(False).astype(bool) & table["offset"].notna() & intact
    error = table["error"].astype("string") if "error" in table else pd.Series(pd.NA, index=table.index)
    refused = error.notna() & ~error.fillna("").str.startswith(("not acknowledged", "Local: Message timed"))
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
                "unknown": sent & ~delivered & ~refused,
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
    plain = {str(k): _plain(v) for k, v in sorted(row.items())}
    yield wire.encode_row(plain)
    floats = {
        k: float(v) if k != "id" and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in plain.items()
    }
    if floats != plain or any(
        type(a) is not type(b) for a, b in zip(floats.values(), plain.values(), strict=True)
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


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


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
    rows = changes[["session", "seq", "row_id", "op", "values"]].copy()
    rows["session"] = rows["session"].astype(str)
    rows["seq"] = rows["seq"].astype("int64")
    rows["row_id"] = rows["row_id"].astype("int64")
    joined = rows.merge(
        messages[messages["value_sha256"].notna()], on=["session", "seq"], how="inner", suffixes=("", "_sent")
    )
    findings: list[Finding] = []
    at_snapshot = joined["kind"] == "snapshot"
    findings += _check_updates(joined[~at_snapshot])
    if not snapshots.empty:
        findings += _check_snapshots(joined[at_snapshot], snapshots, whole_snapshots)
    return findings, len(joined)


def _check_updates(rows: pd.DataFrame) -> list[Finding]:
    """Upserts and deletes against their messages: every digest at once, only mismatches one by one."""
    if rows.empty:
        return []
    fits = update_digests(rows) == rows["value_sha256"].to_numpy(dtype="S64")
    findings = []
    for r in records(rows[~fits]):
        op, row_id = str(r["op"]), int(r["row_id"])
        if op not in ("upsert", "delete"):
            detail = f"a {op} row for seq {r['seq']}, which was an update"
        elif carries(r, op, row_id, r["values"]):
            continue  # the same row, written another way (key order, an integer for a float)
        else:
            what = "deletes it" if op == "delete" else f"is {_short(r['values'])}"
            sent = {**r, "op": r["op_sent"], "row_id": r["row_id_sent"]}
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


def _check_snapshots(rows: pd.DataFrame, snapshots: pd.DataFrame, whole: bool) -> list[Finding]:
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
    if whole:
        written = joined[joined["op"] == "snapshot"]
        for (name, at), group in written.groupby(["session", "seq"]):
            wanted = carried[carried["session"] == name]
            for missing in sorted(set(wanted["row_id"].tolist()) - set(group["row_id"].tolist())):
                detail = f"snapshot row {missing} (seq {at}) has no change row"
                findings.append(Finding("lost_row", str(name), int(str(at)), int(missing), detail))
    return findings


def same_values(got: Any, want: Any) -> bool:
    """Whether two rows (JSON texts or dicts) hold the same columns and values, numbers compared as numbers."""
    mine = orjson.loads(got) if isinstance(got, str | bytes) else got
    theirs = orjson.loads(want) if isinstance(want, str | bytes) else want
    if not isinstance(mine, Mapping) or not isinstance(theirs, Mapping) or set(mine) != set(theirs):
        return False
    for name, value in theirs.items():
        other = _plain(mine[name])
        if isinstance(value, int | float) and not isinstance(value, bool) and isinstance(other, int | float):
            if float(value) != float(other):
                return False
        elif other != value:
            return False
    return True


def _short(values: Any, most: int = 160) -> str:
    text = values if isinstance(values, str) else orjson.dumps(values, default=str).decode()
    return text if len(text) <= most else text[: most - 3] + "..."


# ------------------------------------------------------------------------------ the tables contract


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

    Returns ``session``, ``row_id``, ``source``, ``seq`` (the deciding seq, NaN if none), ``lost`` (the
    seqs after it that touched the row and never arrived, as text).
    """
    updates = messages[messages["kind"] == "update"][["session", "seq", "row_id", "op", "delivered"]]
    updates = updates[updates["row_id"].notna()].assign(row_id=lambda f: f["row_id"].astype("int64"))
    snap_sent = messages[messages["kind"] == "snapshot"][["session", "seq", "delivered"]]
    snap = snapshots[["session", "id"]].rename(columns={"id": "row_id"})
    snap = snap.assign(session=snap["session"].astype(str), row_id=snap["row_id"].astype("int64"))
    snap = snap.merge(snap_sent, on="session", how="inner").assign(op="snapshot")
    touches = pd.concat([updates, snap[["session", "seq", "row_id", "op", "delivered"]]], ignore_index=True)
    if touches.empty:
        return pd.DataFrame(columns=["session", "row_id", "source", "seq", "lost"])
    touches = touches.sort_values(["session", "row_id", "seq"])
    keys = ["session", "row_id"]
    last = touches.groupby(keys, sort=False).tail(1).set_index(keys)["seq"].rename("last")
    got = touches[touches["delivered"]]
    decided = got.groupby(keys, sort=False).tail(1).set_index(keys)[["seq", "op"]]
    frame = last.to_frame().join(decided, how="left")
    source = np.where(
        frame["seq"].isna(),
        ABSENT,
        np.where(
            frame["seq"] == frame["last"],
            FROM_TRUTH,
            np.where(
                frame["op"] == "snapshot",
                FROM_SNAPSHOT,
                np.where(frame["op"] == "delete", ABSENT, FROM_MESSAGE),
            ),
        ),
    )
    frame["source"] = source
    lost_touches = touches[~touches["delivered"]].join(frame["seq"].rename("decided"), on=keys)
    lost_touches = lost_touches[
        lost_touches["decided"].isna() | (lost_touches["seq"] > lost_touches["decided"])
    ]
    lost = lost_touches.groupby(keys)["seq"].agg(lambda s: ", ".join(str(int(v)) for v in s)).rename("lost")
    frame = frame.join(lost, how="left")
    return frame.reset_index()[["session", "row_id", "source", "seq", "lost"]]
