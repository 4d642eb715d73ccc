"""The progress log: one JSON line per trigger that did something, and few for triggers that did nothing."""

from __future__ import annotations

import json

from pipeline.progress import ProgressLog


def progress(batch: int, rows: int = 0, updated: int = 0) -> str:
    return json.dumps(
        {
            "name": "q",
            "batchId": batch,
            "numInputRows": rows,
            "stateOperators": [{"numRowsUpdated": updated, "numRowsRemoved": 0, "numRowsTotal": 3}],
            "sources": [],
        }
    )


def test_idle_triggers_are_recorded_once_a_minute_and_busy_ones_always(tmp_path):
    path = tmp_path / "progress.jsonl"
    seen: list[dict] = []
    log = ProgressLog(path, "q", on_progress=seen.append)
    log.record(progress(0, rows=500, updated=3))
    for batch in range(1, 50):  # a quiet stretch: the no-data batches a session timeout makes Spark run
        log.record(progress(batch))
    log.record(progress(50, updated=1))  # a session timed out: state changed without input
    log.record(progress(51, rows=20, updated=1))

    recorded = [json.loads(line)["batchId"] for line in path.read_text().splitlines()]
    assert recorded == [0, 1, 50, 51]
    assert [s["batch"] for s in seen] == recorded


def test_events_through_pyspark_s_own_bridge_are_recorded_and_the_slower_path_is_said_once(tmp_path, caplog):
    """Where PySpark does not take the listener's one-call bridge, its own event objects still get recorded."""

    class Event:  # the shape of PySpark's QueryProgressEvent: ``progress.json``
        def __init__(self, batch: int) -> None:
            self.progress = type("Progress", (), {"json": progress(batch, rows=10, updated=1)})()

    path = tmp_path / "progress.jsonl"
    log = ProgressLog(path, "q")
    with caplog.at_level("WARNING", logger="pipeline.progress"):
        log.onQueryProgress(Event(0))
        log.onQueryProgress(Event(1))
    assert [json.loads(line)["batchId"] for line in path.read_text().splitlines()] == [0, 1]
    assert [r.getMessage() for r in caplog.records] == [
        "progress listener: PySpark's own bridge in use; each event costs more py4j calls"
    ]
