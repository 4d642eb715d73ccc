import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

from pipeline.errors import IntegrityViolation, PipelineError
from pipeline.integrity import IntegrityRecord, Position
from pipeline.records import Records, with_every_column
from pipeline.recovery import check_consistency, rollback
from pipeline.sinks import (
    OWNER_FILE,
    PARTITIONS,
    ROLLBACK,
    STAGING,
    WRITTEN_DDL,
    OutputWriter,
    committed_batches,
    write_records,
)

DAY = 1_795_500_000_000  # 2026-11-24 in epoch ms


def _checkpoint(tmp_path, query_id, commits):
    ckpt = tmp_path / "checkpoint"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "metadata").write_text(json.dumps({"id": query_id}))
    for n in commits:
        (ckpt / "commits" / str(n)).write_text("v1\n{}")
    return ckpt


def _output(tmp_path, query_id, commits):
    out = tmp_path / "output"
    (out / "_commits").mkdir(parents=True)
    (out / OWNER_FILE).write_text(json.dumps({"query_id": query_id}))
    for n in commits:
        (out / "_commits" / f"{n}.json").write_text("{}")
    return out


def test_a_fresh_start_and_a_matching_restart_are_accepted(tmp_path):
    check_consistency(tmp_path / "output", tmp_path / "checkpoint")
    ckpt = _checkpoint(tmp_path, "q1", [0, 1, 2])
    out = _output(
        tmp_path, "q1", [0, 1, 2, 3]
    )  # died after the output commit, before Spark's: replayed, skipped
    check_consistency(out, ckpt)
    assert committed_batches(out) == [0, 1, 2, 3]


def test_output_from_another_query_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0])
    out = _output(tmp_path, "q2", [0])
    with pytest.raises(PipelineError, match="belongs to query q2.*checkpoint .* is query q1"):
        check_consistency(out, ckpt)


def test_a_checkpoint_older_than_the_output_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1])
    out = _output(tmp_path, "q1", [0, 1, 2, 3, 4])
    with pytest.raises(PipelineError, match="batches up to 4 but checkpoint .* only up to 1"):
        check_consistency(out, ckpt)


def test_lost_output_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1, 2])
    out = _output(tmp_path, "q1", [0])
    with pytest.raises(PipelineError, match="output was lost"):
        check_consistency(out, ckpt)


def test_output_without_its_checkpoint_is_refused(tmp_path):
    out = _output(tmp_path, "q1", [0, 1])
    with pytest.raises(PipelineError, match="checkpoint .* is empty"):
        check_consistency(out, tmp_path / "checkpoint")


def test_a_damaged_checkpoint_is_named(tmp_path):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "metadata").write_text("garbage")
    out = _output(tmp_path, "q1", [0])
    with pytest.raises(PipelineError, match="damaged"):
        check_consistency(out, ckpt)


def test_records_are_written_where_hive_partitioning_reads_them_back_whatever_the_sensor_is_called(tmp_path):
    records = Records()
    day = 1_795_500_000_000  # 2026-11-24
    sensors = ["sensor-0001", "a b/c", "ü=100%"]
    for k, sensor in enumerate(sensors):
        records.change(sensor, f"s{k}", "t", 0, k, 1, day + k, 7, "upsert", '{"id":7}')
    records.change("sensor-0001", "s0", "t", 0, 9, 2, day + 86_400_000, 8, "delete", None)  # the next day
    records.integrity(IntegrityRecord("gap", None, "s9", Position("t", 0, 3)))
    table = with_every_column(records.to_arrow())

    written = write_records(table, str(tmp_path / "staging"), "p0-a0-g1.parquet", 4, day + 5)

    def read(dataset: str) -> list[dict]:
        keys = pa.schema([(key, pa.string()) for key in PARTITIONS[dataset]])
        root = str(tmp_path / "staging" / dataset)
        return ds.dataset(root, partitioning=ds.partitioning(keys, flavor="hive")).to_table().to_pylist()

    assert sorted((d, n) for d, _, n in written) == [
        ("changes", 1),
        ("changes", 1),
        ("changes", 1),
        ("changes", 1),
        ("integrity", 1),
    ]
    changes = read("changes")
    assert sorted((c["sensor"], c["date"], c["seq"], c["batch_id"]) for c in changes) == sorted(
        [(s, "2026-11-24", 1, 4) for s in sensors] + [("sensor-0001", "2026-11-25", 2, 4)]
    )
    gaps = read("integrity")
    # No event time: the day of the batch's processing time; no sensor: Hive's null partition.
    assert [(g["sensor"], g["date"], g["processed_ms"]) for g in gaps] == [(None, "2026-11-24", day + 5)]


def _batch_staging_on_collect(spark, staging, attempt: str):
    """Batch 3 as the stateful step makes it: collecting it writes two sessions' records into staging."""

    def write(_batches):
        records = Records()
        for k in range(2):
            records.change(f"sensor-000{k}", f"s{k}", "t", 0, 5, 1, DAY, 7, "upsert", '{"id":7}')
        table = with_every_column(records.to_arrow())
        written = write_records(table, str(staging), f"p0-t{attempt}-g1.parquet", 3, DAY)
        yield pa.RecordBatch.from_pylist(
            [
                {"dataset": d, "path": p, "rows": n, "messages": 1, "processed_ms": DAY, "stop": None}
                for d, p, n in written
            ]
        )

    return spark.range(1, numPartitions=1).mapInArrow(write, WRITTEN_DDL)


def test_a_replayed_batch_takes_back_what_its_interrupted_attempt_had_published(tmp_path, spark, monkeypatch):
    output = tmp_path / "output"
    writer = OutputWriter(output, tmp_path / "checkpoint")
    staging = output / STAGING / "3"
    real_replace, moved = os.replace, []

    def dies_after_one_move(src, dest):
        if Path(dest).name.startswith("b3-"):
            if moved:
                raise KeyboardInterrupt("killed while publishing")
            moved.append(dest)
        real_replace(src, dest)

    monkeypatch.setattr(os, "replace", dies_after_one_move)
    with pytest.raises(KeyboardInterrupt):
        writer(_batch_staging_on_collect(spark, staging, "1"), 3)
    monkeypatch.setattr(os, "replace", real_replace)
    assert [p.name for p in (output / "changes").rglob("*.parquet")] == ["b3-p0-t1-g1.parquet"]
    assert not (output / "_commits" / "3.json").exists()

    writer(_batch_staging_on_collect(spark, staging, "2"), 3)  # Spark replays the batch

    published = sorted(p.name for p in (output / "changes").rglob("*.parquet"))
    assert published == ["b3-p0-t2-g1.parquet", "b3-p0-t2-g1.parquet"]  # one per sensor directory
    assert committed_batches(output) == [3]
    assert not list((output / "_publishing").iterdir())


def test_a_replay_also_takes_back_an_interrupted_publication_of_a_sotw_without_the_journal(tmp_path, spark):
    output = tmp_path / "output"
    stale = output / "changes" / "sensor=sensor-0000" / "date=2026-11-24" / "b3-p0-t1-g1.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by a kill in the middle of publishing batch 3, before journals existed")

    OutputWriter(output, tmp_path / "checkpoint")(
        _batch_staging_on_collect(spark, output / STAGING / "3", "2"), 3
    )

    published = sorted(p.name for p in (output / "changes").rglob("*.parquet"))
    assert published == ["b3-p0-t2-g1.parquet", "b3-p0-t2-g1.parquet"]


def test_a_batch_replayed_after_its_marker_keeps_its_files_and_drops_the_journal(tmp_path, spark):
    output = tmp_path / "output"
    OutputWriter(output, tmp_path / "checkpoint")(
        _batch_staging_on_collect(spark, output / STAGING / "3", "1"), 3
    )
    # Killed after the marker and before the journal was removed: the journal is back, as it was then.
    (output / "_publishing" / "3.json").write_text(json.dumps({"files": ["changes/x/b3-p0-t1-g1.parquet"]}))

    OutputWriter(output, tmp_path / "checkpoint")(
        _batch_staging_on_collect(spark, output / STAGING / "3", "2"), 3
    )

    published = sorted(p.name for p in (output / "changes").rglob("*.parquet"))
    assert published == ["b3-p0-t1-g1.parquet", "b3-p0-t1-g1.parquet"]
    assert not list((output / "_publishing").iterdir())


def test_a_batch_replayed_after_its_delta_commits_keeps_the_files_its_tables_name(tmp_path, spark):
    output = tmp_path / "output"
    OutputWriter(output, tmp_path / "checkpoint", output_format="delta")(
        _batch_staging_on_collect(spark, output / STAGING / "3", "1"), 3
    )
    # Killed after the tables committed batch 3 and before Spark did: a new process is given it again.
    OutputWriter(output, tmp_path / "checkpoint", output_format="delta")(
        _batch_staging_on_collect(spark, output / STAGING / "3", "2"), 3
    )

    published = sorted(p.name for p in (output / "changes").rglob("*.parquet"))
    assert published == ["b3-p0-t1-g1.parquet", "b3-p0-t1-g1.parquet"]
    assert len(DeltaTable(str(output / "changes")).to_pyarrow_table()) == 2


def test_a_batch_naming_one_staging_file_twice_is_refused_before_anything_moves(tmp_path, spark):
    output = tmp_path / "output"
    staging = output / STAGING / "3"
    records = Records()
    records.change("sensor-0001", "s1", "t", 0, 5, 1, DAY, 7, "upsert", '{"id":7}')
    ((dataset, path, n),) = write_records(
        with_every_column(records.to_arrow()), str(staging), "p0-g1.parquet", 3, DAY
    )
    twice = spark.createDataFrame([(dataset, path, n, 1, DAY, None)] * 2, WRITTEN_DDL)

    with pytest.raises(PipelineError, match="batch 3: two task outputs name the same staging file"):
        OutputWriter(output, tmp_path / "checkpoint")(twice, 3)

    assert not (output / "changes").exists()
    assert committed_batches(output) == []


def _gap(session: str, offset: int) -> IntegrityViolation:
    record = IntegrityRecord(
        "gap", "sensor-0001", session, Position("t", 0, offset), event_ms=DAY, seq=5, expected_seq=3,
        got_seq=5, missing=(3, 4),
    )  # fmt: skip
    return IntegrityViolation(record, last_offset=offset - 1)


def _batch_stopped_by(spark, staging, stops: list[IntegrityViolation]):
    """Batch 3 as the stateful step makes it when the strict policy stopped ``stops``' sessions and another
    session wrote a change: collecting it writes each stopped session's violation record, and each reports
    its stop."""
    reported = [json.dumps(stop.as_dict()) for stop in stops]

    def write(_batches):
        records = Records()
        records.change("sensor-0001", "ok", "t", 0, 1, 1, DAY, 7, "upsert", '{"id":7}')
        for stop in stops:
            records.integrity(stop.record)
        table = with_every_column(records.to_arrow())
        written = write_records(table, str(staging), "p0-g1.parquet", 3, DAY)
        rows = [(d, p, n, 0, DAY, None) for d, p, n in written] + [
            (None, None, 0, 1, DAY, r) for r in reported
        ]
        names = ("dataset", "path", "rows", "messages", "processed_ms", "stop")  # WRITTEN_DDL's order
        yield pa.RecordBatch.from_pylist([dict(zip(names, r, strict=True)) for r in rows])

    return spark.range(1, numPartitions=1).mapInArrow(write, WRITTEN_DDL)


@pytest.mark.parametrize("output_format", ["parquet", "delta"])
def test_a_strict_stop_is_published_with_its_batch_then_raised_naming_the_first_and_raised_again_on_replay(
    tmp_path, spark, output_format
):
    from pipeline.inspect import read_dataset

    output = tmp_path / "output"
    later, first = _gap("late", 9), _gap("early", 2)
    writer = OutputWriter(output, tmp_path / "checkpoint", output_format=output_format)
    with pytest.raises(IntegrityViolation) as stopped:
        writer(_batch_stopped_by(spark, output / STAGING / "3", [later, first]), 3)

    assert (str(stopped.value), stopped.value.record) == (str(first), first.record)
    integrity = read_dataset(output, "integrity")
    assert integrity is not None
    assert sorted(integrity["session"].to_pylist()) == ["early", "late"]
    assert read_dataset(output, "changes") is not None
    if output_format == "parquet":
        assert json.loads((output / "_commits" / "3.json").read_text())["stop"] == first.as_dict()
    files = sorted(p.relative_to(output) for p in output.rglob("*.parquet"))

    # Spark replays the batch it never committed; even if the replay reports no stop (a restart under another
    # policy), the recorded one is raised again, and nothing is added.
    with pytest.raises(IntegrityViolation) as again:
        OutputWriter(output, tmp_path / "checkpoint", output_format=output_format)(
            spark.createDataFrame([(None, None, 0, 2, DAY, None)], WRITTEN_DDL), 3
        )
    assert (str(again.value), again.value.record, again.value.last_offset) == (str(first), first.record, 1)
    assert sorted(p.relative_to(output) for p in output.rglob("*.parquet")) == files


def test_rollback_refuses_to_leave_a_hole_behind_the_checkpoint(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1, 2])
    out = _output(tmp_path, "q1", [0, 1, 2, 3])
    with pytest.raises(PipelineError, match="committed batches up to 2: rolling the output back to 1"):
        rollback(out, ckpt, 1)
    assert committed_batches(out) == [0, 1, 2, 3]


def test_an_interrupted_rollback_blocks_the_start_until_it_is_run_again(tmp_path):
    ckpt = _checkpoint(tmp_path, "q1", [0, 1])
    out = _output(tmp_path, "q1", [0, 1, 2])
    kept = out / "changes" / "sensor=s" / "date=2026-11-24" / "b1-p0-g1.parquet"
    dropped = kept.with_name("b2-p0-g1.parquet")
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"batch 1")
    dropped.write_bytes(b"batch 2")
    (out / ROLLBACK).write_text(json.dumps({"to_batch": 1}))  # killed in the middle of a rollback

    with pytest.raises(PipelineError, match=r"rollback to batch 1 that did not finish: run .*--to-batch 1"):
        check_consistency(out, ckpt)
    assert rollback(out, ckpt, 1).batches == [2]
    check_consistency(out, ckpt)
    assert committed_batches(out) == [0, 1]
    assert kept.exists() and not dropped.exists()


def test_markers_of_batches_that_wrote_nothing_are_kept_only_for_the_latest_batches(tmp_path, spark):
    output = tmp_path / "output"
    writer = OutputWriter(output, tmp_path / "checkpoint", retain_empty=3)
    nothing = spark.createDataFrame([], WRITTEN_DDL)
    for batch in range(6):
        writer(nothing, batch)
    writer(_batch_staging_on_collect(spark, output / STAGING / "6", "1"), 6)  # wrote rows: kept for good
    for batch in range(7, 12):
        writer(nothing, batch)
    assert committed_batches(output) == [6, 9, 10, 11]
