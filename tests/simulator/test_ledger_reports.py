"""The ledger's side of delivery reports, without a broker: when a chunk is written, and what it says."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from hdrh.histogram import HdrHistogram

from simulator.faults import NONE
from simulator.ledger import NOT_ACKNOWLEDGED, UPDATE, Lateness, Ledger
from simulator.native import Values


def _block(ledger: Ledger, session: int, seqs: list[int], sent_s: float) -> int:
    n = len(seqs)
    return ledger.add_block(
        np.full(n, session, np.int32),
        np.array(seqs),
        UPDATE,
        NONE,
        np.array(seqs) + 1_790_000_000_000,
        np.full(n, sent_s),
        Values.of([b'{"seq":%d}' % s for s in seqs]),
        np.array(seqs) % 7,
        np.zeros(n, bool),
    )


def test_a_chunk_waits_for_every_report_then_says_what_each_row_got(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    code = ledger.add_session("s-1", "s", "t", 0)
    first = _block(ledger, code, [1, 2, 3, 4], 1_790_000_000.5)
    # Reports may come back before their rows are sealed: kept until they have a chunk.
    ledger.acknowledge(np.array([first, first + 1]), np.array([10, 11]), np.zeros(2), 1_790_000_001.0, str)
    ledger.add_row(code, 5, UPDATE, NONE, 1_790_000_000_005)  # never sent: needs no report
    ledger.seal()
    ledger.write_ready()
    assert ledger.rows_written == 0 and ledger.outstanding() == 2  # rows 3 and 4 have no report yet
    # A delivery librdkafka reports without an offset (-1001) is a delivery; a failure is a report too.
    timed_out = {-192: "Local: Message timed out"}.__getitem__
    ledger.acknowledge(
        np.array([first + 2, first + 3]),
        np.array([-1001, -1]),
        np.array([0, -192]),
        1_790_000_001.5,
        timed_out,
    )
    ledger.write_ready()
    assert ledger.rows_written == 5 and ledger.outstanding() == 0
    ledger.close()
    rows = pq.read_table(tmp_path / "ledger").to_pylist()
    got = [(r["seq"], r["delivered"], r["offset"], r["acked_ts"], r["error"]) for r in rows]
    assert got == [
        (1, True, 10, 1_790_000_001_000, None),
        (2, True, 11, 1_790_000_001_000, None),
        (3, True, None, 1_790_000_001_500, None),
        (4, False, None, None, "Local: Message timed out"),
        (5, False, None, None, None),
    ]


def test_rows_still_without_a_report_at_close_are_written_as_not_acknowledged(tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    code = ledger.add_session("s-1", "s", "t", 0)
    first = _block(ledger, code, [1, 2], 1_790_000_000.5)
    ledger.acknowledge(np.array([first]), np.array([7]), np.zeros(1), 1_790_000_001.0, str)
    ledger.close()
    rows = pq.read_table(tmp_path / "ledger").to_pylist()
    assert [(r["delivered"], r["offset"], r["error"]) for r in rows] == [
        (True, 7, None),
        (False, None, NOT_ACKNOWLEDGED),
    ]


def test_lateness_is_counted_as_hdrhistogram_counts_it_and_merges_and_encodes_as_one():
    values = np.random.default_rng(3).exponential(3.0, 20_000) - 0.2  # ms; a few early ones count as 0
    values[7] = 5_000_000.0  # past the hour the histogram tracks: counted as an hour
    first, second = Lateness(), Lateness()
    first.add(values[:7_000])
    second.add(values[7_000:])
    second.add(np.array([]))
    reference = HdrHistogram(1, Lateness.HIGHEST_US, 3)
    for us in np.clip(np.rint(values * 1000.0), 0, Lateness.HIGHEST_US).astype(np.int64).tolist():
        reference.record_value(us)
    merged = HdrHistogram.decode(first.encode())
    merged.add(HdrHistogram.decode(second.encode()))
    assert merged.equals(reference) and merged.get_total_count() == 20_000
    whole = Lateness()
    whole.add(values)
    assert whole.histogram.equals(reference)
    expected = reference.get_percentile_to_value_dict([50, 99, 99.9])
    assert whole.percentiles(50, 99, 99.9) == [expected[q] / 1000.0 for q in (50, 99, 99.9)]
    assert whole.max_ms == 5_000_000.0 and Lateness().percentiles(50) == [None]


def test_where_hdrh_s_layout_is_not_the_known_one_lateness_is_recorded_value_by_value_with_the_same_figures(
    caplog,
):
    class UnknownLayout(Lateness):  # an hdrh release whose counts array sotw does not recognise
        def _layout_known(self) -> bool:
            return False

    values = np.random.default_rng(5).exponential(3.0, 5_000)
    fast, slow = Lateness(), None
    with caplog.at_level("WARNING", logger="simulator.ledger"):
        slow = UnknownLayout()
        UnknownLayout()
    fast.add(values)
    slow.add(values)
    assert slow.histogram.equals(fast.histogram) and slow.count == fast.count == 5_000
    assert slow.percentiles(50, 99) == fast.percentiles(50, 99)
    assert sum("recorded one by one" in r.getMessage() for r in caplog.records) <= 1
    assert fast._fast, "this hdrh's layout is the one the fast path knows"
