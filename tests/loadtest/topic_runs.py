"""A team's job run as a user starts it, ``sotw run --format topic`` in a process of its own, for the tests of jobs
whose output is a topic (a plain consumer, the Kafka Streams example)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from loadtest.reports.results import Results
from sotw.kafka import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TopicRun:
    """What a test checks after the run: its results, the run's topic prefix and the topics left on the broker."""

    results: Results
    prefix: str
    topics_left: set[str]


def run_writing_a_topic(tmp_path: Path, kafka: KafkaConfig, template: str, group: str) -> TopicRun:
    """``sotw run --profile smoke --contract tables --format topic --cleanup`` of ``template``, lag from ``group``."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sotw", "run", "--profile", "smoke", "--run-dir", str(run_dir)]
    argv += ["--bootstrap", kafka.bootstrap, "--pipeline-cmd", template, "--cleanup"]
    argv += ["--contract", "tables", "--format", "topic", "--lag-from", f"group:{group}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert (run_dir / "results.json").is_file(), done.stderr[-3000:]
    prefix = re.search(r"the run's topics: (\S+)\*", done.stdout + done.stderr)
    assert prefix is not None
    left = set(AdminClient(kafka.client()).list_topics(timeout=10).topics)
    return TopicRun(Results.from_json(run_dir / "results.json"), prefix.group(1), left)
