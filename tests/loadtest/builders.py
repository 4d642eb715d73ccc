"""Hand-built ledgers, truth and pipeline outputs for the verifier tests, written with pyarrow.

A test names the messages a session meant to send, the order copies reached Kafka, and what the pipeline
wrote; these helpers only turn those lists into the Parquet files of the two contracts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sotw.wire import canonical_row, encode_end, encode_snapshot, encode_update, table_digest

T0 = 1_790_000_000_000
DATE = "2026-09-21"

LEDGER_SCHEMA = pa.schema(
    [
        ("sensor", pa.string()),
        ("topic", pa.string()),
        ("session", pa.string()),
        ("seq", pa.int64()),
        ("kind", pa.string()),
        ("fault", pa.string()),
        ("intended_ts", pa.int64()),
        ("sent_ts", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("delivered", pa.bool_()),
        ("error", pa.string()),
        ("value_sha256", pa.string()),
        ("acked_ts", pa.int64()),
        ("row_id", pa.int64()),
        ("op", pa.string()),
    ]
)


@dataclass
class SessionSpec:
    """A session's messages: a 3-row snapshot, five updates touching different rows, and an end.

    Rows have their keys sorted and measurements as floats, as the simulator sends them.
    """

    session: str = "s1"
    sensor: str = "0001"
    partition: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        snapshot = [{"id": i, "unit": "C", "value": float(i)} for i in (1, 2, 3)]
        updates = [
            ("upsert", {"id": 1, "unit": "C", "value": 10.0}),
            ("upsert", {"id": 2, "unit": "C", "value": 20.0}),
            ("upsert", {"id": 4, "unit": "C", "value": 40.0}),
            ("delete", {"id": 3}),
            ("upsert", {"id": 1, "unit": "C", "value": 50.0}),
        ]
        self.messages = [{"seq": 0, "kind": "snapshot", "rows": snapshot}]
        self.messages += [
            {"seq": i + 1, "kind": "update", "op": op, "row": row} for i, (op, row) in enumerate(updates)
        ]
        self.messages.append({"seq": len(self.messages), "kind": "end"})

    @property
    def topic(self) -> str:
        return f"sotw-sensor-{self.sensor}"

    @property
    def end_seq(self) -> int:
        return len(self.messages) - 1

    def table(self, seqs: list[int] | None = None) -> dict[int, dict[str, Any]]:
        """The table after applying the given table seqs in order (all of them by default)."""
        table: dict[int, dict[str, Any]] = {}
        for seq in seqs if seqs is not None else range(self.end_seq):
            msg = self.messages[seq]
            if msg["kind"] == "snapshot":
                table = {r["id"]: r for r in msg["rows"]}
            elif msg["op"] == "delete":
                table.pop(msg["row"]["id"], None)
            else:
                table[msg["row"]["id"]] = msg["row"]
        return table

    def digest(self, seqs: list[int] | None = None) -> str:
        return table_digest(self.table(seqs).values())

    def value(self, seq: int) -> bytes:
        msg, ts = self.messages[seq], T0 + seq * 100
        if msg["kind"] == "snapshot":
            return encode_snapshot(self.sensor, self.session, seq, ts, msg["rows"])
        if msg["kind"] == "update":
            return encode_update(self.sensor, self.session, seq, ts, msg["op"], msg["row"])
        table = self.table()
        return encode_end(self.sensor, self.session, seq, ts, len(table), table_digest(table.values()))

    def change_rows(
        self, seq: int, batch: int = 0, offset: int = 0, processed_ms: int = T0 + 5000
    ) -> list[dict[str, Any]]:
        """The change rows a pipeline writes when it applies ``seq``."""
        msg = self.messages[seq]
        base = {
            "session": self.session,
            "seq": seq,
            "event_ms": T0 + seq * 100,
            "batch_id": batch,
            "processed_ms": processed_ms,
            "topic": self.topic,
            "partition": self.partition,
            "offset": offset,
        }
        if msg["kind"] == "snapshot":
            return [
                {
                    **base,
                    "row_id": r["id"],
                    "op": "snapshot",
                    "values": canonical_row(r),
                    "sensor": self.sensor,
                }
                for r in msg["rows"]
            ]
        values = None if msg["op"] == "delete" else canonical_row(msg["row"])
        return [
            {**base, "row_id": msg["row"]["id"], "op": msg["op"], "values": values, "sensor": self.sensor}
        ]


def ledger_rows(
    spec: SessionSpec,
    arrivals: list[tuple[int, str]],
    unsent: dict[int, str] | None = None,
    first_offset: int = 0,
) -> list[dict[str, Any]]:
    """Ledger rows: ``arrivals`` are (seq, fault) copies in offset order; ``unsent`` maps seq -> fault."""
    rows = []
    for i, (seq, fault) in enumerate(arrivals):
        value = b"{not json" if fault == "malformed" else spec.value(seq)
        rows.append(_ledger_row(spec, seq, fault, sent=True, offset=first_offset + i, value=value))
    for seq, fault in (unsent or {}).items():
        rows.append(_ledger_row(spec, seq, fault, sent=False, offset=None, value=spec.value(seq)))
    return rows


def _ledger_row(
    spec: SessionSpec, seq: int, fault: str, sent: bool, offset: int | None, value: bytes
) -> dict[str, Any]:
    msg = spec.messages[seq]
    return {
        "sensor": spec.sensor,
        "topic": spec.topic,
        "session": spec.session,
        "seq": seq,
        "kind": spec.messages[seq]["kind"],
        "fault": fault,
        "intended_ts": T0 + seq * 100,
        "sent_ts": T0 + seq * 100 + 1 if sent else None,
        "partition": spec.partition,
        "offset": offset,
        "delivered": offset is not None,
        "error": None,
        "value_sha256": hashlib.sha256(value).hexdigest(),
        # Acknowledged in offset order, after every send, as librdkafka reports one partition's copies.
        "acked_ts": T0 + 1_000_000 + offset * 100 if offset is not None else None,
        "row_id": msg["row"]["id"] if msg["kind"] == "update" else None,
        "op": msg.get("op"),
    }


def write_run(
    run_dir: Path,
    ledger: list[dict[str, Any]],
    specs: list[SessionSpec],
    statuses: dict[str, str] | None = None,
) -> None:
    """Write ``ledger/part-0.parquet`` and the truth: ``sessions.parquet``, ``tables/`` and ``snapshots/``."""
    (run_dir / "ledger").mkdir(parents=True)
    for folder in ("tables", "snapshots"):
        (run_dir / "truth" / folder).mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ledger, schema=LEDGER_SCHEMA), run_dir / "ledger" / "part-0.parquet")
    truth = [
        {
            "sensor": s.sensor,
            "topic": s.topic,
            "session": s.session,
            "status": (statuses or {}).get(s.session, "ended"),
            "rows": len(s.table()),
            "digest": s.digest(),
            "last_seq": s.end_seq,
            "started_ms": T0,
            "ended_ms": T0 + s.end_seq * 100,
        }
        for s in specs
    ]
    pq.write_table(pa.Table.from_pylist(truth), run_dir / "truth" / "sessions.parquet")
    for folder, rows in (
        ("tables", [(s, r) for s in specs for r in s.table().values()]),
        ("snapshots", [(s, r) for s in specs for r in s.messages[0]["rows"]]),
    ):
        table = [
            {"sensor": s.sensor, "session": s.session, "id": r["id"], "values": canonical_row(r)}
            for s, r in rows
        ]
        schema = pa.schema(
            [("sensor", pa.string()), ("session", pa.string()), ("id", pa.int64()), ("values", pa.string())]
        )
        pq.write_table(
            pa.Table.from_pylist(table, schema=schema), run_dir / "truth" / folder / "part-00000.parquet"
        )


@dataclass
class Output:
    """What a pipeline wrote, collected by the test and written as the output contract's datasets."""

    changes: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    integrity: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    batches: dict[int, int] = field(default_factory=lambda: {0: T0 + 6000})

    def apply(self, spec: SessionSpec, *seqs: int, batch: int = 0, processed_ms: int = T0 + 5000) -> Output:
        for seq in seqs:
            self.changes += spec.change_rows(seq, batch=batch, processed_ms=processed_ms)
        return self

    def session(
        self,
        spec: SessionSpec,
        status: str,
        applied: list[int] | None = None,
        closed_by: str = "end",
        degraded_from: int | None = None,
        batch: int = 0,
        processed_ms: int = T0 + 5000,
        mismatch_reported: bool = True,
    ) -> Output:
        """The session's record; closed by its end with another table than the end said, the pipeline also
        reports ``digest_mismatch`` (``mismatch_reported``)."""
        table = spec.table(applied)
        if closed_by == "end" and mismatch_reported and table_digest(table.values()) != spec.digest():
            self.violation(spec, "digest_mismatch", batch=batch)
        self.sessions.append(
            {
                "sensor": spec.sensor,
                "session": spec.session,
                "topic": spec.topic,
                "partition": spec.partition,
                "offset": 0,
                "status": status,
                "row_count": len(table),
                "digest": table_digest(table.values()),
                "closed_by": closed_by,
                # What the end message carried (the true table), when the end closed it.
                "expected_rows": len(spec.table()) if closed_by == "end" else None,
                "expected_digest": spec.digest() if closed_by == "end" else None,
                "degraded_from_seq": degraded_from,
                "batch_id": batch,
                "processed_ms": processed_ms,
                "event_ms": T0,
            }
        )
        return self

    def violation(
        self,
        spec: SessionSpec,
        kind: str,
        got: int | None = None,
        missing: tuple[int, int] | None = None,
        batch: int = 0,
    ) -> Output:
        self.integrity.append(
            {
                "sensor": spec.sensor,
                "session": spec.session,
                "violation": kind,
                "seq": got,
                "got_seq": got,
                "expected_seq": None,
                "missing_from": missing[0] if missing else None,
                "missing_to": missing[1] if missing else None,
                "detail": kind,
                "batch_id": batch,
                "topic": spec.topic,
                "partition": spec.partition,
                "offset": 0,
            }
        )
        return self

    def dead_letter(self, spec: SessionSpec, offset: int, batch: int = 0, reported: bool = True) -> Output:
        """Quarantine the malformed copy at ``offset``: its dead letter and (``reported``) its integrity record."""
        if reported:
            self.violation(spec, "malformed", batch=batch)
            self.integrity[-1]["offset"] = offset
        self.dead_letters.append(
            {
                "session": spec.session,
                "topic": spec.topic,
                "partition": spec.partition,
                "offset": offset,
                "key": spec.session.encode(),
                "value": b"{not json",
                "detail": "not JSON",
                "batch_id": batch,
            }
        )
        return self

    def write(self, root: Path) -> Path:
        _write(root / "changes", self.changes, ("sensor",))
        _write(root / "sessions", self.sessions, ("sensor",))
        _write(root / "integrity", self.integrity, ("sensor",))
        _write(root / "dead_letters", self.dead_letters, ())
        (root / "_commits").mkdir(parents=True, exist_ok=True)
        for batch, ms in self.batches.items():
            (root / "_commits" / f"{batch}.json").write_text(
                json.dumps({"batch_id": batch, "committed_ms": ms})
            )
        return root


def _write(path: Path, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Write rows as a hive-partitioned dataset by ``keys`` and ``date``, as Spark's partitionBy does.

    Every file has the schema of all the rows, as the pipeline's do: a column that is null in one partition
    keeps the type it has in the others.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    bodies = {
        values: [{k: v for k, v in r.items() if k not in keys} for r in group]
        for values, group in groups.items()
    }
    schema = pa.Table.from_pylist([r for body in bodies.values() for r in body]).schema if rows else None
    for i, (values, body) in enumerate(bodies.items()):
        folder = path.joinpath(*(f"{k}={v}" for k, v in zip(keys, values, strict=True)), f"date={DATE}")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(body, schema=schema), folder / f"part-{i}.parquet")
    path.mkdir(parents=True, exist_ok=True)
