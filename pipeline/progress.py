"""Per-trigger progress: a ``StreamingQueryListener`` that appends one JSON line per micro-batch.

The line is Spark's own progress JSON (input rows, rates, batch duration, source metrics such as lag, state
operator rows and memory) plus the memory of this process tree (driver JVM and Python workers), so the
load-test harness and a person with ``jq`` read the same numbers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from sotw.procstats import read_tree, rss_by_kind

log = logging.getLogger(__name__)


def process_tree_rss() -> dict[str, int]:
    """Resident memory in bytes of this process, its JVM child and its Python worker children."""
    by_kind = rss_by_kind(read_tree(kinds=True))
    workers = by_kind.get("python_workers", 0) + by_kind.get("python_source_planner", 0)
    return {
        "driver_python": by_kind.get("driver_python", 0),
        "jvm": by_kind.get("jvm", 0),
        "python_workers": workers,
    }


IDLE_EVERY_S = 60.0
"""An idle trigger (no input, no state change) is recorded at most this often: with a session timeout Spark
runs one every trigger, and a line each would grow the log by tens of thousands of lines a day."""

MESSAGES = "sotw_input_messages"
"""The progress field with the Kafka messages a batch consumed (``numInputRows`` counts packed rows)."""


def input_messages(progress: dict[str, Any]) -> int:
    """Kafka messages one progress record's batch consumed: sotw's count, else Spark's ``numInputRows``."""
    value = progress.get(MESSAGES)
    return int(progress.get("numInputRows", 0) if value is None else value)


def summarize(progress: dict[str, Any]) -> dict[str, Any]:
    """The handful of numbers a status line shows, from one progress record."""
    sources = progress.get("sources") or [{}]
    metrics = sources[0].get("metrics") or {}
    state = progress.get("stateOperators") or [{}]
    return {
        "batch": progress.get("batchId"),
        "input_rows": input_messages(progress),
        "input_rate": _rate(progress, "inputRowsPerSecond"),
        "processed_rate": _rate(progress, "processedRowsPerSecond"),
        "duration_ms": (progress.get("durationMs") or {}).get("triggerExecution", 0),
        "lag": int(float(metrics.get("offsetsBehindLatest", 0) or 0)),
        "state_rows": state[0].get("numRowsTotal", 0),
    }


def _rate(progress: dict[str, Any], name: str) -> float:
    """Spark's rate ``name`` in messages per second (Spark's rates count rows, which may be packed)."""
    rate = float(progress.get(name) or 0.0)
    rows = progress.get("numInputRows") or 0
    return rate * input_messages(progress) / rows if rows else rate


def _idle(progress: dict[str, Any]) -> bool:
    """Whether a trigger read nothing and changed no state (a no-data batch in which no session timed out)."""
    if progress.get("numInputRows"):
        return False
    return not any(
        op.get("numRowsUpdated") or op.get("numRowsRemoved") for op in progress.get("stateOperators") or []
    )


def _add_lag_metrics(progress: dict[str, Any]) -> None:
    """Fill each source's ``metrics`` with its lag, as Spark's Kafka source does.

    PySpark (4.2, 4.3) gives a Python source no way to report metrics itself, so the listener computes them from the
    progress' ``latestOffset`` and ``endOffset`` (see ``pipeline.source.offsets_behind``).
    """
    from pipeline.source import offsets_behind

    for source in progress.get("sources") or []:
        lag = offsets_behind(source)
        if lag is not None and not source.get("metrics"):
            source["metrics"] = {k: str(v) for k, v in lag.as_metrics().items()}


class ProgressLog(StreamingQueryListener):
    """Append each progress event of one query to ``path`` and hand a summary to ``on_progress``.

    Parameters
    ----------
    path
        JSON-lines file; appended to, so a restarted query continues the same file.
    query_name
        Only events of the query with this name are recorded (listeners see every query of the session).
    on_progress
        Called with ``summarize(progress)`` for the live status line.
    messages_of
        The Kafka messages of a batch id (``OutputWriter.messages_of``), recorded as ``sotw_input_messages``.
    """

    def __init__(
        self,
        path: Path,
        query_name: str | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        messages_of: Callable[[int], int | None] | None = None,
    ) -> None:
        self.path = path
        self.messages_of = messages_of
        self.query_name = query_name
        self.on_progress = on_progress
        self._lock = threading.Lock()
        self._bridge: Any = None
        self._idle_recorded = -IDLE_EVERY_S
        path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def _jlistener(self) -> Any:
        """The Java side of this listener (what ``spark.streams.addListener`` registers), built once.

        PySpark's own bridge rebuilds every progress event field by field over py4j before calling
        ``onQueryProgress``: dozens of calls, each resolving Java class names on the JVM's listener thread,
        about a third of the JVM's sampled time on small batches. This listener only needs Spark's progress
        JSON, so its bridge fetches that in one call and hands it to ``record``.
        """
        if self._bridge is None:
            self._bridge = _json_bridge(self)
            if self._bridge is None:
                self._bridge = super()._jlistener
        return self._bridge

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to record at start."""

    def onQueryProgress(self, event: Any) -> None:
        """Record one trigger from PySpark's event object (said once: the bridge calls ``record`` directly)."""
        if self._bridge is None:
            self._bridge = False
            log.warning("progress listener: PySpark's own bridge in use; each event costs more py4j calls")
        self.record(event.progress.json)

    def record(self, progress_json: str) -> None:
        """Record one trigger from Spark's progress JSON."""
        progress = json.loads(progress_json)
        if self.query_name is not None and progress.get("name") != self.query_name:
            return
        if _idle(progress):
            now = time.monotonic()
            if now - self._idle_recorded < IDLE_EVERY_S:
                return
            self._idle_recorded = now
        _add_lag_metrics(progress)
        if self.messages_of is not None and progress.get("batchId") is not None:
            messages = self.messages_of(int(progress["batchId"]))
            if messages is not None:
                progress[MESSAGES] = messages
        progress["sotw_memory_rss"] = process_tree_rss()
        with self._lock, self.path.open("a") as out:
            out.write(json.dumps(progress, separators=(",", ":")) + "\n")
        if self.on_progress is not None:
            try:
                self.on_progress(summarize(progress))
            except Exception:  # a status line must never take the query down
                log.exception("progress callback failed")

    def onQueryIdle(self, event: Any) -> None:
        """Idle triggers are not recorded."""

    def onQueryTerminated(self, event: Any) -> None:
        """Termination is reported by the query runner."""


def _json_bridge(listener: ProgressLog) -> Any:
    """The Java listener that hands ``listener`` Spark's progress JSON in one py4j call, or None.

    It stands on names PySpark does not promise: it overrides ``StreamingQueryListener._jlistener`` (which
    ``spark.streams.addListener`` reads), through ``SparkContext._jvm`` and the JVM's
    ``PythonStreamingQueryListenerWrapper``. Where the wrapper refuses this bridge, or a PySpark release no
    longer reads ``_jlistener``, events come through PySpark's own bridge to ``onQueryProgress`` instead (the
    same records, at a higher CPU cost per event), which says so once.
    """
    from pyspark import SparkContext

    jvm = getattr(SparkContext, "_jvm", None)
    if jvm is None:
        raise RuntimeError("start the SparkSession before adding the progress listener")
    try:
        return jvm.PythonStreamingQueryListenerWrapper(_JsonProgressBridge(listener))
    except Exception as exc:  # py4j raises its own errors for a class the JVM does not have
        log.warning(
            "progress listener: PySpark's own bridge in use (%s); each event costs more py4j calls",
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return None


class _JsonProgressBridge:
    """Implements Spark's ``PythonStreamingQueryListener`` for ``ProgressLog`` with one py4j call per event."""

    def __init__(self, log: ProgressLog) -> None:
        self.log = log

    def onQueryStarted(self, jevent: Any) -> None:
        """Nothing to record at start."""

    def onQueryProgress(self, jevent: Any) -> None:
        """Hand the progress over as Spark's own JSON."""
        self.log.record(jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:
        """Idle triggers are not recorded."""

    def onQueryTerminated(self, jevent: Any) -> None:
        """Termination is reported by the query runner."""

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
