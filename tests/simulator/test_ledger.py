from collections import defaultdict

import orjson
import pyarrow.parquet as pq

from simulator import LEDGER_SCHEMA, FaultConfig
from sotw import wire
from tests.simulator.conftest import read_ledger, read_topics

FAULTS = FaultConfig(gap=0.03, duplicate=0.03, delayed=0.03, malformed=0.03, abandon=0.3, delay_ms=30)


def test_ledger_agrees_with_what_an_independent_consumer_reads_back(kafka, simulate, producer_path):
    summary, config = simulate(
        faults=FAULTS, duration_s=1.5, session_interval_s=0.3, producer_path=producer_path
    )
    assert pq.read_schema(next((summary.run_dir / "ledger").glob("*.parquet"))).equals(LEDGER_SCHEMA)
    ledger = read_ledger(summary.run_dir)
    records = read_topics(kafka, list(summary.topics), config.partitions)
    on_topics = {(r["topic"], r["partition"], r["offset"]): r for r in records}
    delivered = [row for row in ledger if row["delivered"]]
    assert len(delivered) == summary.stats.acked == summary.stats.sent
    for row in delivered:
        rec = on_topics.get((row["topic"], row["partition"], row["offset"]))
        assert rec is not None, f"ledger row {row} is not on the topic"
        assert rec["key"] == row["session"].encode()
        assert rec["sha"] == row["value_sha256"]
        if row["fault"] != "malformed":
            msg = wire.decode(rec["value"], key=rec["key"])
            assert msg.seq == row["seq"]
            # What each update did to its table: the row it touched and how.
            if msg.kind == "update":
                assert (row["row_id"], row["op"]) == (msg.row["id"], msg.op)  # type: ignore[index]
            else:
                assert (row["row_id"], row["op"]) == (None, None)
    ledger_places = {(r["topic"], r["partition"], r["offset"]) for r in delivered}
    assert set(on_topics) == ledger_places, "the topics hold messages the ledger does not know"


def test_the_truth_keeps_what_each_snapshot_carried(kafka, simulate):
    summary, config = simulate(duration_s=1.0, session_interval_s=0.3)
    snapshots = pq.read_table(summary.run_dir / "truth" / "snapshots").to_pylist()
    kept = defaultdict(dict)
    for row in snapshots:
        kept[row["session"]][row["id"]] = orjson.loads(row["values"])
    sent = [
        wire.decode(r["value"], key=r["key"])
        for r in read_topics(kafka, list(summary.topics), config.partitions)
    ]
    seen = [m for m in sent if m.kind == "snapshot"]
    assert seen and len(seen) == len(kept)
    for msg in seen:
        assert kept[msg.session] == {r["id"]: r for r in msg.rows or []}
        # A row's keys are sent sorted: its text in the message is its canonical form.
        assert all(list(r) == sorted(r) for r in msg.rows or [])


def test_each_fault_is_on_record_the_way_the_issue_describes(kafka, simulate, producer_path):
    summary, config = simulate(
        faults=FAULTS, duration_s=1.5, session_interval_s=0.3, producer_path=producer_path
    )
    ledger = read_ledger(summary.run_dir)
    records = read_topics(kafka, list(summary.topics), config.partitions)
    by_place = {(r["topic"], r["partition"], r["offset"]): r for r in records}
    by_session = defaultdict(list)
    for row in ledger:
        by_session[row["session"]].append(row)
    kinds = defaultdict(int)
    for row in ledger:
        kinds[row["fault"]] += 1
        if row["fault"] in ("gap", "abandoned"):
            assert row["sent_ts"] is None and not row["delivered"] and row["value_sha256"] is None
        if row["fault"] == "abandoned":
            assert row["kind"] == "end"
            assert not any(
                r["kind"] == "end" and r["sent_ts"] is not None for r in by_session[row["session"]]
            )
        if row["fault"] == "malformed":
            rec = by_place[(row["topic"], row["partition"], row["offset"])]
            try:
                wire.decode(rec["value"], key=rec["key"])
            except wire.MalformedMessage:
                pass
            else:
                raise AssertionError(f"malformed message at {row['offset']} decoded fine")
            # The seq it stood for never arrives intact.
            assert not any(
                r["seq"] == row["seq"] and r["fault"] in ("none", "delayed")
                for r in by_session[row["session"]]
            )
        if row["fault"] == "duplicate":
            originals = [
                r for r in by_session[row["session"]] if r["seq"] == row["seq"] and r["fault"] == "none"
            ]
            assert len(originals) == 1 and originals[0]["value_sha256"] == row["value_sha256"]
        if row["fault"] == "delayed" and row["delivered"]:
            later = [
                r["offset"]
                for r in by_session[row["session"]]
                if r["seq"] > row["seq"] and r["delivered"] and r["fault"] in ("none", "malformed")
            ]
            assert later and min(later) < row["offset"], "a delayed message must go out after a later seq"
    assert all(kinds[k] > 0 for k in ("gap", "duplicate", "delayed", "malformed", "abandoned")), kinds
    assert dict(summary.stats.faults) == {k: kinds[k] for k in summary.stats.faults}


def test_acked_ts_follows_sent_ts_for_delivered_rows_and_is_null_for_the_rest(simulate, producer_path):
    summary, _ = simulate(faults=FAULTS, duration_s=1.0, session_interval_s=0.3, producer_path=producer_path)
    ledger = read_ledger(summary.run_dir)
    delivered = [row for row in ledger if row["delivered"]]
    assert delivered and len(delivered) < len(ledger)  # gaps and abandoned ends are never acknowledged
    for row in ledger:
        if row["delivered"]:
            assert row["sent_ts"] <= row["acked_ts"] <= summary.ended_ms, row
        else:
            assert row["acked_ts"] is None, row


def test_acked_ts_at_full_speed_is_filled_for_every_message(simulate, producer_path):
    # Unthrottled, the loop dates reports by its poll marks and the final flush by its slices.
    summary, _ = simulate(
        rate=0, duration_s=None, max_messages=20_000, session_interval_s=3600, producer_path=producer_path
    )
    ledger = read_ledger(summary.run_dir)
    assert summary.unacknowledged == 0 and len(ledger) == summary.stats.sent
    assert all(row["sent_ts"] <= row["acked_ts"] for row in ledger)
    assert max(row["acked_ts"] for row in ledger) <= summary.ended_ms
