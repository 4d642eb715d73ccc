"""The one place where the streaming query is assembled: source -> reconstruction -> exactly-once outputs.

``start_query`` wires the parts and returns the running ``StreamingQuery``; ``run`` adds what a long-running job
needs around it: the consistency check before start, the progress log, clean stop on Ctrl-C/SIGTERM, and turning
an integrity violation inside a Python worker back into one clear ``PipelineError``.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.errors import IntegrityStopped, PipelineError, StorageUnavailable
from pipeline.placement import check_state_partitions, placement_partitions
from pipeline.progress import ProgressLog
from pipeline.reconstruct import NO_DATA_BATCHES, reconstruct
from pipeline.recovery import check_consistency
from pipeline.sinks import OutputWriter

log = logging.getLogger(__name__)

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")


def read_source(spark: Any, config: PipelineConfig) -> Any:
    """The streaming DataFrame of Kafka records, from the Python data source or Spark's own connector.

    The sotw-kafka source is asked for packed rows (``packRecords``); ``reconstruct`` takes either shape.
    """
    fmt = "sotw-kafka" if config.source == "sotw-kafka" else "kafka"
    reader = spark.readStream.format(fmt)
    for key, value in config.source_options().items():
        reader = reader.option(key, value)
    df = reader.load()
    return df if "values" in df.columns else df.select(*KAFKA_COLUMNS)


def _writer(config: PipelineConfig) -> OutputWriter:
    return OutputWriter(
        config.output, config.checkpoint, config.drop_batches, output_format=config.output_format
    )


def query_name(config: PipelineConfig) -> str:
    """The streaming query's name: the output directory's, so progress events can be told apart."""
    return f"sotw-{config.output.resolve().name}"


def start_query(spark: Any, config: PipelineConfig, writer: OutputWriter | None = None) -> Any:
    """Build and start the query; the caller owns stopping it."""
    check_consistency(config.output, config.checkpoint)
    check_state_partitions(config.checkpoint, config.state_partitions)
    records = reconstruct(
        read_source(spark, config),
        config.policy,
        placement_partitions(spark, config.checkpoint),
        str(config.output.absolute()),
    )
    sink = writer or _writer(config)
    stream = (
        records.writeStream.queryName(query_name(config))
        .foreachBatch(_delayed(sink, config.batch_delay_s) if config.batch_delay_s > 0 else sink)
        .option("checkpointLocation", str(config.checkpoint))
        .outputMode("append")
    )
    if config.trigger_ms is None:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{config.trigger_ms} milliseconds")
    # Processing-time timeouts make Spark run an empty batch at every trigger. That is how quiet sessions
    # expire in a continuous run, but under availableNow it never ends: there, timeouts fire with the next
    # batch that has data. Spark reads the setting when the query starts.
    spark.conf.set(NO_DATA_BATCHES, "false" if config.trigger_ms is None else "true")
    return stream.start()


def _delayed(sink: OutputWriter, delay_s: float) -> Callable[[Any, int], None]:
    """``sink`` after a fixed wait per batch: the nightly benchmark's planted regression (``--batch-delay``)."""

    def write(batch_df: Any, batch_id: int) -> None:
        time.sleep(delay_s)
        sink(batch_df, batch_id)

    return write


# Spark's Kafka connector's data loss (``KafkaIllegalStateException``, or the ``KAFKA_DATA_LOSS`` error class): a
# paragraph whose "Reason:" line says which offsets of which partition are gone.
_SPARK_DATA_LOSS = re.compile(
    r"Some data may have been lost because they are not available in Kafka any more"
)
_SPARK_LOSS_REASON = re.compile(r"Reason: (.+?)(?:\n\s*with consumer group|\n\n|$)", re.S)
_VIOLATION = re.compile(r"(IntegrityViolation|DataLossError|PipelineError): (.+?)(?:\n|$)")
# How Java and Python name a file that cannot be written: "<path> (Operation not permitted)" and the like.
_STORAGE = re.compile(
    r"(/[^\s:()'\"]+)'? ?\(?(Operation not permitted|Permission denied|Read-only file system|"
    r"No space left on device|Disk quota exceeded)"
)


def explain_failure(exc: BaseException) -> PipelineError:
    """Turn a failed query's exception into a ``PipelineError`` carrying the worker's own message.

    A violation raised in a Python worker reaches the driver wrapped in a JVM stack trace; the user needs its
    first line (sensor, session, topic, partition, offset, expected and received seq), not the trace.
    """
    text = str(exc)
    storage = _STORAGE.search(text)
    if storage:
        path, reason = storage.groups()
        return StorageUnavailable(
            f"cannot write {path} ({reason}); the batch was not committed, so no input is skipped: the query "
            "resumes from its checkpoint once the storage takes writes again",
            path,
        )
    if "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in text:
        return PipelineError(
            "the checkpoint's state is keyed differently from this pipeline's (it was written by another query, or "
            "by a sotw from before sessions were placed by sensor): it cannot be resumed; start with a new "
            "--checkpoint and --output"
        )
    if _SPARK_DATA_LOSS.search(text):
        reason = _SPARK_LOSS_REASON.search(text)
        detail = " ".join(reason.group(1).split()).rstrip(".") if reason else "offsets the query still needs"
        return PipelineError(
            f"Kafka data lost (Spark's Kafka connector): {detail[0].lower() + detail[1:]}: they are no longer "
            "available (aged out by retention, deleted, or the topic was deleted or recreated). The query stops "
            "because failOnDataLoss is true; pass --no-fail-on-data-loss to continue from the data that still exists"
        )
    match = _VIOLATION.search(text)
    if match:
        kind, message = match.groups()
        cls = IntegrityStopped if kind == "IntegrityViolation" else PipelineError
        return cls(message.strip())
    first = next((line for line in text.splitlines() if line.strip()), text)
    return PipelineError(f"the streaming query failed: {first.strip()[:500]}")


def _stop_between_batches(query: Any, patience_s: float = 30.0) -> None:
    """Stop when no trigger is running, so a clean stop does not interrupt a batch half-way.

    An interrupted batch would be replayed after restart anyway (its output is idempotent); waiting for it
    keeps the stop quiet and the restart cheap. After ``patience_s`` the batch is interrupted.
    """
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


@dataclass
class RunResult:
    """How a pipeline run ended."""

    last_batch: int | None
    stopped_by: str  # "drained" (availableNow) or "signal"


def run(
    spark: Any,
    config: PipelineConfig,
    stop: threading.Event | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run the query until it drains (availableNow), ``stop`` is set, or it fails.

    A checkpoint or output that stops taking writes (``StorageUnavailable``) does not end the run at once:
    the query is started again from its checkpoint once the storage is writable, for up to
    ``config.storage_retry_s`` per outage, as a supervisor would restart it.

    Raises
    ------
    PipelineError
        If the query failed; ``IntegrityStopped`` when the strict policy stopped it.
    """
    stop = stop or threading.Event()
    listener = ProgressLog(config.progress_file, query_name(config), on_progress)
    spark.streams.addListener(listener)
    try:
        while True:
            try:
                return _run_query(spark, config, stop, listener)
            except StorageUnavailable as exc:
                log.warning("%s; waiting up to %g s for it", exc, config.storage_retry_s)
                _wait_writable(Path(exc.path).parent, config.storage_retry_s, stop, exc)
                log.warning("storage writable again: restarting the query from its checkpoint")
    finally:
        spark.streams.removeListener(listener)


def _wait_writable(folder: Path, patience_s: float, stop: threading.Event, cause: StorageUnavailable) -> None:
    """Return once a file can be created in ``folder`` (or it is gone); re-raise ``cause`` after ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while not stop.is_set():
        if not folder.is_dir():
            return  # a temporary directory of the failed attempt: nothing to wait for
        try:
            handle, name = tempfile.mkstemp(prefix=".sotw-probe-", dir=folder)
        except OSError:
            if time.monotonic() >= deadline:
                raise cause from None
            stop.wait(1.0)
            continue
        os.close(handle)
        os.unlink(name)
        return
    raise cause


def _run_query(spark: Any, config: PipelineConfig, stop: threading.Event, listener: ProgressLog) -> RunResult:
    """One start of the query, until it drains, ``stop`` is set, or it fails."""
    writer = _writer(config)
    listener.messages_of = writer.messages_of
    query = start_query(spark, config, writer)
    stopped_by = "drained"
    try:
        while True:
            if query.awaitTermination(0.5):
                break
            if stop.is_set():
                stopped_by = "signal"
                _stop_between_batches(query)
                break
        exc = query.exception()
        if exc is not None:
            raise explain_failure(exc)
    except Exception as exc:
        if isinstance(exc, PipelineError):
            raise
        raise explain_failure(exc) from None
    finally:
        if query.isActive:
            query.stop()
    return RunResult(last_batch=None if writer.last is None else writer.last.batch_id, stopped_by=stopped_by)
