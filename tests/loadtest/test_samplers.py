"""The sampler's probes that need no broker: dating offsets, and the harness's CPU by thread."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer

from loadtest.measure.lag import AppendTimes
from loadtest.measure.samplers import ThreadCpuProbe


def test_an_offset_is_dated_between_the_two_samples_that_saw_it_appended() -> None:
    times = AppendTimes()
    times.seen(100.0, 0)
    times.seen(101.0, 1000)  # offsets 0..999 appended during that second
    times.seen(102.0, 1000)  # nothing new: the last entry stays
    times.seen(103.0, 3000)

    assert times.appended_at(0) == pytest.approx(100.001)
    assert times.appended_at(499) == pytest.approx(100.5)
    assert times.appended_at(1999) == pytest.approx(102.5)
    assert times.appended_at(3000) is None  # not appended yet


def test_an_offset_below_the_first_end_seen_is_dated_at_that_first_sample() -> None:
    times = AppendTimes()
    times.seen(50.0, 400)
    times.seen(51.0, 600)
    assert times.appended_at(10) == 50.0
    assert times.appended_at(499) == pytest.approx(50.5)


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_threads_started_with_the_simulator_count_as_its_cpu_even_after_they_end() -> None:
    probe = ThreadCpuProbe(simulator_thread="test-simulator", sampler_thread="test-sampler")
    before = probe.sample()
    started, worked, finish = threading.Event(), threading.Event(), threading.Event()
    writer_spun = threading.Event()

    def simulator() -> None:
        # Like the simulator's ledger writer and producer threads: started by it, alive while it runs.
        writer = threading.Thread(
            target=lambda: (spin(0.2), writer_spun.set(), finish.wait()), name="test-ledger-writer"
        )
        writer.start()
        started.set()
        spin(0.2)
        worked.set()
        finish.wait()
        writer.join()

    sim = threading.Thread(target=simulator, name="test-simulator")
    sim.start()
    started.wait()
    probe.sample()  # sees the simulator and its writer
    assert worked.wait(30) and writer_spun.wait(30)
    probe.sample()
    finish.set()
    sim.join()

    def sampler() -> None:
        # Like ``EndOffsets``: a Kafka client made and closed between two samples (no broker needed).
        Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "sotw-test"}).close()
        spin(0.1)
        probe.sample()

    in_sampler = threading.Thread(target=sampler, name="test-sampler")
    in_sampler.start()
    in_sampler.join()
    after = probe.sample()

    def spent(group: str) -> float:
        return after[f"threads_cpu_s_{group}"] - before[f"threads_cpu_s_{group}"]

    assert spent("simulator") == pytest.approx(0.4, abs=0.08)
    assert spent("sampler") == pytest.approx(0.1, abs=0.06)
    assert spent("other") < 0.1
    assert after["threads_cpu_s_process"] - before["threads_cpu_s_process"] >= 0.45


def test_a_file_a_job_writes_again_in_place_has_no_first_seen_time_for_its_rows(tmp_path) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loadtest.measure.outputs import FilesOutputProbe

    out, seen = tmp_path / "table", tmp_path / "seen.json"
    out.mkdir()
    pq.write_table(pa.table({"row_id": [1, 2]}), out / "once.parquet")
    pq.write_table(pa.table({"row_id": [1]}), out / "table.parquet")
    probe = FilesOutputProbe(out, seen)
    assert probe.sample() == {"written_changes": 3}
    time.sleep(0.01)
    pq.write_table(pa.table({"row_id": [1, 2, 3]}), out / "table.parquet")  # the whole table, rewritten
    assert probe.sample() == {"written_changes": 5}
    probe.close()
    # Dated by its first version, the rewritten file's rows would seem visible before they were written.
    assert set(json.loads(seen.read_text())) == {"once.parquet"}
