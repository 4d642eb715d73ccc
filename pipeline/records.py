"""The one flat record type the stateful step emits, defined once: Arrow schema, builders and blocks.

Every row the reconstruction produces is a change, a closed session, an integrity event or a dead letter;
the ``record`` column says which, and the sink splits them into the four datasets of
``docs/pipeline-outputs.md``. Builders collect rows in plain tuples and dicts (cheap to append on the hot
path) and turn them into one Arrow block per group at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from pipeline.integrity import IntegrityRecord

# (name, Spark SQL type) in output order. The sink adds batch_id and processed_ms later.
FIELDS: tuple[tuple[str, str], ...] = (
    ("record", "string"),
    ("sensor", "string"),
    ("session", "string"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("seq", "bigint"),
    ("event_ms", "bigint"),
    ("row_id", "bigint"),
    ("op", "string"),
    ("values", "string"),
    ("status", "string"),
    ("row_count", "bigint"),
    ("digest", "string"),
    ("expected_rows", "bigint"),
    ("expected_digest", "string"),
    ("first_seq", "bigint"),
    ("last_seq", "bigint"),
    ("messages", "bigint"),
    ("gaps", "bigint"),
    ("duplicates", "bigint"),
    ("reordered", "bigint"),
    ("malformed", "bigint"),
    ("digest_mismatches", "bigint"),
    ("missing_snapshot", "bigint"),
    ("degraded_from_seq", "bigint"),
    ("closed_by", "string"),
    ("violation", "string"),
    ("expected_seq", "bigint"),
    ("got_seq", "bigint"),
    ("missing_from", "bigint"),
    ("missing_to", "bigint"),
    ("detail", "string"),
    ("key", "binary"),
    ("value", "binary"),
)
COLUMNS: tuple[str, ...] = tuple(name for name, _ in FIELDS)

RECORD_KINDS = ("change", "session", "integrity", "dead_letter")
VIOLATIONS = (
    "gap",
    "duplicate",
    "reorder",
    "malformed",
    "digest_mismatch",
    "missing_snapshot",
    "timeout",
    "late_after_close",
)
STATUSES = ("ok", "degraded", "failed", "timed_out")

# A change is by far the most frequent record, so it is kept as a tuple in this column order.
CHANGE_COLUMNS = (
    "sensor",
    "session",
    "topic",
    "partition",
    "offset",
    "seq",
    "event_ms",
    "row_id",
    "op",
    "values",
)
ChangeHead = tuple[str, str, str, int, int, int, int]
"""(sensor, session, topic, partition, offset, seq, event_ms): the leading ``CHANGE_COLUMNS`` of every change
one message makes; a change record is this plus (row_id, op, values)."""


_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "binary": pa.binary()}
ARROW_SCHEMA = pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in FIELDS])
"""The records' Arrow schema (``FIELDS`` with Spark's types), for record blocks and the sink."""

BLOCK_DDL = "`block` binary, `rows` bigint, `messages` bigint"
"""What the stateful step emits: one row per session and micro-batch whose ``block`` holds its records.

``rows`` counts the block's records and ``messages`` the Kafka messages the call consumed (with packed input
Spark's ``numInputRows`` counts packed rows, so this is where the batch's message count comes from).

A block is an Arrow IPC stream of ``ARROW_SCHEMA``'s columns, or only of those a change uses when it holds only
changes (``to_block``/``from_blocks``). Handing Spark one row per
session instead of one per change avoids converting every record through pandas and the JVM's row format
twice; the sink writes the blocks' records to Parquet with Arrow directly.
"""


_CHANGES_ONLY = pa.schema(
    [ARROW_SCHEMA.field(name) for name in COLUMNS if name == "record" or name in CHANGE_COLUMNS]
)
"""The schema of a block that holds only changes (most blocks): the columns a change leaves null are left out."""


def with_every_column(table: pa.Table) -> pa.Table:
    """``table`` with ``ARROW_SCHEMA``'s columns in order, null columns added for those a block left out."""
    if table.schema.equals(ARROW_SCHEMA):
        return table
    n, present = table.num_rows, set(table.column_names)
    columns = [table[f.name] if f.name in present else pa.nulls(n, f.type) for f in ARROW_SCHEMA]
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def from_blocks(blocks: Iterable[Any]) -> pa.Table:
    """The records of any number of blocks (bytes or Arrow buffers) as one table of ``ARROW_SCHEMA``.

    Empty if there are no blocks; columns a block left out (``to_block``) come back as nulls.
    """
    tables = [with_every_column(pa.ipc.open_stream(block).read_all()) for block in blocks]
    return pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()


class Records:
    """Output records of one call of the state processor, collected cheaply and converted once.

    Changes are appended as tuples (one per touched row); the rare session, integrity and dead-letter
    records as dicts with only the columns they use. ``to_block`` turns them into one Arrow block with all
    columns, which the stateful step hands back to Spark per group.
    """

    __slots__ = ("changes", "others")

    def __init__(self) -> None:
        self.changes: list[tuple[Any, ...]] = []
        self.others: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.changes) + len(self.others)

    def change(
        self,
        sensor: str,
        session: str,
        topic: str,
        partition: int,
        offset: int,
        seq: int,
        event_ms: int,
        row_id: int,
        op: str,
        values: str | None,
    ) -> None:
        """Record that a row was set by a snapshot, upserted or deleted (``values`` None for a delete)."""
        self.changes.append((sensor, session, topic, partition, offset, seq, event_ms, row_id, op, values))

    def session(self, **fields: Any) -> None:
        """Record a closed session (status, final table, what ``end`` said, counters); see the contract."""
        self.others.append({"record": "session", **fields})

    def integrity(self, record: IntegrityRecord) -> None:
        """Record one detected violation, so the harness can match detected faults with injected ones."""
        self.others.append(record.as_row())

    def dead_letter(self, malformed: IntegrityRecord, key: bytes | None, value: bytes | None) -> None:
        """Keep a malformed message's raw bytes beside what ``malformed`` says of it, so nothing is dropped silently.

        A dead letter names the same sensor, session, position, Kafka timestamp and reason as the message's
        ``malformed`` integrity record.
        """
        self.others.append(
            {
                "record": "dead_letter",
                "sensor": malformed.sensor,
                "session": malformed.session,
                "topic": malformed.at.topic,
                "partition": malformed.at.partition,
                "offset": malformed.at.offset,
                "event_ms": malformed.event_ms,
                "key": key,
                "value": value,
                "detail": malformed.detail,
            }
        )

    def rows(self) -> list[dict[str, Any]]:
        """All records as dicts with every column (None where unused), changes first; for tests and tools."""
        out = [
            {**dict.fromkeys(COLUMNS), "record": "change", **dict(zip(CHANGE_COLUMNS, c, strict=True))}
            for c in self.changes
        ]
        out.extend({**dict.fromkeys(COLUMNS), **o} for o in self.others)
        return out

    def of(self, record: str) -> list[dict[str, Any]]:
        """The records of one kind (``change``, ``session``, ``integrity`` or ``dead_letter``) as dicts."""
        return [r for r in self.rows() if r["record"] == record]

    def to_arrow(self) -> pa.Table:
        """All records as one Arrow table of ``ARROW_SCHEMA``, changes first, built column by column.

        With only changes (the usual case) the table has just the columns a change uses (``record`` and
        ``CHANGE_COLUMNS``): the other 24 would be all null, and their buffers would more than double the
        block that travels to the JVM and back. ``from_blocks`` restores them.
        """
        n_changes, n = len(self.changes), len(self)
        by_name: dict[str, Any] = {}
        if n_changes:
            by_name = dict(zip(CHANGE_COLUMNS, zip(*self.changes, strict=True), strict=True))
            by_name["record"] = ["change"] * n_changes
        if not self.others:
            return pa.Table.from_arrays(
                [pa.array(by_name.get(f.name, []), f.type) for f in _CHANGES_ONLY], schema=_CHANGES_ONLY
            )
        others = self.others
        columns = []
        for name, typ in zip(COLUMNS, ARROW_SCHEMA.types, strict=True):
            head = by_name.get(name)
            if others:
                tail = [o.get(name) for o in others]
                data = [*(head if head is not None else [None] * n_changes), *tail]
                columns.append(pa.array(data, typ))
            elif head is not None:
                columns.append(pa.array(head, typ))
            else:
                columns.append(pa.nulls(n, typ))
        return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)

    def to_block(self) -> bytes:
        """The records as one block (an Arrow IPC stream of ``to_arrow``'s table; see ``BLOCK_DDL``)."""
        table = self.to_arrow()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())
