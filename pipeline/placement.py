"""Which state partition a session lives in: its sensor's number, not the luck of a hash.

The stateful stage lasts as long as its busiest task, and Spark places a group in state partition
``pmod(hash(<grouping columns>), spark.sql.shuffle.partitions)`` (``HashPartitioning``; SQL ``hash`` is the same
Murmur3 with the same seed). With a few dozen sensors on two partitions, hashing the session alone leaves one
core idle for much of every batch: the benchmark's 24 sessions fall 6 / 18 and the busiest stateful task takes
2.8 times the other (docs/benchmarks.md, stop 12).

A sensor publishes one session at a time to its own topic (``<prefix><sensor-id>``), so placing sessions by
sensor number spreads a fleet of sensors numbered in sequence evenly, whatever their session ids. The grouping
key is the session (the Kafka key) plus a small integer *slot*: the first of 0, 1, 2, ... for which the pair
hashes to the partition the topic's trailing number asks for. The slot is a function of the topic, the key
and the number of state partitions only, so every message of a session gets the same one in every batch and
after every restart. A topic without a trailing number asks for the session's own hash partition (slot 0),
which is plain hash placement. Should no slot up to ``SLOTS`` hit the target (for two partitions, a chance of
2**-64), slot 0 is used: the placement is then a hash's, and still the same every time.

The number of state partitions must be the one the state was written with, so ``state_partitions`` reads it
from the checkpoint when there is one (Spark keeps a checkpoint's partition count whatever the session says).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

SLOTS = 64
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def sensor_target(topic: Any, key: Any, partitions: int) -> Any:
    """The state partition a message's session should live in: the topic's trailing number, else its hash.

    Only the last nine digits count, so the number fits a long whatever the topic's name.
    """
    from pyspark.sql import functions as F

    number = F.regexp_extract(topic, r"(\d{1,9})$", 1)
    return F.when(number != "", F.pmod(number.cast("long"), F.lit(partitions))).otherwise(
        F.pmod(F.hash(key, F.lit(0)), F.lit(partitions))
    )


def slot(topic: Any, key: Any, partitions: int) -> Any:
    """The slot column: the smallest salt that puts (``key``, salt) into ``sensor_target``'s partition."""
    from pyspark.sql import functions as F

    target = sensor_target(topic, key, partitions)
    if partitions == 1:
        return F.lit(0)
    found = F.when(F.pmod(F.hash(key, F.lit(0)), F.lit(partitions)) == target, F.lit(0))
    for salt in range(1, SLOTS):
        found = found.when(F.pmod(F.hash(key, F.lit(salt)), F.lit(partitions)) == target, F.lit(salt))
    return found.otherwise(F.lit(0))


def state_partition(key: Any, slot_column: Any, partitions: int) -> Any:
    """The state partition Spark's shuffle gives the group (``key``, ``slot_column``), for reports."""
    from pyspark.sql import functions as F

    return F.pmod(F.hash(key, slot_column), F.lit(partitions))


def state_partitions(spark: Any, checkpoint: Path) -> int:
    """The number of state partitions: the checkpoint's if it has started, else the session's setting.

    Spark records the setting in every entry of the checkpoint's offset log and keeps using it after a
    restart; the slots must be computed with that number, or every open session would lose its state.
    """
    offsets = checkpoint / "offsets"
    entries = (
        sorted((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        if offsets.is_dir()
        else []
    )
    if entries:
        latest = entries[-1]
        try:
            meta = json.loads(latest.read_text().splitlines()[1])
            return int(meta["conf"][SHUFFLE_PARTITIONS])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PipelineError(
                f"checkpoint {checkpoint} is damaged: cannot read the state partition count from {latest} ({exc})"
            ) from None
    return int(spark.conf.get(SHUFFLE_PARTITIONS))
