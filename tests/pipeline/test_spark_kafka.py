"""The reference pipeline on Spark's own Kafka connector (``--source spark-kafka``), checked against sotw's source.

Both sources read the same topics in the same session; everything the pipeline writes must be the same row for
row (batch ids and times aside), under every policy, after a kill -9, and the data-loss rules must hold as
Spark's connector applies them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from pipeline import query
from pipeline.config import PipelineConfig
from pipeline.errors import IntegrityStopped, PipelineError
from pipeline.progress import input_messages
from pipeline.sinks import committed_batches
from simulator import FaultConfig
from sotw.kafka import topic_pattern
from tests.pipeline.test_pipeline import (
    canon,
    check_a_strict_stop_is_committed_and_stops_a_restart_again,
    kill_mid_run_then_drain,
    ledger,
    pipeline_config,
    rows_of,
    sessions_out,
    truth_sessions,
)

DATASETS = ("changes", "sessions", "integrity", "dead_letters")
FAULTS = FaultConfig(gap=0.01, duplicate=0.02, malformed=0.01, delayed=0.03, delay_ms=20, delay_max_ms=100)


def outputs(cfg: PipelineConfig) -> dict[str, list[tuple]]:
    return {name: canon(rows_of(cfg.output, name)) for name in DATASETS}


def on_both_sources(spark, cfg: PipelineConfig) -> tuple[PipelineConfig, PipelineConfig]:
    """Run ``cfg`` once on each source, each with its own output and checkpoint; (sotw-kafka, spark-kafka)."""
    done = []
    for source in ("sotw-kafka", "spark-kafka"):
        where = cfg.output.parent / source
        mine = replace(cfg, source=source, output=where / "output", checkpoint=where / "checkpoint")
        query.run(spark, mine)
        done.append(mine)
    return done[0], done[1]


def test_a_fault_free_run_on_spark_s_connector_is_rebuilt_exactly_with_its_own_lag_metrics(
    spark, kafka, simulate, tmp_path
):
    summary, config = simulate(sensors=3, rows=30, duration_s=1.5, session_interval_s=0.5, partitions=2)
    cfg = replace(pipeline_config(kafka, config.topic_prefix, tmp_path), source="spark-kafka")
    query.run(spark, cfg)

    truth = {s: t for s, t in truth_sessions(summary.run_dir).items() if t["status"] == "ended"}
    out = sessions_out(cfg.output)
    assert len(truth) >= 6 and set(out) == set(truth)
    for session, t in truth.items():
        assert (out[session]["status"], out[session]["digest"]) == ("ok", t["digest"]), out[session]
    progress = [json.loads(line) for line in cfg.progress_file.read_text().splitlines()]
    assert [p["batchId"] for p in progress] == committed_batches(cfg.output)
    delivered = sum(1 for r in ledger(summary.run_dir) if r["delivered"])
    assert sum(input_messages(p) for p in progress) == delivered
    # Spark's connector reports its lag itself, as sotw's listener fills it in for the Python source.
    last = progress[-1]["sources"][0]
    assert last["description"].startswith("KafkaV2") and last["metrics"]["maxOffsetsBehindLatest"] == "0"
    # The checkpoint holds Spark's offset JSON, which the harness reads the lag from.
    offsets = (cfg.checkpoint / "offsets" / str(progress[-1]["batchId"])).read_text().splitlines()
    positions = json.loads(offsets[-1])
    assert set(positions) == {f"{config.topic_prefix}{i:04d}" for i in range(3)}


@pytest.mark.parametrize(
    ("policy", "args"),
    [
        ("ordered", {}),
        pytest.param("once", {}, marks=pytest.mark.slow),
        pytest.param("window", {"window_messages": 5}, marks=pytest.mark.slow),
        pytest.param("none", {}, marks=pytest.mark.slow),
    ],
)
def test_every_policy_writes_the_same_output_on_both_sources_under_faults(
    spark, kafka, simulate, tmp_path, policy, args
):
    summary, config = simulate(sensors=3, rows=20, duration_s=1.5, partitions=2, faults=FAULTS, seed=13)
    faults = {r["fault"] for r in ledger(summary.run_dir)}
    assert {"gap", "duplicate", "malformed", "delayed"} <= faults
    ours, spark_s = on_both_sources(
        spark, pipeline_config(kafka, config.topic_prefix, tmp_path, policy, **args)
    )

    mine, theirs = outputs(ours), outputs(spark_s)
    assert mine["sessions"] and mine["integrity"] and mine["dead_letters"]
    for name in DATASETS:
        assert theirs[name] == mine[name], name


def test_strict_stops_at_the_same_message_on_both_sources(spark, kafka, simulate, tmp_path):
    # One sensor: with two, each task meets its own sensor's first gap and either may stop the query first.
    summary, config = simulate(sensors=1, rows=20, duration_s=1.0, partitions=1, faults=FaultConfig(gap=0.02))
    assert any(r["fault"] == "gap" for r in ledger(summary.run_dir))
    cfg = pipeline_config(kafka, config.topic_prefix, tmp_path, "strict")
    messages = []
    for source in ("sotw-kafka", "spark-kafka"):
        where = tmp_path / source
        with pytest.raises(IntegrityStopped) as stopped:
            query.run(spark, replace(cfg, source=source, output=where / "o", checkpoint=where / "c"))
        messages.append(str(stopped.value))
    assert messages[0] == messages[1] and "strict policy: gap in session" in messages[0]


def test_a_strict_stop_on_spark_s_connector_commits_its_violation_and_a_restart_stops_there_again(
    spark, kafka, unique_prefix, tmp_path
):
    check_a_strict_stop_is_committed_and_stops_a_restart_again(
        spark, kafka, unique_prefix, tmp_path, source="spark-kafka"
    )


@pytest.mark.slow  # make test kills spark-kafka in a verified run (tests/loadtest/test_run.py); this compares rows
def test_a_killed_pipeline_on_spark_s_connector_restarts_without_losing_or_repeating_output(
    spark, kafka, simulate, tmp_path
):
    summary, config = simulate(sensors=4, rows=40, duration_s=4.0, rate=3000.0, partitions=2, seed=21)
    reference = pipeline_config(kafka, config.topic_prefix, tmp_path / "reference")
    query.run(spark, reference)  # sotw's own source, uninterrupted

    where = tmp_path / "killed"
    argv = [
        sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap,
        "--pattern", topic_pattern(config.topic_prefix), "--source", "spark-kafka",
        "--output", str(where / "output"), "--checkpoint", str(where / "checkpoint"),
        "--max-offsets-per-trigger", "1500", "--trigger", "200ms", "-q",
    ]  # fmt: skip
    commits = where / "output" / "_commits"
    kill_mid_run_then_drain(argv, lambda: len(list(commits.glob("*.json"))) >= 3)

    assert len(committed_batches(where / "output")) > 3
    for name in DATASETS:
        assert canon(rows_of(where / "output", name)) == canon(rows_of(reference.output, name)), name


def test_records_deleted_before_spark_s_connector_read_them_stop_the_query_unless_fail_on_data_loss_is_off(
    spark, kafka, simulate, tmp_path
):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    summary, config = simulate(sensors=1, rows=10, duration_s=1.0, partitions=1)
    cfg = replace(pipeline_config(kafka, config.topic_prefix, tmp_path), source="spark-kafka")
    query.run(spark, cfg)
    before = outputs(cfg)
    # More records arrive while the pipeline is stopped, and retention removes them before it comes back.
    topic = f"{config.topic_prefix}0000"
    simulate(sensors=1, rows=10, duration_s=1.0, partitions=1, topic_prefix=config.topic_prefix, seed=8)
    admin = AdminClient(kafka.client())
    (future,) = admin.delete_records([TopicPartition(topic, 0, -1)], operation_timeout=10).values()
    low = future.result(10).low_watermark
    assert low > 0

    with pytest.raises(PipelineError) as lost:
        query.run(spark, cfg)
    message = str(lost.value)
    assert "Kafka data lost" in message and topic in message and "failOnDataLoss" in message, message
    assert outputs(cfg) == before  # nothing of the failed batch became visible

    query.run(spark, replace(cfg, fail_on_data_loss=False))
    assert outputs(cfg) == before  # everything after the old position was deleted: nothing new to write
    last = max(int(p.name) for p in (cfg.checkpoint / "offsets").iterdir() if p.name.isdigit())
    assert json.loads((cfg.checkpoint / "offsets" / str(last)).read_text().splitlines()[-1])[topic] == {
        "0": low
    }
