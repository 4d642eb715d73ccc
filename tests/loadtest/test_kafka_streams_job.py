"""The Kafka Streams example (examples/kafka-streams/) built by Maven and run under ``sotw run`` on the smoke profile.

It keeps each session's rows in one state store keyed by session and row, applies messages in seq order and writes its table to the
run's output topic with exactly-once v2: the verifier reads that topic (read_committed) and must PASS it. The
build needs Maven and, the first time, Maven Central; later builds run offline from ``~/.m2`` in 20-25 s on the
2-core machine (up to 65 s when it is busy), so the build is in ``make test`` and the run in the slow tests.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from sotw.kafka import KafkaConfig
from sotw.topics import output_topic
from tests.loadtest.topic_runs import run_writing_a_topic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kafka-streams"
JAR = EXAMPLE / "target" / "sotw-streams-job.jar"

pytestmark = [
    pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed"),
    pytest.mark.system,  # Maven and a JVM: not for make test-fast
]


@pytest.fixture(scope="module")
def streams_jar() -> Path:
    """The example's jar, built by ``make kafka-streams-job`` (offline first: a warm ``~/.m2`` needs no network)."""
    done = subprocess.run(
        ["make", "kafka-streams-job"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and JAR.is_file(), (done.stdout + done.stderr)[-3000:]
    return JAR


def test_the_example_builds_into_one_runnable_jar_that_names_its_options(streams_jar: Path) -> None:
    done = subprocess.run(["java", "-jar", str(streams_jar)], capture_output=True, text=True, timeout=120)

    assert done.returncode == 2
    assert "--config FILE --input-pattern REGEX --output-topic NAME --application-id ID" in done.stderr

    options = ["--config", "x", "--input-pattern", "p", "--output-topic", "t", "--application-id", "a"]
    done = subprocess.run(
        ["java", "-jar", str(streams_jar), *options, "--threads", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2
    assert "--threads needs a positive whole number, not 0" in done.stderr


@pytest.mark.slow  # a Maven build (over 60 s on the 2-core machine) and a JVM job: the nightly job runs it
def test_the_kafka_streams_job_passes_smoke_writing_its_table_to_a_topic_exactly_once(
    tmp_path: Path, kafka: KafkaConfig, streams_jar: Path
) -> None:
    app = f"team-streams-{uuid.uuid4().hex[:8]}"
    template = (
        f"java -jar {streams_jar} --config {{java_config}} --input-pattern {{pattern}} "
        f"--output-topic {{output_topic}} --application-id {app} --state-dir {{checkpoint}} --instance-id 1 "
        "--threads 2 --commit-interval-ms {trigger_ms}"
    )
    run = run_writing_a_topic(tmp_path, kafka, template, app)

    assert run.results.verdict.verdict == "PASS", run.results.verdict.reasons
    c = run.results.correctness
    assert c is not None and c.output_format == "topic" and c.sessions_exact == c.sessions_judged > 0
    assert c.latency_source == "the committed_ms column"
    # --cleanup deleted the output topic and the store's changelog with the run's topics.
    assert output_topic(run.prefix) not in run.topics_left
    assert f"{app}-sessions-changelog" not in run.topics_left
