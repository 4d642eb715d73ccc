"""Process-tree CPU and memory, and this process's threads, read from /proc."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from sotw.procstats import cpu_by_kind, kind_of, read_tree, rss_by_kind, thread_cpu, thread_names


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (
            [
                "/usr/bin/java",
                "-Xmx512m",
                "-XX:+UseG1GC",
                "-cp",
                "/x/jars/kafka/*",
                "kafka.Kafka",
                "node.properties",
            ],
            "broker",
        ),
        (["/usr/lib/jvm/bin/java", "-cp", "spark.jar"], "jvm"),
        (["python", "-m", "pyspark.daemon"], "python_workers"),
        (["python", "-m", "pyspark.sql.streaming.python_streaming_source_runner"], "python_source_planner"),
        (["python", "-m", "sotw", "pipeline"], "driver_python"),
    ],
)
def test_each_part_of_the_system_is_told_apart_by_its_command_line(cmdline: list[str], kind: str) -> None:
    assert kind_of(cmdline) == kind


def test_a_child_s_cpu_and_memory_count_in_its_parent_s_tree() -> None:
    busy = (
        "import time\nx = bytearray(50_000_000)\nend = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\nprint('ready', flush=True)\ntime.sleep(60)"
    )
    before = read_tree(kinds=True)
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        after = read_tree(kinds=True)
    finally:
        child.kill()
        child.wait()
    assert child.pid in after and child.pid not in before
    assert after[child.pid].rss > 50_000_000
    assert cpu_by_kind(before, after)["driver_python"] >= 0.3
    assert sum(rss_by_kind(after).values()) == sum(r.rss for r in after.values())
    assert read_tree(children=False).keys() == {next(iter(after))}


def test_threads_are_named_as_python_knows_them_and_their_cpu_is_their_own() -> None:
    spun, done = threading.Event(), threading.Event()

    def work() -> None:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        spun.set()
        done.wait()

    worker = threading.Thread(target=work, name="test-worker")
    worker.start()
    try:
        assert spun.wait(30)
        tid = worker.native_id
        assert tid is not None
        assert thread_names()[tid] == "test-worker"
        assert thread_cpu()[tid] == pytest.approx(0.2, abs=0.06)
    finally:
        done.set()
        worker.join()
