"""``sotw pipeline --format delta``: the four datasets as Delta tables, exactly once, read by delta-rs."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest
from deltalake import DeltaTable

from pipeline import query
from pipeline.checkpoint import checkpoint_batches
from pipeline.delta import compact
from pipeline.sinks import DATASETS
from simulator import FaultConfig
from sotw.kafka import topic_pattern
from tests.pipeline.test_pipeline import (
    canon,
    check_a_strict_stop_is_committed_and_stops_a_restart_again,
    kill_mid_run_then_drain,
    pipeline_config,
    rows_of,
)


def delta_rows(output, name: str) -> list[dict]:
    root = output / name
    if not (root / "_delta_log").is_dir():
        return []
    return DeltaTable(str(root)).to_pyarrow_table().to_pylist()


def test_delta_output_holds_the_same_rows_as_the_parquet_output_and_records_each_batch(
    spark, kafka, simulate, tmp_path
):
    faults = FaultConfig(gap=0.01, duplicate=0.01, delayed=0.01, malformed=0.01, abandon=0.2)
    summary, config = simulate(sensors=3, rows=30, duration_s=2.0, session_interval_s=0.5, faults=faults)
    parquet = pipeline_config(kafka, config.topic_prefix, tmp_path / "parquet")
    delta = replace(pipeline_config(kafka, config.topic_prefix, tmp_path / "delta"), output_format="delta")
    query.run(spark, parquet)
    query.run(spark, delta)

    for name in DATASETS:
        assert canon(delta_rows(delta.output, name)) == canon(rows_of(parquet.output, name)), name
    assert delta_rows(delta.output, "dead_letters") and delta_rows(delta.output, "integrity")
    # Each table records the query's last batch that wrote to it, as Spark's Delta sink does.
    query_id = (delta.checkpoint / "metadata").read_text().split('"id":"')[1].split('"')[0]
    last = max(checkpoint_batches(delta.checkpoint))
    table = DeltaTable(str(delta.output / "changes"))
    assert table.transaction_version(query_id) == max(
        r["batch_id"] for r in delta_rows(delta.output, "changes")
    )
    assert table.transaction_version(query_id) <= last
    assert not list((delta.output / "changes").rglob("_staging"))

    # Compaction rewrites the small files without changing a row; a rerun of the query then adds nothing.
    before = len(table.file_uris())
    results = compact(delta.output, retention_hours=0)
    after = DeltaTable(str(delta.output / "changes"))
    assert len(after.file_uris()) < before
    assert {r.table for r in results} == set(DATASETS)
    for name in DATASETS:
        assert canon(delta_rows(delta.output, name)) == canon(rows_of(parquet.output, name)), name
    query.run(spark, delta)
    assert canon(delta_rows(delta.output, "changes")) == canon(rows_of(parquet.output, "changes"))


def test_a_strict_stop_commits_its_violation_to_the_delta_tables_and_a_restart_stops_there_again(
    spark, kafka, unique_prefix, tmp_path
):
    cfg = check_a_strict_stop_is_committed_and_stops_a_restart_again(
        spark, kafka, unique_prefix, tmp_path, output_format="delta"
    )
    (commit,) = [c for c in DeltaTable(str(cfg.output / "integrity")).history() if "sotw.batch_id" in c]
    stop = json.loads(commit["sotw.stop"])
    assert (stop["violation"], stop["session"], stop["offset"], stop["last_offset"]) == ("gap", "b", 4, 3)


@pytest.mark.slow
def test_a_killed_delta_pipeline_restarts_without_losing_or_repeating_output(
    spark, kafka, simulate, tmp_path
):
    summary, config = simulate(sensors=4, rows=40, duration_s=4.0, rate=3000.0, partitions=2, seed=21)
    pattern = topic_pattern(config.topic_prefix)
    reference = pipeline_config(kafka, config.topic_prefix, tmp_path / "reference")
    query.run(spark, reference)

    where = tmp_path / "killed"
    argv = [
        sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap, "--pattern", pattern,
        "--output", str(where / "output"), "--checkpoint", str(where / "checkpoint"), "--format", "delta",
        "--max-offsets-per-trigger", "1500", "--trigger", "200ms", "-q",
    ]  # fmt: skip
    log_dir = where / "output" / "changes" / "_delta_log"
    kill_mid_run_then_drain(argv, lambda: len(list(log_dir.glob("*.json"))) >= 4)

    for name in DATASETS:
        assert canon(delta_rows(where / "output", name)) == canon(rows_of(reference.output, name)), name
