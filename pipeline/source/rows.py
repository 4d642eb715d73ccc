"""The rows the ``sotw-kafka`` source hands Spark: Spark's Kafka rows or packed rows, as Arrow record batches.

Two schemas, ``SCHEMA`` (one row per message, as Spark's Kafka source has it) and ``PACKED_SCHEMA`` (one row
per key and partition per batch, ``packRecords=true``); ``ArrowRows`` collects the messages a reader accepted
and builds one record batch of either shape, one pass per column.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

ARROW_BATCH_ROWS = 10_000
"""Rows per Arrow record batch handed to Spark (Spark's own ``arrow.maxRecordsPerBatch`` default)."""

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
"""The row schema of Spark's Kafka source (without headers)."""

PACKED_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offsets", ArrayType(LongType(), containsNull=False)),
        StructField("values", ArrayType(BinaryType())),
        StructField("timestamps", ArrayType(LongType())),
    ]
)
"""The rows with ``packRecords=true``: one row per key and partition per Arrow batch, messages in offset order.

Spark's per-row costs (Arrow to rows, the shuffle, rows back to pandas in a stateful function) are paid per
row, not per byte; a session's messages travel together anyway (same key, so same group), so packing them
cuts those costs by the number of messages per row. ``timestamps`` are epoch milliseconds (null when the
broker gave none).
"""


def arrow_schema(pack: bool) -> Any:
    """The Arrow schema of the rows (packed or not): exactly the one PySpark validates returned batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(PACKED_SCHEMA if pack else SCHEMA, timezone="UTC")


class ArrowRows:
    """The accepted messages of one Arrow record batch; columns are built in one pass per column.

    Parameters
    ----------
    pack
        Build ``PACKED_SCHEMA`` rows (``batch``) instead of one row per message.

    Attributes
    ----------
    msgs : list
        The accepted confluent-kafka messages, in the order read; the reader appends to it directly.
    """

    def __init__(self, pack: bool) -> None:
        self.msgs: list[Any] = []
        self.pack = pack

    def __len__(self) -> int:
        return len(self.msgs)

    def batch(self, schema: Any) -> Any:
        """The messages as one Arrow record batch of ``schema`` (packed or one row per message)."""
        import pyarrow as pa

        msgs = self.msgs
        if self.pack:
            return self._packed(schema)
        stamps = [m.timestamp() for m in msgs]
        return pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in msgs], pa.binary()),
                pa.array([m.value() for m in msgs], pa.binary()),
                pa.array([m.topic() for m in msgs], pa.string()),
                pa.array([m.partition() for m in msgs], pa.int32()),
                pa.array([m.offset() for m in msgs], pa.int64()),
                # confluent-kafka: (1 create time | 2 log-append time | 0 none, ms); Spark: 0, 1, -1 and us.
                pa.array([ts * 1000 if kind else None for kind, ts in stamps], pa.timestamp("us", tz="UTC")),
                pa.array([kind - 1 for kind, _ in stamps], pa.int32()),
            ],
            schema=schema,
        )

    def _packed(self, schema: Any) -> Any:
        """One row per (topic, partition, key), messages in the order read (offset order within a partition)."""
        import pyarrow as pa

        msgs = self.msgs
        groups: dict[tuple[str, int, bytes | None], list[int]] = {}
        for i, m in enumerate(msgs):
            tpk = (m.topic(), m.partition(), m.key())
            members = groups.get(tpk)
            if members is None:
                groups[tpk] = [i]
            else:
                members.append(i)
        order = pa.array([i for members in groups.values() for i in members], pa.int64())
        bounds = [0]
        for members in groups.values():
            bounds.append(bounds[-1] + len(members))
        list_offsets = pa.array(bounds, pa.int32())
        stamps = [m.timestamp() for m in msgs]
        offsets = pa.array([m.offset() for m in msgs], pa.int64()).take(order)
        values = pa.array([m.value() for m in msgs], pa.binary()).take(order)
        times = pa.array([ts if kind else None for kind, ts in stamps], pa.int64()).take(order)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([k for _, _, k in groups], pa.binary()),
                pa.array([t for t, _, _ in groups], pa.string()),
                pa.array([p for _, p, _ in groups], pa.int32()),
                pa.ListArray.from_arrays(list_offsets, offsets, type=schema.field("offsets").type),
                pa.ListArray.from_arrays(list_offsets, values, type=schema.field("values").type),
                pa.ListArray.from_arrays(list_offsets, times, type=schema.field("timestamps").type),
            ],
            schema=schema,
        )
