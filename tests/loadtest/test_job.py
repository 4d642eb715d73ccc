"""Choosing the job under test: command templates, where lag is read from, and the flags that say so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loadtest.cli import _parser as harness_parser
from loadtest.cli import job_from_args
from loadtest.errors import HarnessError
from loadtest.gameday.incidents import incident_from_mapping
from loadtest.measure.lag import GroupLag, checkpoint_position
from loadtest.run.job import JobSpec, LagFrom
from loadtest.run.processes import CommandTemplate, PipelineProcessConfig
from sotw.kafka import KafkaConfig, ensure_topics

TEMPLATE = "spark-submit 'my job.py' --bootstrap {bootstrap} --topics {pattern} --out {output} --checkpoint {checkpoint}"


def test_a_template_is_filled_in_word_by_word_without_a_shell(tmp_path: Path) -> None:
    config = PipelineProcessConfig(
        "127.0.0.1:9092",
        tmp_path / "out dir",
        tmp_path / "ckpt",
        pattern="sotw-abc-.*",
        template=CommandTemplate(TEMPLATE + " --python {python}"),
    )
    argv = config.argv()
    assert argv[:2] == ["spark-submit", "my job.py"]
    assert argv[argv.index("--out") + 1] == str(tmp_path / "out dir")
    assert argv[argv.index("--topics") + 1] == "sotw-abc-.*"
    assert argv[-1] == sys.executable


def test_jars_names_the_installed_kafka_connector_and_delta_for_spark_submit(tmp_path: Path) -> None:
    from sotw.sparkjars import spark_jars

    config = PipelineProcessConfig(
        "127.0.0.1:9092",
        tmp_path / "out",
        tmp_path / "ckpt",
        template=CommandTemplate(TEMPLATE.replace("spark-submit ", "spark-submit --jars {jars} ")),
    )
    argv = config.argv()
    jars = argv[argv.index("--jars") + 1].split(",")
    assert jars == [str(p) for p in spark_jars()]
    assert any("spark-sql-kafka" in j for j in jars) and any("delta-spark" in j for j in jars)


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        (
            "job.py --bootstrap {bootstrap} --topics {pattern} --out {output} --checkpoint {ckpt}",
            r"unknown placeholder \{ckpt\}",
        ),
        (
            "job.py --bootstrap {bootstrap} --topics {pattern} --checkpoint {checkpoint}",
            r"must use \{output\}",
        ),
        ("job.py --topics {pattern} --out {output}", r"must use \{bootstrap\}, \{checkpoint\}"),
        ("job.py --bootstrap {bootstrap} --out {output} --checkpoint {checkpoint}", r"must use \{pattern\}"),
        ("job.py --bootstrap {bootstrap --topics {pattern}", "broken placeholder"),
        ("job.py '--bootstrap {bootstrap}", "cannot be split"),
        ("job.py {} {bootstrap} {pattern} {output} {checkpoint}", r"unknown placeholder \{\}"),
        ("job.py {bootstrap!r} {pattern} {output} {checkpoint}", "without a format"),
    ],
)
def test_a_bad_template_fails_before_any_load_naming_the_problem(template: str, problem: str) -> None:
    with pytest.raises(HarnessError, match=problem):
        JobSpec(command=template)


def test_a_job_that_commits_to_a_consumer_group_needs_no_checkpoint_placeholder() -> None:
    job = JobSpec(
        command="job --b {bootstrap} --t {prefix} --o {output}", lag_from=LagFrom.parse("group:team")
    )
    assert job.lag_from == LagFrom("group", "team")
    with pytest.raises(HarnessError, match="checkpoint:PATH or group:ID"):
        LagFrom.parse("offsets:x")


def test_the_flags_make_a_job_and_an_attached_job_refuses_the_drills_that_kill_it(tmp_path: Path) -> None:
    args = harness_parser("run").parse_args(
        ["--pipeline-cmd", TEMPLATE, "--contract", "tables", "--format", "delta"]
    )
    job = job_from_args(args)
    assert job is not None and (job.contract, job.format, job.attach) == ("tables", "delta", False)
    assert job_from_args(harness_parser("run").parse_args([])) is None
    with pytest.raises(HarnessError, match="--attach needs --output"):
        job_from_args(harness_parser("run").parse_args(["--attach"]))
    attached = JobSpec(attach=True, output=tmp_path, lag_from=LagFrom("group", "g"))
    kill = incident_from_mapping({"kind": "pipeline_kill", "at_s": 5}, "test")
    with pytest.raises(HarnessError, match="pipeline_kill .* --pipeline-cmd"):
        attached.check_incidents((kill,))


def write_offsets(checkpoint: Path, batch: int, *sources: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    body = "\n".join(["v1", json.dumps(meta), *sources])
    (checkpoint / "offsets" / str(batch)).write_text(body)
    (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_position_is_read_from_spark_s_own_kafka_source_entries_and_from_every_source(
    tmp_path: Path,
) -> None:
    # Spark's Kafka source writes {"topic": {"partition": offset}} per source line, as sotw's source does;
    # a query with two sources has two lines, and a source without offsets yet writes "-".
    write_offsets(tmp_path, 0, '{"a":{"0":5}}', "-")
    write_offsets(tmp_path, 1, '{"a":{"0":23,"1":45}}', '{"b":{"0":7}}', "-")
    (tmp_path / "offsets" / "2").write_text('v1\n{}\n{"a":{"0":99}}')  # planned, not committed yet

    assert checkpoint_position(tmp_path) == {("a", 0): 23, ("a", 1): 45, ("b", 0): 7}


def test_a_consumer_group_s_committed_offsets_are_its_position(kafka: KafkaConfig, unique_prefix) -> None:
    from confluent_kafka import TopicPartition

    topic = unique_prefix() + "group"
    ensure_topics(kafka, {topic: 2})
    consumer = kafka.consumer(**{"group.id": "team-job", "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 12), TopicPartition(topic, 1, 3)], asynchronous=False)
    consumer.close()

    lag = GroupLag(kafka, "team-job")
    try:
        assert lag.position([(topic, 0), (topic, 1)]) == {(topic, 0): 12, (topic, 1): 3}
    finally:
        lag.close()
