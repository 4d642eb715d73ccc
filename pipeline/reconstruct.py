"""The stateful step in Spark: group Kafka records by session and run the policy's processor on each group.

``reconstruct`` is a plain DataFrame -> DataFrame function. All the rules live in ``pipeline.state`` (pure,
unit-tested); this module only moves data between Spark's pandas batches and envelopes, keeps each
session's state as one binary column, and sets the processing-time timeout that closes quiet sessions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pandas as pd

from pipeline.policies import PolicyConfig
from pipeline.records import output_schema
from pipeline.state import Envelope, SessionProcessor, SessionState

log = logging.getLogger(__name__)

# The session's whole state is one pickled blob: Spark stores it as is, and its format stays ours.
STATE_DDL = "`state` binary"
# Processing-time timeouts make Spark run a no-data micro-batch at every trigger (so that quiet sessions expire
# even when nothing arrives); with ``trigger(availableNow=True)`` that means the query never finishes. Queries
# with that trigger must be started with this setting "false": timeouts then fire in the next batch with data.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
# Columns handed to the state function, in this order (the envelope's fields).
INPUT_COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp_ms")


def _timestamps(series: pd.Series) -> list[Any]:
    """Kafka timestamps as ints, None where the source gave none (pandas turns such a column to floats)."""
    if not series.hasnans:
        return [int(v) for v in series.tolist()] if series.dtype.kind == "f" else series.tolist()
    return [None if v != v else int(v) for v in series.tolist()]


class SessionFunction:
    """The ``applyInPandasWithState`` function; a class so Spark pickles the policy, not a closure.

    Parameters
    ----------
    policy
        The run's integrity policy and timeouts.
    """

    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self._processor: SessionProcessor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"policy": self.policy, "_processor": None}

    def __call__(
        self, key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        """Process one session's rows of this micro-batch (or its timeout) and update its Spark state."""
        if self._processor is None:
            self._processor = SessionProcessor(self.policy)
        processor = self._processor
        now_ms = int(state.getCurrentProcessingTimeMs())
        if state.hasTimedOut:
            new, records = processor.expire(SessionState.from_bytes(state.get[0]), now_ms)
        else:
            envelopes: list[Envelope] = []
            for pdf in batches:
                if len(pdf) == 0:
                    continue
                envelopes.extend(
                    map(
                        Envelope._make,
                        zip(
                            pdf["topic"].tolist(),
                            pdf["partition"].tolist(),
                            pdf["offset"].tolist(),
                            pdf["key"].tolist(),
                            pdf["value"].tolist(),
                            _timestamps(pdf["timestamp_ms"]),
                            strict=True,
                        ),
                    )
                )
            old = SessionState.from_bytes(state.get[0]) if state.exists else None
            new, records = processor.apply(old, envelopes, now_ms)
        if new is None:
            if state.exists:
                state.remove()
        else:
            state.update((new.to_bytes(),))
            state.setTimeoutDuration(max(1, new.deadline_ms - now_ms))
        if len(records):
            yield records.to_pandas()


def reconstruct(df: Any, policy: PolicyConfig) -> Any:
    """Rebuild every session's table from a Kafka-shaped streaming DataFrame, under ``policy``.

    Parameters
    ----------
    df
        Rows with Spark's Kafka schema: ``key``, ``value`` (binary), ``topic``, ``partition``, ``offset``,
        ``timestamp`` (other columns are ignored).
    policy
        The integrity policy and the session timeout.

    Returns
    -------
    DataFrame
        The flat records of ``docs/pipeline-outputs.md`` (``record`` = change, session, integrity or
        dead_letter), in append mode; the sink adds ``batch_id`` and ``processed_ms``.

    Notes
    -----
    Rows are grouped by the raw Kafka key (the session id; a null key goes to the empty key's group, where
    every message is a dead letter). Spark does not keep Kafka's order within a group, so the processor
    sorts by (topic, partition, offset) before applying anything.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    prepared = df.select(
        F.coalesce(F.col("key"), F.lit(bytearray())).alias("group_key"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("key"),
        F.col("value"),
        F.unix_millis(F.col("timestamp")).alias("timestamp_ms"),
    )
    return prepared.groupBy("group_key").applyInPandasWithState(
        SessionFunction(policy),
        outputStructType=output_schema(),
        stateStructType=STATE_DDL,
        outputMode="append",
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout,
    )
