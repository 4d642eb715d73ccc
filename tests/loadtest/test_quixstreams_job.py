"""The quixstreams example (examples/quixstreams_pipeline.py) run in its own virtualenv under ``sotw run`` on smoke.

It keeps each session's row seqs in quixstreams' state, applies messages in seq order and writes its table to
the run's output topic with quixstreams' exactly-once guarantee: the verifier reads that topic
(read_committed) and must PASS it. quixstreams 3.28 pins confluent-kafka below sotw's, so the job runs from
``build/quixstreams-venv`` (``make quixstreams-venv``), which the module's fixture makes the first time, from
PyPI; without PyPI the tests are skipped.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from sotw.kafka import KafkaConfig
from sotw.topics import output_topic
from tests.loadtest.topic_runs import run_writing_a_topic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quixstreams_pipeline.py"
PYTHON = ROOT / "build" / "quixstreams-venv" / "bin" / "python"

# What pip says when it cannot reach the index (or the index has no quixstreams 3.28): a skip, not a failure.
NO_INDEX = (
    "Could not find a version",
    "No matching distribution",
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
)

# A virtualenv of its own, made from PyPI in about 40 s: not for make test's budget.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quix_python() -> Path:
    """The example's interpreter, ``build/quixstreams-venv/bin/python``, made by ``make quixstreams-venv``."""
    done = subprocess.run(["make", "quixstreams-venv"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    if done.returncode != 0 and any(sign in output for sign in NO_INDEX):
        pytest.skip(f"PyPI is unreachable, so quixstreams 3.28 cannot be installed: {output.strip()[-300:]}")
    assert done.returncode == 0 and PYTHON.is_file(), output[-3000:]
    return PYTHON


def test_the_example_runs_in_its_own_virtualenv_and_names_its_options(quix_python: Path) -> None:
    done = subprocess.run([str(quix_python), str(EXAMPLE)], capture_output=True, text=True, timeout=120)

    assert done.returncode == 2
    assert "--bootstrap BOOTSTRAP --input-pattern" in " ".join(done.stderr.split())


def test_the_quixstreams_job_passes_smoke_writing_its_table_to_a_topic_exactly_once(
    tmp_path: Path, kafka: KafkaConfig, quix_python: Path
) -> None:
    group = f"team-quix-{uuid.uuid4().hex[:8]}"
    template = (
        f"{quix_python} {EXAMPLE} --bootstrap {{bootstrap}} --kafka-config {{kafka_config}} "
        f"--input-pattern {{pattern}} --output-topic {{output_topic}} --consumer-group {group} "
        f"--state-dir {{checkpoint}} --commit-interval-ms {{trigger_ms}} --instance-id 1"
    )
    run = run_writing_a_topic(tmp_path, kafka, template, group)

    assert run.results.verdict.verdict == "PASS", run.results.verdict.reasons
    c = run.results.correctness
    assert c is not None and c.output_format == "topic" and c.sessions_exact == c.sessions_judged > 0
    assert c.latency_source == "the committed_ms column"
    # The job kept its state in a changelog topic per sensor topic; --cleanup deleted them with the output topic.
    log = (tmp_path / "run" / "pipeline" / "pipeline.log").read_text()
    assert f"changelog__{group}--" in log, "no changelog topic: the job kept no state in Kafka"
    assert output_topic(run.prefix) not in run.topics_left
    assert not [t for t in run.topics_left if t.startswith(f"changelog__{group}--")]
