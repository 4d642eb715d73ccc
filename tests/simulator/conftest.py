"""Helpers for the simulator tests: run a small simulation and read its topics back independently."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import TopicPartition

from simulator import Simulator
from sotw.kafka import EndOffsets, KafkaConfig

FIXED_START = 1_790_000_000.0


def fixed_clock() -> Callable[[], float]:
    """A clock that reads a fixed epoch at its first call, then runs at real speed.

    The simulator reads it first when the schedule starts, so the schedule (and every ``ts``) is reproducible.
    """
    origin: list[float] = []

    def clock() -> float:
        # One reading: the first call returns FIXED_START exactly. With two, the first call returned it plus
        # the time between them, which moved intended times that fall on a whole millisecond (k/3 ms at 3,000
        # msg/s) across it now and then, and with them which message a session's end cuts.
        now = time.monotonic()
        if not origin:
            origin.append(now)
        return FIXED_START + (now - origin[0])

    return clock


def read_topics(kafka: KafkaConfig, topics: list[str], partitions: int) -> list[dict[str, Any]]:
    """Every record on the topics, read with an assign()-only consumer up to the true end offsets."""
    tps = [(t, p) for t in topics for p in range(partitions)]
    ends = EndOffsets(kafka)(tps)
    want = {tp: end for tp, (low, end) in ends.items() if end > low}
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(t, p, ends[(t, p)][0]) for (t, p) in want])
    out: list[dict[str, Any]] = []
    pending = dict(want)
    deadline = time.monotonic() + 30
    try:
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                if msg.error():
                    continue
                tp = (msg.topic(), msg.partition())
                out.append(
                    {
                        "topic": msg.topic(),
                        "partition": msg.partition(),
                        "offset": msg.offset(),
                        "key": msg.key(),
                        "value": msg.value(),
                        "sha": hashlib.sha256(msg.value()).hexdigest(),
                    }
                )
                if tp in pending and msg.offset() + 1 >= pending[tp]:
                    del pending[tp]
    finally:
        consumer.close()
    assert not pending, f"could not read to the end of {sorted(pending)}"
    return out


def when_planned(sim: Simulator, n: int) -> int:
    """Wait until ``sim`` has planned ``n`` messages; return how many it has.

    A live change asked for then applies from the block after the one being sent (up to a block's messages
    later), so a test that counts its next threshold from the returned number gets phases of at least that
    many messages, however slow its own thread is.
    """
    while (planned := sim.stats().planned) < n:
        time.sleep(0.005)
    return planned


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    return pq.read_table(run_dir / "ledger").to_pylist()


@pytest.fixture(params=["direct", "client"])
def producer_path(request: pytest.FixtureRequest) -> str:
    """Each producer path in turn (``SimulatorConfig.producer_path``): both must fill the ledger the same way."""
    return str(request.param)
