"""Kafka as a Spark source without Spark's JVM connector: ``spark.readStream.format("sotw-kafka")``.

sotw's own reader of Kafka, through PySpark's Python Data Source API and confluent-kafka, and the pipeline's
default source: it hands the stateful step one packed row per session and partition instead of one per message
(docs/pipeline.md, "Kafka source", has the measurements). It mirrors Spark's Kafka connector, so the same
query runs on either (``--source spark-kafka`` swaps in ``format("kafka")``): the same options, the same rows
(``key``, ``value``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``) and the same offsets
in the checkpoint (``{"topic": {"0": 23}}``, next offset to read). Where it differs, it is on purpose: end
offsets of all partitions come from one look at the broker, many topic-partitions are packed into a few tasks,
rows reach Spark as Arrow record batches, and a vanished topic only counts as data loss when the query had
not read all of it.

One module per concern:

* ``datasource``: the ``DataSource`` Spark registers (format name, schema, which reader);
* ``options``: the options, parsed and checked at ``load()``;
* ``planning``: the driver's side, offsets per micro-batch and the tasks that read them;
* ``broker``: what the driver and the readers ask the broker (partitions, watermarks);
* ``reading``: the workers' side, exactly ``[start, end)`` of each range with one consumer;
* ``rows``: the two row schemas and the Arrow record batches built from the messages;
* ``dataloss``: which offsets are gone, and whether the query stops (``failOnDataLoss``);
* ``offsets``: the pure offset arithmetic (offset JSON, read limits, task packing, lag).

The driver-side half (planning) runs in one long-lived Python process per query; ``read`` runs in Python
workers and relies on nothing but the pickled reader and the partition it is given.
"""

from pipeline.source.dataloss import DataLossError, SourceTimeoutError
from pipeline.source.datasource import KafkaDataSource
from pipeline.source.offsets import offsets_behind
from pipeline.source.options import FORMAT, SourceOptions
from pipeline.source.reading import read_ranges
from pipeline.source.rows import PACKED_SCHEMA, SCHEMA

__all__ = [
    "FORMAT",
    "PACKED_SCHEMA",
    "SCHEMA",
    "DataLossError",
    "KafkaDataSource",
    "SourceOptions",
    "SourceTimeoutError",
    "offsets_behind",
    "read_ranges",
]
