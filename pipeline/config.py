"""``PipelineConfig``: every knob of ``sotw pipeline``, built by the CLI and passed inward unchanged."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.policies import PolicyConfig
from pipeline.spark import SparkConfig
from sotw.kafka import KafkaConfig

SOURCES = ("sotw-kafka", "spark-kafka")
FORMATS = ("parquet", "delta")
_TRIGGER = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|sec|seconds?|m|min|minutes?|h|hours?)$")
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_trigger(text: str) -> int | None:
    """Turn ``"5s"``, ``"500ms"``, ``"15 minutes"`` into milliseconds; ``"availableNow"`` gives None."""
    if text.replace("-", "").replace("_", "").lower() == "availablenow":
        return None
    match = _TRIGGER.match(text.strip().lower())
    if not match:
        raise ValueError(f"trigger must be like 5s, 500ms, 15min, 1h or availableNow, got {text!r}")
    number, unit = float(match.group(1)), match.group(2)
    key = unit if unit in _UNIT_MS else unit[0]
    return int(number * _UNIT_MS[key])


@dataclass(frozen=True)
class PipelineConfig:
    """Where to read, how to rebuild, where to write.

    Parameters
    ----------
    kafka
        The cluster and librdkafka settings.
    output
        Root of the Parquet outputs (see docs/pipeline-outputs.md).
    checkpoint
        Spark checkpoint directory: offsets, state and commits. Keep it with the output it belongs to.
    pattern
        Topic regex to subscribe to (Spark's ``subscribePattern``).
    starting_offsets
        ``earliest``, ``latest`` or Spark's JSON form, for a query with no checkpoint yet.
    policy
        The integrity policy and its timeouts.
    trigger_ms
        Micro-batch interval in milliseconds; None means ``availableNow`` (drain the backlog, then stop).
    max_offsets_per_trigger
        Upper bound of records per micro-batch (None: no bound).
    fail_on_data_loss
        Stop when offsets the query still needs are gone.
    discovery_interval_ms
        How often new topics matching ``pattern`` are looked for.
    source
        ``sotw-kafka`` (sotw's Python data source) or ``spark-kafka`` (Spark's JVM connector, from the
        jars ``make setup`` fetches).
    spark
        How to start Spark.
    progress_path
        JSON-lines file of per-trigger progress; defaults to ``OUTPUT/progress.jsonl``.
    drop_batches
        Sabotage for the harness's self-test: these batch ids are committed without writing their records,
        as a buggy sink would. Never set it outside a drill.
    output_format
        ``parquet`` (Parquet directories with ``_commits`` markers) or ``delta`` (Delta tables written with
        the query's transaction identifier); see docs/pipeline-outputs.md.
    batch_delay_s
        Sabotage for the nightly benchmark's self-test: every micro-batch waits this long before its output
        is written, as a slow sink would, so its regression check must flag it. Never set it otherwise.
    storage_retry_s
        How long one outage of the checkpoint or output storage (not writable, full) may last: the query is
        started again from its checkpoint once it is writable; after this long the pipeline stops.
    state_partitions
        The state partition count the user asked for (``--shuffle-partitions``), if any: a checkpoint that
        was started with another count is refused, since its state cannot be re-split. None takes the
        checkpoint's own count (``spark.shuffle_partitions`` for a new checkpoint).
    """

    kafka: KafkaConfig
    output: Path
    checkpoint: Path
    pattern: str = "sotw-sensor-.*"
    starting_offsets: str = "earliest"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    trigger_ms: int | None = 2000
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    discovery_interval_ms: int = 5000
    source: str = "sotw-kafka"
    spark: SparkConfig = field(default_factory=SparkConfig)
    progress_path: Path | None = None
    drop_batches: frozenset[int] = frozenset()
    batch_delay_s: float = 0.0
    state_partitions: int | None = None
    storage_retry_s: float = 600.0
    output_format: str = "parquet"

    def __post_init__(self) -> None:
        if self.output_format not in FORMATS:
            raise ValueError(f"output format must be one of {', '.join(FORMATS)}, got {self.output_format!r}")
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r} is not a valid regex: {exc}") from None
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.trigger_ms is not None and self.trigger_ms < 0:
            raise ValueError(f"trigger_ms must be >= 0, got {self.trigger_ms}")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError(f"max_offsets_per_trigger must be >= 1, got {self.max_offsets_per_trigger}")
        if self.discovery_interval_ms < 0:
            raise ValueError(f"discovery_interval_ms must be >= 0, got {self.discovery_interval_ms}")
        if self.source == "spark-kafka":
            from sotw.javaconfig import JavaConfigError, java_settings

            try:  # before Spark starts: a setting the connector cannot take is named now
                java_settings(self.kafka.settings)
            except JavaConfigError as exc:
                raise ValueError(f"--source spark-kafka: {exc}") from None
        if self.output.resolve() == self.checkpoint.resolve():
            raise ValueError("output and checkpoint must be different directories")

    @property
    def progress_file(self) -> Path:
        """Where per-trigger progress is appended."""
        return self.progress_path or self.output / "progress.jsonl"

    def source_options(self) -> dict[str, str]:
        """Options for ``readStream.format(source)``, named as Spark's own Kafka source names them."""
        opts = {
            "kafka.bootstrap.servers": self.kafka.bootstrap,
            "subscribePattern": self.pattern,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
        }
        if self.source == "sotw-kafka":
            opts["topicDiscoveryIntervalMs"] = str(self.discovery_interval_ms)
            # A session's messages as one row per batch: Spark's per-row costs are paid per session, not
            # per message (see pipeline.source.PACKED_SCHEMA).
            opts["packRecords"] = "true"
        else:
            opts["kafka.metadata.max.age.ms"] = str(self.discovery_interval_ms)
        if self.max_offsets_per_trigger is not None:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.source == "sotw-kafka":  # sotw's reader is librdkafka: its settings as they are
            opts.update({f"kafka.{key}": value for key, value in self.kafka.settings.items()})
        else:  # Spark's connector is the Java client: the same settings in its names (sotw.javaconfig)
            from sotw.javaconfig import spark_options

            opts.update(spark_options(self.kafka.settings))
        return opts
