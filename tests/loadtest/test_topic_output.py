"""A job whose table is a Kafka topic (``--format topic``), judged by the same verdict rules as files.

Rows are written to a real topic by hand, as a Kafka-native job writes them (key ``SESSION/ROW_ID``, the row as
JSON, a tombstone for a delete), then read back compacted and judged; one ``sotw run`` has the plain
confluent-kafka job write its table to the run's output topic.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from loadtest.correctness.expect import read_ledger
from loadtest.correctness.latency import end_to_end_of
from loadtest.correctness.outputspec import OutputSpec
from loadtest.correctness.policies import Policy
from loadtest.correctness.topicoutput import create_output_topic
from loadtest.correctness.verify import verify_run
from loadtest.errors import HarnessError
from loadtest.reports.results import Correctness
from loadtest.run.job import JobSpec, LagFrom
from sotw.kafka import KafkaConfig
from sotw.topics import delete_topics, output_topic
from tests.loadtest.builders import SessionSpec, ledger_rows, write_run
from tests.loadtest.topic_runs import run_writing_a_topic

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "plain_kafka_job.py"
CLEAN = [(s, "none") for s in range(7)]
Record = tuple[str, dict[str, Any] | None]
TopicOf = Callable[[list[Record]], str]


def row(row_id: int, value: float, **extra: Any) -> Record:
    """Session s1's row as a job writes it to its topic: key and JSON value."""
    fields = {"session": "s1", "sensor": "0001", "row_id": row_id, "unit": "C", "value": value, **extra}
    return f"s1/{row_id}", fields


def tombstone(row_id: int) -> Record:
    return f"s1/{row_id}", None


# SessionSpec's final table: rows 1 = 50, 2 = 20, 4 = 40 (row 3 deleted at seq 4).
TRUE = [row(1, 50.0, seq=5), row(2, 20.0, seq=2), row(4, 40.0, seq=3)]


@pytest.fixture
def topic_of(kafka: KafkaConfig, unique_prefix: Callable[[], str]) -> TopicOf:
    """Write records to a new output topic (created as sotw creates it) and return its name."""

    def write(records: list[Record]) -> str:
        topic = f"{unique_prefix()}out"
        create_output_topic(kafka, topic)
        producer = Producer(kafka.client())
        for key, value in records:
            producer.produce(topic, key=key, value=None if value is None else json.dumps(value))
        assert producer.flush(30) == 0
        return topic

    return write


def judge(tmp_path: Path, kafka: KafkaConfig, topic: str) -> Correctness:
    spec = SessionSpec()
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, CLEAN), [spec])
    return verify_run(
        run, OutputSpec(tmp_path, "tables", "topic", topic=topic, kafka=kafka), Policy("ordered")
    )


def test_the_true_rows_pass_read_as_kafka_compacts_them(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    # Row 1 held an older value before its last; row 3 was written, then deleted with a tombstone.
    topic = topic_of([row(1, 10.0, seq=1), row(3, 3.0, seq=0), *TRUE, tombstone(3)])

    result = judge(tmp_path, kafka, topic)

    assert result.passed, result.reasons
    assert (result.output_format, result.sessions_exact, result.rows_expected) == ("topic", 1, 3)
    assert result.latency_source == "the output records' timestamps"


def test_a_wrong_value_is_a_wrong_row_naming_it(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    topic = topic_of([*TRUE, row(1, 10.0, seq=1)])  # an old value written last

    result = judge(tmp_path, kafka, topic)

    assert not result.passed and result.rows_wrong == 1
    (wrong,) = result.discrepancies
    assert (wrong.kind, wrong.session) == ("wrong_row", "s1") and "row 1" in wrong.detail


def test_a_missing_row_fails_naming_it(tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf) -> None:
    topic = topic_of([*TRUE, tombstone(2)])

    result = judge(tmp_path, kafka, topic)

    assert not result.passed and result.rows_lost == 1
    (missing,) = result.discrepancies
    assert (missing.kind, missing.session) == ("missing_row", "s1") and "row 2" in missing.detail


def test_a_row_not_deleted_is_an_extra_row_naming_it(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    topic = topic_of([row(3, 3.0, seq=0), *TRUE])  # the delete at seq 4 never written

    result = judge(tmp_path, kafka, topic)

    assert not result.passed and result.rows_unexpected == 1
    (extra,) = result.discrepancies
    assert (extra.kind, extra.session) == ("extra_row", "s1") and "row 3" in extra.detail


def test_an_aborted_transaction_s_rows_are_not_the_table(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    topic = topic_of(TRUE)
    producer = Producer(kafka.client(**{"transactional.id": f"t-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key="s1/1", value=json.dumps(row(1, 10.0, seq=1)[1]))
    producer.abort_transaction(30)

    assert judge(tmp_path, kafka, topic).passed


def test_committed_ms_dates_the_rows_when_the_job_gives_it(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    spec = SessionSpec()
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, CLEAN), [spec])
    topic = topic_of([(key, {**value, "committed_ms": 1_790_000_009_000}) for key, value in TRUE if value])
    output = OutputSpec(tmp_path, "tables", "topic", topic=topic, kafka=kafka)

    latencies = end_to_end_of(read_ledger(run), output)

    assert sorted(latencies["committed_ms"]) == [1_790_000_009_000] * 3


def test_every_change_in_the_topic_dates_its_message_not_only_the_final_rows(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    # A capacity search's early levels and the seconds after an incident set few final rows: their messages
    # are dated by the changes the topic still holds.
    spec = SessionSpec()
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, CLEAN), [spec])
    first = row(1, 10.0, seq=1, committed_ms=1_790_000_001_000)
    final = row(1, 50.0, seq=5, committed_ms=1_790_000_005_000)
    topic = topic_of([first, row(2, 20.0, seq=2, committed_ms=1_790_000_002_000), final])
    output = OutputSpec(tmp_path, "tables", "topic", topic=topic, kafka=kafka)

    latencies = end_to_end_of(read_ledger(run), output)

    dated = dict(zip(latencies["seq"], latencies["committed_ms"], strict=True))
    assert dated == {1: 1_790_000_001_000, 2: 1_790_000_002_000, 5: 1_790_000_005_000}


def test_a_value_that_is_not_json_is_refused_naming_its_key(
    tmp_path: Path, kafka: KafkaConfig, topic_of: TopicOf
) -> None:
    topic = topic_of(TRUE)
    producer = Producer(kafka.client())
    producer.produce(topic, key="s1/7", value=b"row 7")
    producer.flush(30)

    with pytest.raises(HarnessError, match=r"key b's1/7'.* not a JSON object"):
        judge(tmp_path, kafka, topic)


def test_the_output_topic_is_the_run_s_but_outside_its_pattern() -> None:
    assert output_topic("sotw-sensor-1a2b3c-") == "sotw-sensor-1a2b3c.tables"
    job = JobSpec(
        command="{python} job.py --bootstrap {bootstrap} --topics {pattern} --out {output_topic}",
        lag_from=LagFrom("group", "team"),
        contract="tables",
        format="topic",
    )
    assert job.topic("sotw-sensor-1a2b3c-") == "sotw-sensor-1a2b3c.tables"
    with pytest.raises(HarnessError, match="would read its own output"):
        JobSpec(contract="tables", format="topic", output_topic="sotw-sensor-1a2b3c-out").topic(
            "sotw-sensor-1a2b3c-"
        )


def test_a_topic_job_s_template_must_name_the_topic_and_may_take_bootstrap_from_its_java_config() -> None:
    with pytest.raises(HarnessError, match=r"\{output_topic\}"):
        JobSpec(
            command="java -jar job.jar --config {java_config} --input-pattern {pattern} --out {output}",
            lag_from=LagFrom("group", "team"),
            contract="tables",
            format="topic",
        )
    with pytest.raises(HarnessError, match="--contract tables"):
        JobSpec(contract="full", format="topic")
    with pytest.raises(HarnessError, match="pass --format topic"):
        JobSpec(contract="tables", output_topic="team.tables")


def test_cleanup_deletes_the_output_topic_and_the_streams_app_s_internal_topics(
    kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    prefix = unique_prefix()
    app = f"app-{uuid.uuid4().hex[:6]}"
    # Kafka Streams' internal topics, and quixstreams' (its consumer group in the role of application.id).
    mine = [
        f"{prefix}0001",
        output_topic(prefix),
        f"{app}-sessions-changelog",
        f"changelog__{app}--{prefix}0001--default",
    ]
    others = [f"{app}-orders", f"{app}x-sessions-changelog", f"changelog__{app}x--{prefix}0001--default"]
    for name in mine + others:
        create_output_topic(kafka, name)

    deleted = delete_topics(kafka, prefix, streams_apps=[app])

    assert sorted(deleted) == sorted(mine)
    left = set(AdminClient(kafka.client()).list_topics(timeout=10).topics)
    assert set(others) <= left
    delete_topics(kafka, f"{app}-orders")
    delete_topics(kafka, f"{app}x-")
    delete_topics(kafka, f"changelog__{app}x--")


def test_a_plain_consumer_writing_its_table_to_the_run_s_topic_passes_smoke(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    group = f"team-topic-job-{uuid.uuid4().hex[:8]}"
    template = (
        f"{{python}} {JOB} --bootstrap {{bootstrap}} --topics {{pattern}} --out-topic {{output_topic}} "
        f"--group {group} --mode highest-seq --kafka-config {{kafka_config}}"
    )
    run = run_writing_a_topic(tmp_path, kafka, template, group)

    assert run.results.verdict.verdict == "PASS", run.results.verdict.reasons
    c = run.results.correctness
    assert c is not None and c.output_format == "topic" and c.sessions_exact == c.sessions_judged > 0
    assert c.latency_source == "the output records' timestamps"
    assert output_topic(run.prefix) not in run.topics_left  # --cleanup deleted it with the run's
