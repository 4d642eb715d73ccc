"""Micro benchmarks of the pipeline's hot path: the pure session processor and its output conversion.

Run with ``.venv/bin/pytest benchmarks/test_pipeline_bench.py --benchmark-only``. One session of a 200-row
table (a snapshot) and 5,000 upserts, as the simulator writes them, goes through ``SessionProcessor.apply``
(decode, sequence checks, table update, canonical row JSON); the second adds what
``pipeline.reconstruct`` does after it in a Python worker: the records as one Arrow table, written to
Parquet (``pipeline.sinks.write_records``). The third times the Arrow block round trip that ``reconstruct``
without an output root hands back instead, and records the block's size; the last two time the hot path's
decode of the 5,000 updates (``sotw.wire.plain_update``) against ``orjson.loads`` alone.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipeline.policies import PolicyConfig
from pipeline.processor import SessionProcessor
from pipeline.records import from_blocks, with_every_column
from pipeline.sinks import write_records
from pipeline.state import Envelope
from sotw.wire import encode_snapshot, encode_update, plain_update

SENSOR = "0007"
SESSION = "0007-0123456789ab-00001"
TOPIC = "sotw-sensor-0007"
ROWS = 200
UPSERTS = 5_000


def session_envelopes() -> list[Envelope]:
    """A snapshot of 200 rows and 5,000 upserts of random rows with the simulator's row shape."""
    rng = np.random.default_rng(0)
    table = {
        i: {"id": i, "name": f"row-{i}", "temp": round(20 + rng.random() * 10, 3), "ok": True, "count": i}
        for i in range(ROWS)
    }
    values = [encode_snapshot(SENSOR, SESSION, 0, 1_795_000_000_000, list(table.values()))]
    for seq in range(1, UPSERTS + 1):
        row = dict(table[int(rng.integers(ROWS))])
        row["temp"] = round(row["temp"] + float(rng.standard_normal()) * 0.1, 3)
        row["count"] += 1
        table[row["id"]] = row
        values.append(encode_update(SENSOR, SESSION, seq, 1_795_000_000_000 + seq, "upsert", row))
    key = SESSION.encode()
    return [Envelope(TOPIC, 0, 1_000 + i, key, v, 1_795_000_000_000 + i) for i, v in enumerate(values)]


@pytest.fixture(scope="module")
def envelopes() -> list[Envelope]:
    return session_envelopes()


@pytest.mark.parametrize("policy", ["ordered", "once"])
def test_session_processor_applies_a_200_row_session_with_5000_upserts(
    benchmark: pytest.FixtureRequest, envelopes: list[Envelope], policy: str
) -> None:
    processor = SessionProcessor(PolicyConfig(policy))
    state, out = benchmark(processor.apply, None, envelopes, 10_000)
    assert state is not None and len(state.table) == ROWS
    assert len(out.changes) == ROWS + UPSERTS


def test_processor_plus_writing_the_records_to_parquet(
    benchmark: pytest.FixtureRequest, envelopes: list[Envelope], tmp_path: Path
) -> None:
    processor = SessionProcessor(PolicyConfig("ordered"))
    runs = itertools.count()

    def step() -> list[tuple[str, str, int]]:
        _, out = processor.apply(None, envelopes, 10_000)
        table = with_every_column(out.to_arrow())
        return write_records(table, str(tmp_path), f"p0-a0-g{next(runs)}.parquet", 1, 1_795_000_000_000)

    written = benchmark(step)
    assert sum(rows for _, _, rows in written) == ROWS + UPSERTS


def test_records_to_an_arrow_block_and_back(
    benchmark: pytest.FixtureRequest, envelopes: list[Envelope]
) -> None:
    """The block alone: what ``reconstruct`` without an output root hands Spark per session and batch."""
    _, out = SessionProcessor(PolicyConfig("ordered")).apply(None, envelopes, 10_000)
    table = benchmark(lambda: from_blocks([out.to_block()]))
    assert table.num_rows == ROWS + UPSERTS
    assert table.to_pylist()[-1] == out.rows()[-1]
    benchmark.extra_info["block_bytes"] = len(out.to_block())


@pytest.fixture(scope="module")
def updates(envelopes: list[Envelope]) -> list[bytes]:
    return [e.value for e in envelopes[1:] if e.value is not None]


def test_plain_update_decodes_and_checks_5000_updates(
    benchmark: pytest.FixtureRequest, updates: list[bytes]
) -> None:
    key = SESSION.encode()
    decoded = benchmark(lambda: [plain_update(v, key) for v in updates])
    assert all(d is not None for d in decoded) and len(decoded) == UPSERTS


def test_orjson_loads_alone_of_the_same_5000_updates(
    benchmark: pytest.FixtureRequest, updates: list[bytes]
) -> None:
    loads = orjson.loads
    assert len(benchmark(lambda: [loads(v) for v in updates])) == UPSERTS
