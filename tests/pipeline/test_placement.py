"""Sessions spread over the state partitions by sensor number, checked against Spark's own shuffle."""

from __future__ import annotations

import pytest

from pipeline.errors import PipelineError
from pipeline.placement import (
    PLACEMENT_FILE,
    check_state_partitions,
    placement_partitions,
    slot,
    state_partition,
)


def placed(spark, topics_and_keys, partitions):
    """(topic, key, slot, partition Spark's hash shuffle put the pair in, partition the report predicts)."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [(t, k.encode()) for t, k in topics_and_keys], "topic string, group_key binary"
    ).withColumn("slot", slot(F.col("topic"), F.col("group_key"), partitions))
    shuffled = df.repartition(partitions, "group_key", "slot").select(
        "topic",
        "group_key",
        "slot",
        F.spark_partition_id().alias("partition"),
        state_partition(F.col("group_key"), F.col("slot"), partitions).alias("predicted"),
    )
    return [tuple(r) for r in shuffled.collect()]


@pytest.mark.parametrize("partitions", [2, 3, 4])
def test_sessions_of_sensors_numbered_in_sequence_spread_evenly_over_the_state_partitions(spark, partitions):
    keys = [(f"sotw-sensor-{n:04d}", f"session-{n * 7919:08x}") for n in range(24)]

    rows = placed(spark, keys, partitions)

    assert len(rows) == 24
    for topic, _, _, partition, predicted in rows:
        assert partition == int(topic[-4:]) % partitions
        assert predicted == partition
    per_partition = [sum(1 for r in rows if r[3] == p) for p in range(partitions)]
    assert per_partition == [24 // partitions] * partitions


@pytest.mark.parametrize("partitions", [2, 4, 7])
def test_the_compiled_slot_gives_every_key_the_same_slot_as_the_default_one(spark, partitions):
    from pyspark.sql import functions as F

    rows = [(f"sotw-sensor-{n % 30:04d}", f"session-{n * 7919:08x}".encode()) for n in range(500)]
    rows += [("kitchen", f"k-{n}".encode()) for n in range(50)] + [("sotw-sensor-0003", b"")]
    df = spark.createDataFrame(rows, "topic string, key binary")
    both = df.select(
        slot(F.col("topic"), F.col("key"), partitions).alias("default"),
        slot(F.col("topic"), F.col("key"), partitions, compiled=True).alias("compiled"),
    ).collect()
    assert all(r["default"] == r["compiled"] for r in both)
    assert len({r["default"] for r in both}) > 1


def test_topics_without_a_number_keep_the_sessions_own_hash_placement(spark):
    keys = [("kitchen", f"session-{n * 7919:08x}") for n in range(40)]

    rows = placed(spark, keys, 2)

    assert {r[2] for r in rows} == {0}
    assert all(r[3] == r[4] for r in rows)
    assert len({r[3] for r in rows}) == 2  # many sessions of one topic still use both partitions


def test_the_partition_count_of_the_placement_is_recorded_in_the_checkpoint_once_batches_exist(
    spark, tmp_path
):
    ckpt = tmp_path / "ckpt"
    configured = int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert placement_partitions(spark, ckpt) == configured  # no batch yet: the session's setting

    offsets = ckpt / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text('v1\n{"conf":{"spark.sql.shuffle.partitions":"7"}}\n{}\n')
    assert placement_partitions(spark, ckpt) == 7  # Spark fixed 7 into the checkpoint
    assert (ckpt / PLACEMENT_FILE).is_file()

    # An offline repartition appends an entry with another count; the slots keep the recorded one.
    (offsets / "1").write_text('v1\n{"conf":{"spark.sql.shuffle.partitions":"4"}}\n{}\n')
    (offsets / "0").unlink()  # and old entries are purged in time
    assert placement_partitions(spark, ckpt) == 7


def test_an_unreadable_offset_log_is_reported_as_a_damaged_checkpoint(spark, tmp_path):
    offsets = tmp_path / "ckpt" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "3").write_text("v1\nnot json\n")

    with pytest.raises(
        PipelineError, match=r"ckpt is damaged: cannot read the state partition count from .*/3"
    ):
        placement_partitions(spark, tmp_path / "ckpt")


def test_a_restart_asking_for_another_state_partition_count_is_refused_naming_both(tmp_path):
    ckpt = tmp_path / "ckpt"
    check_state_partitions(ckpt, 4)  # a new checkpoint takes whatever is asked
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "offsets" / "0").write_text('v1\n{"conf":{"spark.sql.shuffle.partitions":"2"}}\n{}\n')
    check_state_partitions(ckpt, None)
    check_state_partitions(ckpt, 2)
    with pytest.raises(
        PipelineError, match=r"--shuffle-partitions 4 .* split into 2 partitions .* new --checkpoint"
    ):
        check_state_partitions(ckpt, 4)
