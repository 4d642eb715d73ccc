r"""A small correct streaming job: each session's current rows in a Delta table, exactly once.

What makes it correct where ``naive_pipeline.py`` is not: every row remembers the ``seq`` of the message
that set it, and a message changes a row only if its ``seq`` is higher, so a delayed message or a copy sent
again cannot bring an old value back, whatever order they arrive in. A delete is kept as a tombstone
(``deleted = true``, with its ``seq``) for the same reason: an older upsert arriving after it must not bring
the row back. A snapshot is the row's value at seq 0.

It is written as teams write such a job: Spark's Kafka connector (``format("kafka")``), the messages parsed
with ``from_json``, and in ``foreachBatch`` one Delta Lake ``MERGE`` per micro-batch (``DeltaTable.merge``,
Delta's Spark writer). The merge carries the streaming query's id and the batch id as Delta's transaction
identifier (``spark.databricks.delta.write.txnAppId`` / ``txnVersion``): after a crash Spark replays the
batch, Delta sees that transaction in the table and skips it, so every batch lands exactly once. Rows carry
``committed_ms`` (when the batch was merged), which the harness measures end-to-end latency against (a MERGE
rewrites whole files, so the commit that wrote a row's file is not always the one that changed the row).

It writes sotw's tables contract (docs/own-pipeline.md): ``session``, ``sensor``, ``row_id``, ``values``
(the row as JSON), ``seq``, ``deleted``, ``committed_ms``. It imports nothing from sotw; Spark needs the
Kafka connector's and Delta's jars, which sotw's environment has (docs/own-pipeline.md, "Jars"). Run it
under the harness::

    sotw run --profile smoke --contract tables --format delta --pipeline-cmd \\
      '{python} examples/delta_pipeline.py --bootstrap {bootstrap} --topics {pattern} --out {output} \\
       --checkpoint {checkpoint} --trigger-ms {trigger_ms} --spark-options {spark_options}'

``--spark-options FILE`` (the harness's ``{spark_options}``) adds the cluster's settings (SASL, TLS) as Spark's
Kafka connector takes them: a JSON object of ``kafka.``-prefixed options, read from a file rather than the
command line, where ``ps`` would show a password. Without it the job reads a plaintext cluster.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

TABLE = "session STRING, sensor STRING, row_id BIGINT, values STRING, seq BIGINT, deleted BOOLEAN, committed_ms BIGINT"
# A row object stays JSON text: from_json keeps a nested object as its JSON when the schema says STRING.
# (An end message's ``rows`` is a count, not an array: it does not parse, and ends change no row anyway.)
MESSAGE = "kind STRING, session STRING, sensor STRING, seq BIGINT, op STRING, row STRING, rows ARRAY<STRING>"


def parse_args() -> argparse.Namespace:
    """The job's flags (the harness fills them in from its --pipeline-cmd template)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap address")
    p.add_argument("--topics", required=True, help="topic regex")
    p.add_argument("--out", type=Path, required=True, help="the Delta table")
    p.add_argument("--checkpoint", type=Path, required=True, help="Spark checkpoint directory")
    p.add_argument("--trigger-ms", type=int, default=1000, help="micro-batch interval in ms (1000)")
    p.add_argument(
        "--spark-options",
        type=Path,
        default=None,
        help="JSON file of kafka.-prefixed Kafka connector options",
    )
    return p.parse_args()


def changes(batch: Any) -> Any:
    """The row changes of a micro-batch of Kafka records: per (session, row), the one with the highest seq."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    msg = batch.select(F.from_json(F.col("value").cast("string"), MESSAGE).alias("m")).select("m.*")
    msg = msg.where(F.col("session").isNotNull() & F.col("sensor").isNotNull() & F.col("seq").isNotNull())
    snapshots = msg.where(F.col("kind") == "snapshot").select(
        "session", "sensor", "seq", F.explode("rows").alias("row"), F.lit(False).alias("deleted")
    )
    updates = msg.where((F.col("kind") == "update") & F.col("row").isNotNull()).select(
        "session", "sensor", "seq", "row", (F.col("op") == "delete").alias("deleted")
    )
    rows = snapshots.unionByName(updates).select(
        "session",
        "sensor",
        F.get_json_object("row", "$.id").cast("bigint").alias("row_id"),
        F.when(~F.col("deleted"), F.col("row")).alias("values"),
        "seq",
        "deleted",
    )
    newest = Window.partitionBy("session", "row_id").orderBy(F.col("seq").desc())
    return (
        rows.where(F.col("row_id").isNotNull())
        .withColumn("n", F.row_number().over(newest))
        .where("n = 1")
        .drop("n")
    )


class HighestSeqWins:
    """The ``foreachBatch`` function: per row, the change with the highest seq, merged once per batch."""

    def __init__(self, table: Path, checkpoint: Path) -> None:
        self.table = str(table)
        self.checkpoint = checkpoint

    def app_id(self) -> str:
        """The streaming query's id (Spark writes it into the checkpoint before the first batch).

        A new checkpoint is a new query id, so a table kept across a checkpoint reset is not mistaken for
        holding the new query's batches (Delta's own advice for ``txnAppId``).
        """
        return str(json.loads((self.checkpoint / "metadata").read_text().splitlines()[0])["id"])

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Merge one micro-batch into the table, unless Delta says this batch was merged already."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        spark = batch.sparkSession
        source = changes(batch).withColumn("committed_ms", F.lit(int(time.time() * 1000)))
        # Idempotent MERGE: Delta records (app id, batch id) in the commit and skips a batch it has seen.
        spark.conf.set("spark.databricks.delta.write.txnAppId", self.app_id())
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        (
            DeltaTable.forPath(spark, self.table)
            .alias("t")
            .merge(source.alias("s"), "t.session = s.session AND t.row_id = s.row_id")
            .whenMatchedUpdateAll(condition="s.seq > t.seq")
            .whenNotMatchedInsertAll()
            .execute()
        )


def main() -> None:
    """Run until SIGTERM or Ctrl-C, then stop the query cleanly."""
    args = parse_args()
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    # Spark's Kafka connector and Delta are jars: spark-submit --jars (or spark.jars) gives them, or the
    # Spark installation has them already (sotw's environment does). Delta also needs its SQL extension.
    spark = (
        SparkSession.builder.appName("delta-pipeline")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # Small machines, small batches: Spark shuffles into 200 partitions and Delta rebuilds its table state
        # with 50 tasks by default, seconds per micro-batch on two cores for a few thousand rows.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .getOrCreate()
    )
    DeltaTable.createIfNotExists(spark).location(str(args.out)).addColumns(
        StructType.fromDDL(TABLE)
    ).execute()
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribePattern", args.topics)
        .option("startingOffsets", "earliest")
        # The cluster's security settings (kafka.security.protocol, kafka.sasl.jaas.config, ...), if any.
        .options(**(json.loads(args.spark_options.read_text()) if args.spark_options else {}))
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
