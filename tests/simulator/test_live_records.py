"""What another process can read while a simulation runs: closed ledger files and the sessions closed so far.

The Locust UI's live verifier reads them; a Locust worker's sensors start at an id of their own.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simulator import Simulator, SimulatorConfig, SimulatorError


def readable_ledger_rows(ledger_dir) -> int:
    """Rows in the ledger files that can be read now (the file being written cannot)."""
    rows = 0
    for path in sorted(ledger_dir.glob("*.parquet")):
        try:
            rows += pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowInvalid):
            continue
    return rows


def test_a_running_simulation_closes_ledger_files_and_writes_closed_sessions_as_it_goes(
    kafka, tmp_path, unique_prefix
):
    config = SimulatorConfig(
        sensors=3, rows=10, partitions=1, rate=1000, duration_s=60, session_interval_s=0.5,
        topic_prefix=unique_prefix(), record_every_s=0.5,
    )  # fmt: skip
    sim = Simulator(config, kafka, tmp_path / "run")
    stop = threading.Event()
    seen: dict[str, int] = {}

    def watch():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.25)
            rows = readable_ledger_rows(tmp_path / "run" / "ledger")
            closed = sorted((tmp_path / "run" / "truth" / "closed").glob("part-*.parquet"))
            if rows >= 1000 and closed:
                seen["rows"] = rows
                seen["sessions"] = sum(pq.read_metadata(p).num_rows for p in closed)
                seen["planned"] = sim.stats().planned
                break
        stop.set()

    thread = threading.Thread(target=watch)
    thread.start()
    summary = sim.run(stop)
    thread.join()
    assert seen, "no ledger rows or closed sessions were readable while the run went on"
    assert seen["rows"] < seen["planned"] + 10 and seen["sessions"] >= 1
    closed = pq.read_table(summary.run_dir / "truth" / "closed").to_pylist()
    final = {
        s["session"]: s for s in pq.read_table(summary.run_dir / "truth" / "sessions.parquet").to_pylist()
    }
    assert closed and all(final[s["session"]] == s for s in closed), "a closed part disagrees with the truth"
    assert all(s["status"] in ("ended", "abandoned") for s in closed)
    whole = pq.read_table(summary.run_dir / "ledger").num_rows
    assert whole == summary.ledger_rows and len(list((summary.run_dir / "ledger").glob("*.parquet"))) > 1


def test_sensor_ids_count_up_from_the_first_sensor_asked_for(kafka, tmp_path, unique_prefix):
    config = SimulatorConfig(
        sensors=2, rows=5, partitions=1, rate=500, duration_s=0.5, topic_prefix=unique_prefix(),
        first_sensor=10000,
    )  # fmt: skip
    summary = Simulator(config, kafka, tmp_path / "run").run()
    sensors = pq.read_table(summary.run_dir / "truth" / "sensors.parquet").column("sensor").to_pylist()
    assert sorted(sensors) == ["10000", "10001"]
    assert sorted(summary.topics) == [config.topic_prefix + "10000", config.topic_prefix + "10001"]


@pytest.mark.parametrize(("field", "value"), [("first_sensor", -1), ("record_every_s", 0)])
def test_bad_live_record_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(SimulatorError, match=field):
        SimulatorConfig(**{field: value})
