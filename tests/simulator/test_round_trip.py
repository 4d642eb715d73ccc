import pyarrow.parquet as pq
import pytest

from simulator.fleet import partition_for
from sotw import wire
from tests.simulator.conftest import read_topics


def rebuild(messages):
    """Apply a session's messages in seq order, as a perfect pipeline would."""
    table = {}
    for m in sorted(messages, key=lambda m: m.seq):
        if m.kind == "snapshot":
            table = {r["id"]: r for r in m.rows}
        elif m.kind == "update":
            if m.op == "delete":
                table.pop(m.row["id"], None)
            else:
                table[m.row["id"]] = m.row
    return table


@pytest.mark.parametrize(
    "load",
    [
        pytest.param({"duration_s": 1.5, "session_interval_s": 0.3}, id="on-schedule"),
        # Unthrottled: whole blocks of 8,192 updates go through the block encoder at once.
        pytest.param(
            {"rate": 0, "duration_s": None, "max_messages": 40_000, "session_interval_s": 0.02, "columns": 6},
            id="unthrottled-extra-columns",
        ),
    ],
)
def test_every_message_decodes_and_each_end_digest_matches_the_rebuilt_table_and_the_truth(
    kafka, simulate, load, producer_path
):
    summary, config = simulate(producer_path=producer_path, **load)
    assert summary.producer_path == producer_path
    records = read_topics(kafka, list(summary.topics), config.partitions)
    sessions: dict[str, list[wire.Message]] = {}
    for rec in records:
        msg = wire.decode(rec["value"], key=rec["key"])  # raises on anything malformed
        assert rec["partition"] == partition_for(rec["key"], config.partitions)
        assert rec["topic"] == config.topic_prefix + msg.sensor
        sessions.setdefault(msg.session, []).append(msg)
    truth = {
        r["session"]: r for r in pq.read_table(summary.run_dir / "truth" / "sessions.parquet").to_pylist()
    }
    tables = pq.read_table(summary.run_dir / "truth" / "tables").to_pylist()
    ended = 0
    for sid, msgs in sessions.items():
        seqs = sorted(m.seq for m in msgs)
        assert seqs == list(range(len(seqs))), f"session {sid} is not a gap-free run of seqs"
        assert msgs[0].kind == "snapshot" or min(msgs, key=lambda m: m.seq).kind == "snapshot"
        ends = [m for m in msgs if m.kind == "end"]
        assert len(ends) == 1 and ends[0].seq == seqs[-1], f"session {sid} must close with one end"
        table = rebuild(msgs)
        assert ends[0].row_count == len(table)
        assert ends[0].digest == wire.table_digest(table.values())
        assert truth[sid]["status"] == "ended"
        assert truth[sid]["digest"] == ends[0].digest and truth[sid]["rows"] == len(table)
        assert truth[sid]["last_seq"] == ends[0].seq
        true_rows = {r["id"]: r["values"] for r in tables if r["session"] == sid}
        assert true_rows == {i: wire.canonical_row(r) for i, r in table.items()}
        ended += 1
    assert ended == len(truth) and ended > config.sensors  # sessions restarted
    # The ts of every message is its intended send time, recorded in the ledger.
    assert all(isinstance(m.ts, int) for msgs in sessions.values() for m in msgs)
