r"""A small correct streaming job: each session's current rows in a Delta table, exactly once.

What makes it correct where ``naive_pipeline.py`` is not: every row remembers the ``seq`` of the message
that set it, and a message changes a row only if its ``seq`` is higher, so a delayed message or a copy sent
again cannot bring an old value back, whatever order they arrive in. A delete is kept as a tombstone
(``deleted = true``, with its ``seq``) for the same reason: an older upsert arriving after it must not bring
the row back. A snapshot is the row's value at seq 0.

Each micro-batch is one Delta MERGE (delta-rs, no JVM jar) that records the streaming query's id and the
batch id as the table's transaction identifier (``txn``), the mechanism Spark's Delta sink uses: after a
crash Spark replays the batch, the job sees the table already holds it and does nothing, so every batch
lands exactly once. Rows carry ``committed_ms`` (when the batch was written), which the harness measures
end-to-end latency against (a MERGE rewrites whole files, so the commit that wrote a row's file is not
always the one that changed the row).

It writes sotw's tables contract (docs/own-pipeline.md): ``session``, ``sensor``, ``row_id``, ``values``
(the row as JSON), ``seq``, ``deleted``, ``committed_ms``. Run it under the harness::

    sotw run --profile smoke --contract tables --format delta --pipeline-cmd \\
      '{python} examples/delta_pipeline.py --bootstrap {bootstrap} --topics {pattern} --out {output} \\
       --checkpoint {checkpoint} --trigger-ms {trigger_ms}'
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

SCHEMA = pa.schema(
    [
        ("session", pa.string()),
        ("sensor", pa.string()),
        ("row_id", pa.int64()),
        ("values", pa.string()),
        ("seq", pa.int64()),
        ("deleted", pa.bool_()),
        ("committed_ms", pa.int64()),
    ]
)


def parse_args() -> argparse.Namespace:
    """The job's flags (the harness fills them in from its --pipeline-cmd template)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap address")
    p.add_argument("--topics", required=True, help="topic regex")
    p.add_argument("--out", type=Path, required=True, help="the Delta table")
    p.add_argument("--checkpoint", type=Path, required=True, help="Spark checkpoint directory")
    p.add_argument("--trigger-ms", type=int, default=1000, help="micro-batch interval in ms (1000)")
    return p.parse_args()


class HighestSeqWins:
    """The ``foreachBatch`` function: per row, the change with the highest seq, merged once per batch."""

    def __init__(self, table: Path, checkpoint: Path) -> None:
        self.table = table
        self.checkpoint = checkpoint

    def app_id(self) -> str:
        """The streaming query's id, as Spark's Delta sink uses it (Spark writes it before the first batch)."""
        return str(json.loads((self.checkpoint / "metadata").read_text().splitlines()[0])["id"])

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Apply one micro-batch."""
        app_id = self.app_id()
        exists = (self.table / "_delta_log").is_dir()
        done = DeltaTable(str(self.table)).transaction_version(app_id) if exists else None
        if done is not None and done >= batch_id:
            return  # replayed after a crash: this batch is in the table already
        changes: dict[tuple[str, int], dict[str, Any]] = {}
        for record in batch.select("value").collect():
            for change in _changes(record["value"]):
                key = (change["session"], change["row_id"])
                if key not in changes or change["seq"] > changes[key]["seq"]:
                    changes[key] = change
        if not changes:
            return  # nothing to write; a replay of an empty batch has nothing to repeat either
        now = int(time.time() * 1000)
        rows = [{**c, "committed_ms": now} for c in changes.values()]
        source = pa.Table.from_pylist(rows, schema=SCHEMA)
        commit = CommitProperties(app_transactions=[Transaction(app_id, batch_id)])
        if not exists:
            write_deltalake(str(self.table), source, mode="append", commit_properties=commit)
            return
        (
            DeltaTable(str(self.table))
            .merge(
                source,
                predicate="t.session = s.session AND t.row_id = s.row_id",
                source_alias="s",
                target_alias="t",
                commit_properties=commit,
            )
            .when_matched_update_all(predicate="s.seq > t.seq")
            .when_not_matched_insert_all()
            .execute()
        )


def _changes(value: bytes | None) -> list[dict[str, Any]]:
    """The row changes one message makes (none for a message that is not valid)."""
    try:
        msg = json.loads(value or b"")
        kind, session, sensor, seq = msg["kind"], msg["session"], msg["sensor"], msg["seq"]
    except (ValueError, KeyError, TypeError):
        return []  # a team would quarantine it; the tables contract has no place for it
    if not isinstance(seq, int):
        return []

    def change(row: dict[str, Any], deleted: bool) -> dict[str, Any]:
        values = None if deleted else json.dumps({k: v for k, v in row.items() if k != "id"}, sort_keys=True)
        return {
            "session": session,
            "sensor": sensor,
            "row_id": row["id"],
            "values": values,
            "seq": seq,
            "deleted": deleted,
        }

    if kind == "snapshot":
        return [change(row, False) for row in msg["rows"]]
    if kind == "update":
        return [change(msg["row"], msg.get("op") == "delete")]
    return []


def main() -> None:
    """Run until SIGTERM or Ctrl-C, then stop the query cleanly."""
    args = parse_args()
    from pipeline.spark import build_session  # a local session with the sotw-kafka source registered

    spark = build_session(app_name="delta-pipeline")
    stream = (
        spark.readStream.format("sotw-kafka")  # Spark's own connector: .format("kafka"), the same options
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribePattern", args.topics)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(HighestSeqWins(args.out, args.checkpoint))
        .option("checkpointLocation", str(args.checkpoint))
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set() and not query.awaitTermination(0.5):
        pass
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
