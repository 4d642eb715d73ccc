import pyarrow.parquet as pq
from confluent_kafka.admin import AdminClient

from tests.simulator.conftest import read_ledger


def test_sessions_restart_and_sensors_join_and_retire_with_new_topics(kafka, simulate):
    summary, config = simulate(
        sensors=4, duration_s=2.0, session_interval_s=0.3, join_rate=3.0, retire_rate=1.5, seed=3
    )
    sensors = pq.read_table(summary.run_dir / "truth" / "sensors.parquet").to_pylist()
    assert len(sensors) > config.sensors, "no sensor joined"
    assert any(s["retired_ms"] is not None for s in sensors), "no sensor retired"
    existing = AdminClient(kafka.client()).list_topics(timeout=10).topics
    assert {s["topic"] for s in sensors} <= set(existing)
    assert set(summary.topics) == {s["topic"] for s in sensors}
    rows = read_ledger(summary.run_dir)
    sessions = pq.read_table(summary.run_dir / "truth" / "sessions.parquet").to_pylist()
    per_sensor = {}
    for s in sessions:
        per_sensor.setdefault(s["sensor"], []).append(s)
    assert max(len(v) for v in per_sensor.values()) >= 3, "sessions did not restart"
    for s in sessions:
        seqs = sorted(r["seq"] for r in rows if r["session"] == s["session"] and r["fault"] != "duplicate")
        assert seqs == list(range(s["last_seq"] + 1))
        first = [r for r in rows if r["session"] == s["session"] and r["seq"] == 0]
        assert first[0]["kind"] == "snapshot"
    retired = {s["sensor"]: s["retired_ms"] for s in sensors if s["retired_ms"] is not None}
    for row in rows:
        if row["sensor"] in retired:
            assert row["intended_ts"] <= retired[row["sensor"]], "a retired sensor kept publishing"


def test_two_runs_whose_directories_share_a_name_have_different_session_ids(kafka, simulate, tmp_path):
    # Successive Locust runs each give their simulator a directory named after the part (``parts/local``) and
    # topics of their own: their sessions must not share ids, or a pipeline keyed by session mixes them.
    first, _ = simulate(name="local", seed=4)
    second, _ = simulate(name="local", seed=4)
    ids = [{r["session"] for r in read_ledger(s.run_dir)} for s in (first, second)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
