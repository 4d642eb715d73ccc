"""The stateful step in Spark: group Kafka records by session and run the policy's processor on each group.

``reconstruct`` is a plain DataFrame -> DataFrame function. All the rules live in ``pipeline.processor`` and
``pipeline.policies`` (pure, unit-tested); this module only moves data between Spark's pandas batches and envelopes, keeps each
session's state as one binary column, and sets the processing-time timeout that closes quiet sessions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from itertools import repeat
from typing import Any
from uuid import uuid4

import pandas as pd

from pipeline.errors import IntegrityViolation, PipelineError
from pipeline.gcpause import gc_paused
from pipeline.placement import slot
from pipeline.policies import PolicyConfig
from pipeline.processor import SessionProcessor
from pipeline.records import BLOCK_DDL, Records, with_every_column
from pipeline.sinks import STAGING, WRITTEN_DDL, write_records
from pipeline.state import Envelope, SessionState

log = logging.getLogger(__name__)

# The session's whole state is one pickled blob: Spark stores it as is, and its format stays ours.
STATE_DDL = "`state` binary"
# Processing-time timeouts make Spark run a no-data micro-batch at every trigger (so that quiet sessions expire
# even when nothing arrives); with ``trigger(availableNow=True)`` that means the query never finishes. Queries
# with that trigger must be started with this setting "false": timeouts then fire in the next batch with data.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
# Columns handed to the state function: one row per key and partition with the messages as arrays (the
# ``packRecords`` rows of the sotw-kafka source; Spark's own Kafka rows are wrapped into one-element arrays).
INPUT_COLUMNS = ("key", "topic", "partition", "offsets", "values", "timestamps")
# Spark's local property with the micro-batch a task belongs to (``MicroBatchExecution.BATCH_ID_KEY``).
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _timestamps(stamps: Any) -> list[Any]:
    """Kafka timestamps as ints, None where the source gave none (Arrow to numpy turns such arrays to floats)."""
    dtype = getattr(stamps, "dtype", None)
    if dtype is not None and dtype.kind in "iu":
        return list(stamps.tolist())
    items = stamps.tolist() if hasattr(stamps, "tolist") else list(stamps)
    return [None if v is None or v != v else int(v) for v in items]


def envelopes_of(pdf: pd.DataFrame) -> list[Envelope]:
    """The messages of a pandas batch of ``INPUT_COLUMNS`` rows as envelopes, in the order they are packed."""
    out: list[Envelope] = []
    make = Envelope._make
    for key, topic, partition, offsets, values, stamps in zip(
        pdf["key"].tolist(),
        pdf["topic"].tolist(),
        pdf["partition"].tolist(),
        pdf["offsets"],
        pdf["values"],
        pdf["timestamps"],
        strict=True,
    ):
        offs = offsets.tolist() if hasattr(offsets, "tolist") else list(offsets)
        n = len(offs)
        out.extend(
            map(make, zip(repeat(topic, n), repeat(int(partition), n), offs, repeat(key, n),
                          list(values), _timestamps(stamps), strict=True))
        )  # fmt: skip
    return out


class SessionFunction:
    """The ``applyInPandasWithState`` function; a class so Spark pickles the policy, not a closure.

    Parameters
    ----------
    policy
        The run's integrity policy and timeouts.
    output
        The output root whose batch staging directories the records are written to (``WRITTEN_DDL`` rows come
        back); None hands the records back as blocks instead (``BLOCK_DDL``).
    """

    def __init__(self, policy: PolicyConfig, output: str | None = None) -> None:
        self.policy = policy
        self.output = output
        self._processor: SessionProcessor | None = None
        self._files = 0
        self._token = uuid4().hex[:12]

    def __getstate__(self) -> dict[str, Any]:
        return {"policy": self.policy, "output": self.output}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Spark unpickles the function once per pass over a task's groups: the pass over groups with new data
        # and the pass over timed-out groups run in the same task with copies of their own. Each copy numbers
        # its files under a token of its own, so two passes writing for the same sensor never pick one name.
        self.policy = state["policy"]
        self.output = state["output"]
        self._processor = None
        self._files = 0
        self._token = uuid4().hex[:12]

    def __call__(
        self, key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        """Process one session's rows of this micro-batch (or its timeout) and update its Spark state."""
        # The group's envelopes and records die with ``_step``'s frame, before the collector is back on, so the
        # collection that follows does not walk them.
        with gc_paused():
            out = self._step(batches, state)
        if out is not None:
            yield out

    def _step(self, batches: Iterator[pd.DataFrame], state: Any) -> pd.DataFrame | None:
        """The group's output rows (its records or files, and counts), or None if it consumed and emitted nothing."""
        if self._processor is None:
            self._processor = SessionProcessor(self.policy)
        processor = self._processor
        now_ms = int(state.getCurrentProcessingTimeMs())
        consumed = 0
        if state.hasTimedOut:
            new, records = processor.expire(SessionState.from_bytes(state.get[0]), now_ms)
        else:
            envelopes: list[Envelope] = []
            for pdf in batches:
                if len(pdf):
                    envelopes.extend(envelopes_of(pdf))
            consumed = len(envelopes)
            old = SessionState.from_bytes(state.get[0]) if state.exists else None
            try:
                new, records = processor.apply(old, envelopes, now_ms)
            except IntegrityViolation as stop:
                if self.output is None or stop.records is None:
                    raise
                # The strict policy stops here. The session's records of the batch before the stop and the
                # violation's own record are written like any output; the driver publishes the batch, then
                # fails the query (``OutputWriter``), so Spark never commits this batch, and the session's
                # state is left as it was: a restart replays the batch from it.
                stop.records.integrity(stop.record)
                return self._write(stop.records, consumed, now_ms, stop)
        if new is None:
            if state.exists:
                state.remove()
        else:
            state.update((new.to_bytes(),))
            state.setTimeoutDuration(max(1, new.deadline_ms - now_ms))
        if not (len(records) or consumed):
            return None
        if self.output is not None:
            return self._write(records, consumed, now_ms)
        block = records.to_block() if len(records) else None
        return pd.DataFrame({"block": [block], "rows": [len(records)], "messages": [consumed]})

    def _write(
        self, records: Records, consumed: int, processed_ms: int, stop: IntegrityViolation | None = None
    ) -> pd.DataFrame:
        """Write the records into this batch's staging directory; one row per file, one with the counts.

        ``processed_ms`` is Spark's batch timestamp (``getCurrentProcessingTimeMs``): the same in every task of
        the batch, and again when the batch is replayed after a crash. ``stop``, the strict policy's stop of
        the session, goes to the driver on the counts row (``WRITTEN_DDL``'s ``stop``).
        """
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch = None if ctx is None else ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if ctx is None or batch is None:
            raise PipelineError("records can be written only inside a streaming query's micro-batch")
        files: list[tuple[str, str, int]] = []
        if len(records):
            self._files += 1
            files = write_records(
                with_every_column(records.to_arrow()),
                f"{self.output}/{STAGING}/{batch}",
                f"p{ctx.partitionId()}-t{ctx.taskAttemptId()}-{self._token}-g{self._files}.parquet",
                int(batch),
                processed_ms,
            )
        return pd.DataFrame(
            {
                "dataset": [None, *(f[0] for f in files)],
                "path": [None, *(f[1] for f in files)],
                "rows": [0, *(f[2] for f in files)],
                "messages": [consumed, *(0 for _ in files)],
                "processed_ms": [processed_ms] * (len(files) + 1),
                "stop": [None if stop is None else json.dumps(stop.as_dict()), *(None for _ in files)],
            }
        )


def reconstruct(df: Any, policy: PolicyConfig, partitions: int, output: str | None = None) -> Any:
    """Rebuild every session's table from a Kafka-shaped streaming DataFrame, under ``policy``.

    Parameters
    ----------
    df
        Rows with Spark's Kafka schema (``key``, ``value``, ``topic``, ``partition``, ``offset``,
        ``timestamp``; other columns are ignored), or the sotw-kafka source's packed rows (``key``,
        ``topic``, ``partition``, ``offsets``, ``values``, ``timestamps``).
    policy
        The integrity policy and the session timeout.
    partitions
        The partition count the placement slots are computed with (``placement.placement_partitions``);
        sessions are spread over the state partitions by sensor (``pipeline.placement``).
    output
        The output root (``pipeline.sinks.OutputWriter``'s): each group's records are written to Parquet
        right where they are made, into the micro-batch's staging directory, and only the files' names come
        back; a strict stop is written the same way (the session's records before it and the violation's
        record) and reported to the driver, which fails the query once the batch is published. None returns
        the records themselves, and a strict stop fails the task with its ``IntegrityViolation``.

    Returns
    -------
    DataFrame
        With ``output``: ``pipeline.sinks.WRITTEN_DDL`` rows, per session and micro-batch one with the
        messages it consumed (and the strict policy's stop, if it stopped the session) and one per file it
        wrote, for ``OutputWriter`` to publish. Without: record
        blocks (``pipeline.records.BLOCK_DDL``), per session and micro-batch the flat records of
        ``docs/pipeline-outputs.md`` (``record`` = change, session, integrity or dead_letter) as one Arrow
        block, in append mode.

    Notes
    -----
    Rows are grouped by the raw Kafka key (the session id; a null key goes to the empty key's group, where
    every message is a dead letter, one group per slot) and the key's placement slot
    (``pipeline.placement``), which depends on the key, the topic and ``partitions`` only. Spark does not
    keep Kafka's order within a group, so the processor sorts by (topic, partition, offset) before applying
    anything.
    """
    from pyspark.sql.streaming.state import GroupStateTimeout

    return group_sessions(df, partitions).applyInPandasWithState(
        SessionFunction(policy, output),
        outputStructType=BLOCK_DDL if output is None else WRITTEN_DDL,
        stateStructType=STATE_DDL,
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )


def group_sessions(df: Any, partitions: int) -> Any:
    """``df``'s messages as ``INPUT_COLUMNS`` rows grouped by (session, placement slot): ``reconstruct``'s input.

    Takes either row shape ``reconstruct`` takes; see its notes for the grouping.
    """
    from pyspark.sql import functions as F

    packed = "values" in df.columns
    if packed:
        messages = [F.col(name) for name in INPUT_COLUMNS[3:]]
    else:
        messages = [
            F.array(F.col("offset")).alias("offsets"),
            F.array(F.col("value")).alias("values"),
            F.array(F.unix_millis(F.col("timestamp"))).alias("timestamps"),
        ]
    group_key = F.coalesce(F.col("key"), F.lit(bytearray()))
    prepared = df.select(
        group_key.alias("group_key"),
        # One row per message (Spark's connector): the slot's compiled form, see ``placement.slot``.
        slot(F.col("topic"), group_key, partitions, compiled=not packed).alias("slot"),
        F.col("key"),
        F.col("topic"),
        F.col("partition"),
        *messages,
    )
    return prepared.groupBy("group_key", "slot")
