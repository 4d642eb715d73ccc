"""Which state partition a session lives in: its sensor's number, not the luck of a hash.

The stateful stage lasts as long as its busiest task, and Spark places a group in state partition
``pmod(hash(<grouping columns>), spark.sql.shuffle.partitions)`` (``HashPartitioning``; SQL ``hash`` is the same
Murmur3 with the same seed). With a few dozen sensors on two partitions, hashing the session alone leaves one
core idle for much of every batch: the benchmark's 24 sessions fall 6 / 18 and the busiest stateful task takes
5.5 s against 1.9 s for the other (``benchmarks/pipeline_vs_bare.py``).

A sensor publishes one session at a time to its own topic (``<prefix><sensor-id>``), so placing sessions by
sensor number spreads a fleet of sensors numbered in sequence evenly, whatever their session ids. The grouping
key is the session (the Kafka key) plus a small integer *slot*: the first of 0, 1, ..., ``slots(N) - 1`` for
which the pair hashes to the partition the topic's trailing number asks for. A topic without a trailing number
asks for the session's own hash partition (slot 0), which is plain hash placement. Should no slot hit the
target (2e-10 for two partitions, 1e-4 to 3e-4 from four to 64, 0.6 % at 100; ``slots``), slot 0 is used:
that session is placed by hash, and still the same way every time.

The slot is a function of the topic, the key and the partition count N, so N must never change for a
checkpoint: ``placement_partitions`` takes it from the checkpoint once the query has run a batch, records
it there (``PLACEMENT_FILE``) and uses it ever after, even if the state is later repartitioned offline
(Spark's offline repartitioning appends an offset-log entry with the new count; it does not change keys).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PLACEMENT_FILE = "sotw-placement.json"
"""The partition count the slots are computed with, in the checkpoint directory (Spark ignores the file)."""


def slots(partitions: int) -> int:
    """How many salts are tried: enough that a miss is rare (1e-4 to 3e-4 for four to 64 partitions).

    Every salt is hashed for every row, so the count stays bounded at 512; beyond 64 partitions more sessions
    fall back to hash placement.
    """
    return min(max(32, 8 * partitions), 512)


def state_partition(key: Any, slot_column: Any, partitions: int) -> Any:
    """The state partition Spark's shuffle gives the group (``key``, ``slot_column``)."""
    from pyspark.sql import functions as F

    return F.pmod(F.hash(key, slot_column), F.lit(partitions))


def sensor_target(topic: Any, key: Any, partitions: int) -> Any:
    """The state partition a message's session should live in: the topic's trailing number, else its hash.

    Only the last nine digits count, so the number fits a long whatever the topic's name.
    """
    from pyspark.sql import functions as F

    number = F.regexp_extract(topic, r"(\d{1,9})$", 1)
    return F.when(number != "", F.pmod(number.cast("long"), F.lit(partitions))).otherwise(
        state_partition(key, F.lit(0), partitions)
    )


def slot(topic: Any, key: Any, partitions: int, compiled: bool = False) -> Any:
    """The slot column: the smallest salt that puts (``key``, salt) into ``sensor_target``'s partition.

    One array expression of constant size (the partitions of every salt, then the position of the target
    among them), not a ``CASE`` branch per salt: Spark plans every micro-batch anew, and a 64-branch ``CASE``
    added 50-70 ms to each batch's planning. By default the array is a ``transform`` over the salts, which is
    quick to plan but evaluated row by row without code generation: 26-42 us a row on this machine. With
    ``compiled`` it is one hash expression per salt, which Spark compiles into the stage: 3 us a row, for
    35-40 ms more planning per batch. Packed rows (a session's messages of a batch in one row) are few and
    take the default; Spark's Kafka connector gives one row per message, where the compiled form decides the
    drain rate (``group_sessions``). Both give the same slot.
    """
    from pyspark.sql import functions as F

    if partitions == 1:
        return F.lit(0)
    if compiled:
        placed = F.array(
            *(state_partition(key, F.lit(salt), partitions) for salt in range(slots(partitions)))
        )
    else:
        placed = F.transform(
            F.sequence(F.lit(0), F.lit(slots(partitions) - 1)),
            lambda salt: state_partition(key, salt, partitions),
        )
    position = F.array_position(placed, sensor_target(topic, key, partitions).cast("int"))
    return F.greatest(position - 1, F.lit(0)).cast("int")


def _offset_log_partitions(checkpoint: Path) -> int | None:
    """The partition count in the oldest kept entry of the checkpoint's offset log (None before a batch).

    The oldest, because an offline repartition of the state appends an entry with its new count.
    """
    offsets = checkpoint / "offsets"
    if not offsets.is_dir():
        return None
    entries = sorted((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if not entries:
        return None
    oldest = entries[0]
    try:
        meta = json.loads(oldest.read_text().splitlines()[1])
        return int(meta["conf"][SHUFFLE_PARTITIONS])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PipelineError(
            f"checkpoint {checkpoint} is damaged: cannot read the state partition count from {oldest} ({exc})"
        ) from None


def check_state_partitions(checkpoint: Path, requested: int | None) -> None:
    """Refuse a state partition count the checkpoint was not started with.

    Spark fixes ``spark.sql.shuffle.partitions`` into a stateful query's checkpoint at its first batch and
    silently keeps it on every restart; a user who asked for another count must hear that it was not taken.
    """
    if requested is None:
        return
    record = checkpoint / PLACEMENT_FILE
    recorded = int(json.loads(record.read_text())["partitions"]) if record.is_file() else None
    recorded = recorded if recorded is not None else _offset_log_partitions(checkpoint)
    if recorded is not None and recorded != requested:
        raise PipelineError(
            f"--shuffle-partitions {requested} does not match the checkpoint {checkpoint}, whose state is split "
            f"into {recorded} partitions and cannot be re-split on a restart: leave the setting out or give "
            f"{recorded}, or start a new --checkpoint and --output to run with {requested}"
        )


def placement_partitions(spark: Any, checkpoint: Path) -> int:
    """The partition count the slots are computed with; recorded in the checkpoint once batches exist.

    Before the query's first batch it is the session's ``spark.sql.shuffle.partitions``, which Spark fixes
    into the checkpoint with that batch. After that it is the count of the offset log's oldest entry, written
    to ``PLACEMENT_FILE`` at the next start and read from there ever after, so neither a different
    ``--shuffle-partitions`` at restart nor an offline repartition of the state changes a slot.
    """
    record = checkpoint / PLACEMENT_FILE
    if record.is_file():
        try:
            return int(json.loads(record.read_text())["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PipelineError(f"checkpoint {checkpoint} is damaged: cannot read {record} ({exc})") from None
    logged = _offset_log_partitions(checkpoint)
    if logged is None:
        return int(spark.conf.get(SHUFFLE_PARTITIONS))
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(json.dumps({"partitions": logged}))
    tmp.replace(record)
    return logged
