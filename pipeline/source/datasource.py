"""The ``sotw-kafka`` data source as Spark registers it: its format name, its rows and its two readers.

Registered by ``pipeline.spark.build_session``; options are parsed when ``load()`` is called
(``pipeline.source.options``), so a typo fails before the query starts.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from pipeline.source.options import FORMAT, SourceOptions
from pipeline.source.planning import KafkaBatchReader, KafkaStreamReader
from pipeline.source.rows import PACKED_SCHEMA, SCHEMA


class KafkaDataSource(DataSource):
    """The ``sotw-kafka`` data source: Spark's Kafka source options and rows, read with confluent-kafka.

    Registered by ``pipeline.spark.build_session``; options are checked when ``load()`` is called, so a
    typo fails before the query starts.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.from_options(options)

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.readStream.format("sotw-kafka")``."""
        return FORMAT

    def schema(self) -> StructType:
        """Spark's Kafka rows (key, value, topic, partition, offset, timestamp, timestampType), or packed rows."""
        return PACKED_SCHEMA if self.parsed.pack else SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """The micro-batch reader."""
        return KafkaStreamReader(self.parsed)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (``startingOffsets`` to ``endingOffsets``)."""
        return KafkaBatchReader(self.parsed)
