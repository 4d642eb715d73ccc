"""The session processor under each integrity policy, on hand-built envelopes (no Spark)."""

from __future__ import annotations

import base64
import random
from typing import Any

import pyarrow as pa
import pytest

from pipeline.errors import ConfigError, IntegrityViolation
from pipeline.policies import POLICIES, POLICY_CLASSES, Policy, PolicyConfig, policy_for
from pipeline.processor import SessionProcessor
from pipeline.records import ARROW_SCHEMA, CHANGE_COLUMNS, COLUMNS, Records, from_blocks
from pipeline.state import Envelope, SessionState
from sotw.wire import encode_end, encode_snapshot, encode_update, table_digest

SENSOR, SESSION, TOPIC = "sensor-7", "sess-1", "sotw-sensor-7"
NOW = 1_000_000


class Session:
    """Builds a fault-free session's values and keeps the true table alongside."""

    def __init__(self, rows: int = 3) -> None:
        self.table: dict[int, dict[str, Any]] = {
            i: {"id": i, "temp": 20.5 + i, "name": f"é{i}"} for i in range(rows)
        }
        self.values = [encode_snapshot(SENSOR, SESSION, 0, 1_000, list(self.table.values()))]

    @property
    def seq(self) -> int:
        return len(self.values)

    def upsert(self, row_id: int, temp: float) -> Session:
        row = {"id": row_id, "temp": temp, "name": f"u{self.seq}"}
        self.table[row_id] = row
        self.values.append(encode_update(SENSOR, SESSION, self.seq, 1_000 + self.seq, "upsert", row))
        return self

    def delete(self, row_id: int) -> Session:
        self.table.pop(row_id, None)
        self.values.append(
            encode_update(SENSOR, SESSION, self.seq, 1_000 + self.seq, "delete", {"id": row_id})
        )
        return self

    def end(self) -> Session:
        rows = self.table.values()
        self.values.append(
            encode_end(SENSOR, SESSION, self.seq, 1_000 + self.seq, len(self.table), table_digest(rows))
        )
        return self

    @property
    def digest(self) -> str:
        return table_digest(self.table.values())


def typical() -> Session:
    return Session().upsert(1, 30.0).upsert(5, 31.0).delete(0).upsert(2, 32.0).upsert(1, 33.0).end()


def envelopes(values: list[bytes], offsets: list[int] | None = None) -> list[Envelope]:
    offsets = offsets if offsets is not None else list(range(100, 100 + len(values)))
    return [Envelope(TOPIC, 3, o, SESSION.encode(), v, 5_000) for o, v in zip(offsets, values, strict=True)]


def pick(envs: list[Envelope], *seqs: int) -> list[Envelope]:
    return [envs[s] for s in seqs]


def arrive(envs: list[Envelope], start: int = 1_000) -> list[Envelope]:
    """The envelopes with offsets in the given order: Kafka order is arrival order."""
    return [e._replace(offset=start + i) for i, e in enumerate(envs)]


def run(policy: str, *batches: list[Envelope], **config: Any) -> tuple[SessionState | None, Records]:
    """Apply batches one after another, through a serialization round trip as Spark does."""
    processor = SessionProcessor(PolicyConfig(policy, **config))
    state: SessionState | None = None
    out = Records()
    for i, batch in enumerate(batches):
        state, records = processor.apply(state, batch, NOW + i)
        out.changes += records.changes
        out.others += records.others
        state = SessionState.from_bytes(state.to_bytes()) if state is not None else None
    return state, out


def session_record(out: Records) -> dict[str, Any]:
    (record,) = out.of("session")
    return record


def violations(out: Records) -> list[tuple[Any, ...]]:
    return [(r["violation"], r["expected_seq"], r["got_seq"]) for r in out.of("integrity")]


@pytest.mark.parametrize("policy", ["strict", "ordered", "once", "none"])
def test_a_fault_free_session_is_rebuilt_exactly_and_closed_ok(policy: str) -> None:
    s = typical()
    state, out = run(policy, envelopes(s.values))
    record = session_record(out)
    assert (record["status"], record["closed_by"], record["digest"], record["row_count"]) == (
        "ok", "end", s.digest, len(s.table),
    )  # fmt: skip
    assert record["messages"] == len(s.values)
    assert (record["first_seq"], record["last_seq"]) == (0, len(s.values) - 1)
    assert out.of("integrity") == []
    ops = [c["op"] for c in out.of("change")]
    assert ops == ["snapshot"] * 3 + ["upsert", "upsert", "delete", "upsert", "upsert"]
    assert state is not None and state.closed and state.table == {}


def test_window_policy_rebuilds_a_fault_free_session() -> None:
    s = typical()
    _, out = run("window", envelopes(s.values), window_messages=3)
    assert session_record(out)["status"] == "ok"
    assert session_record(out)["digest"] == s.digest


def test_envelopes_are_applied_in_offset_order_whatever_order_they_come_in() -> None:
    s = typical()
    shuffled = envelopes(s.values)
    random.Random(7).shuffle(shuffled)
    _, out = run("strict", shuffled)
    assert session_record(out)["digest"] == s.digest
    assert [c["offset"] for c in out.of("change")] == sorted(c["offset"] for c in out.of("change"))


def test_state_carries_the_table_across_micro_batches() -> None:
    s = typical()
    envs = envelopes(s.values)
    state, out = run("strict", envs[:2], envs[2:4], envs[4:])
    assert session_record(out)["digest"] == s.digest
    assert len(out.of("change")) == 8


def test_change_records_carry_canonical_values_and_kafka_position() -> None:
    s = Session(rows=1).upsert(0, 1.5)
    _, out = run("strict", envelopes(s.values))
    last = out.of("change")[-1]
    assert last["values"] == '{"id":0,"name":"u1","temp":1.5}'
    assert (last["sensor"], last["session"], last["topic"], last["partition"], last["offset"], last["seq"]) == (
        SENSOR, SESSION, TOPIC, 3, 101, 1,
    )  # fmt: skip
    assert last["event_ms"] == 1_001


# ---------------------------------------------------------------- strict


def test_gap_in_strict_mode_stops_naming_sensor_session_position_and_seqs() -> None:
    envs = envelopes(typical().values)
    with pytest.raises(IntegrityViolation) as failure:
        run("strict", pick(envs, 0, 1, 3))
    message = str(failure.value)
    assert f"gap in session '{SESSION}' of sensor '{SENSOR}'" in message
    assert f"topic '{TOPIC}' partition 3 offset 103: expected seq 2, got seq 3" in message
    assert "last applied offset: 101" in message
    record = failure.value.record
    assert (record.expected_seq, record.got_seq, record.at.offset) == (2, 3, 103)


def test_a_strict_stop_carries_the_batch_s_records_before_it_and_a_gap_names_the_missing_seqs() -> None:
    envs = envelopes(typical().values)
    with pytest.raises(IntegrityViolation) as failure:
        SessionProcessor(PolicyConfig("strict")).apply(None, pick(envs, 0, 1, 4, 5), NOW)
    stop = failure.value
    assert (stop.record.missing, stop.record.seq, stop.record.event_ms) == ((2, 3), 4, 1_004)
    assert stop.records is not None
    assert sorted({c["seq"] for c in stop.records.of("change")}) == [0, 1]
    assert stop.records.of("integrity") == stop.records.of("session") == []
    assert IntegrityViolation.from_dict(stop.as_dict()).record == stop.record


def test_a_strict_stop_survives_pickling_with_its_record_and_message() -> None:
    import pickle

    envs = envelopes(typical().values)
    with pytest.raises(IntegrityViolation) as failure:
        run("strict", pick(envs, 0, 1, 3))
    copy = pickle.loads(pickle.dumps(failure.value))
    assert (str(copy), copy.record, copy.last_offset) == (str(failure.value), failure.value.record, 101)


def test_duplicate_in_strict_mode_stops_the_query() -> None:
    envs = envelopes(typical().values)
    dup = envs[1]._replace(offset=150)
    with pytest.raises(IntegrityViolation, match="duplicate .* offset 150: expected seq 3, got seq 1"):
        run("strict", pick(envs, 0, 1, 2) + [dup])


def test_strict_mode_requires_the_session_to_start_with_its_snapshot() -> None:
    envs = envelopes(typical().values)
    with pytest.raises(IntegrityViolation, match="missing_snapshot .* expected seq 0, got seq 1"):
        run("strict", pick(envs, 1, 2))


def test_digest_mismatch_in_strict_mode_stops_the_query() -> None:
    s = Session().upsert(1, 2.0)
    s.values.append(encode_end(SENSOR, SESSION, s.seq, 9, len(s.table), "0" * 64))
    with pytest.raises(IntegrityViolation, match="digest_mismatch .*end says 3 rows, digest 0000"):
        run("strict", envelopes(s.values))


def test_strict_mode_dead_letters_a_malformed_message_and_stops_at_the_gap_it_leaves() -> None:
    envs = envelopes(typical().values)
    bad = envs[1]._replace(value=b'{"sensor": "sensor-7", "seq": ')
    state, out = run("strict", [envs[0], bad])
    (dead,) = out.of("dead_letter")
    assert (dead["offset"], dead["value"], dead["key"]) == (101, bad.value, SESSION.encode())
    assert "not UTF-8 JSON" in dead["detail"]
    assert violations(out) == [("malformed", None, None)]
    assert state is not None and state.malformed == 1
    with pytest.raises(IntegrityViolation, match="gap .* expected seq 1, got seq 2"):
        SessionProcessor(PolicyConfig("strict")).apply(state, [envs[2]], NOW)


def test_strict_mode_stops_on_a_duplicate_of_a_closed_session() -> None:
    envs = envelopes(typical().values)
    state, _ = run("strict", envs)
    with pytest.raises(IntegrityViolation, match="duplicate .*session closed by end"):
        SessionProcessor(PolicyConfig("strict")).apply(state, [envs[-1]._replace(offset=999)], NOW)


# ---------------------------------------------------------------- ordered


def test_ordered_mode_records_a_gap_degrades_the_session_and_keeps_applying() -> None:
    s = typical()
    envs = envelopes(s.values)
    _, out = run("ordered", pick(envs, 0, 1, 4, 5, 6))
    assert violations(out)[0] == ("gap", 2, 4)
    gap = out.of("integrity")[0]
    assert (gap["missing_from"], gap["missing_to"], gap["offset"]) == (2, 3, 104)
    record = session_record(out)
    assert (record["status"], record["gaps"], record["degraded_from_seq"]) == ("degraded", 2, 2)
    assert record["digest_mismatches"] == 1  # the skipped updates are really missing from the table
    assert [c["seq"] for c in out.of("change")][-2:] == [4, 5]


def test_ordered_mode_drops_duplicates_and_late_messages_and_counts_them() -> None:
    s = typical()
    envs = envelopes(s.values)
    late = envs[2]._replace(offset=200)
    dup = envs[1]._replace(offset=201)
    _, out = run("ordered", pick(envs, 0, 1, 3, 4), [late, dup], pick(envs, 5, 6))
    assert [v[0] for v in violations(out)] == ["gap", "reorder", "duplicate", "digest_mismatch"]
    record = session_record(out)
    assert (record["duplicates"], record["reordered"], record["gaps"]) == (1, 1, 1)
    assert 2 not in [c["seq"] for c in out.of("change")]


def test_ordered_mode_reports_a_missing_snapshot_and_the_gap_before_it() -> None:
    envs = envelopes(typical().values)
    _, out = run("ordered", pick(envs, 1, 2))
    assert violations(out) == [("gap", 0, 1), ("missing_snapshot", 0, 1)]


# ---------------------------------------------------------------- once


def test_once_mode_rebuilds_the_table_from_any_order_and_removes_duplicates() -> None:
    s = typical()
    envs = envelopes(s.values)
    shuffled = [envs[3], envs[6], envs[1], envs[4], envs[0], envs[2], envs[3]._replace(offset=300), envs[5]]
    # Each envelope in its own batch, so arrival order (not offset order) is what the policy sees.
    state, out = run("once", *([e] for e in shuffled))
    record = session_record(out)
    assert (record["status"], record["digest"], record["duplicates"]) == ("ok", s.digest, 1)
    assert record["reordered"] > 0
    assert "duplicate" in [v[0] for v in violations(out)]


def test_once_mode_late_snapshot_fills_only_rows_no_later_seq_touched() -> None:
    s = Session(rows=3).upsert(1, 99.0).delete(2).end()
    envs = envelopes(s.values)
    _, out = run("once", [envs[1]], [envs[2]], [envs[3]], [envs[0]])
    record = session_record(out)
    assert (record["status"], record["digest"], record["row_count"]) == ("ok", s.digest, 2)
    snapshot_rows = [c["row_id"] for c in out.of("change") if c["op"] == "snapshot"]
    assert snapshot_rows == [0]


def test_once_mode_waits_for_missing_seqs_and_fails_when_the_session_times_out() -> None:
    envs = envelopes(typical().values)
    state, out = run("once", pick(envs, 0, 1, 4, 6))
    assert out.of("session") == []
    assert state is not None and not state.closed
    processor = SessionProcessor(PolicyConfig("once"))
    state, out = processor.expire(state, NOW + 10)
    record = session_record(out)
    assert (record["status"], record["closed_by"], record["gaps"]) == ("failed", "timeout", 3)
    gaps = [(r["missing_from"], r["missing_to"]) for r in out.of("integrity") if r["violation"] == "gap"]
    assert gaps == [(2, 3), (5, 5)]
    assert "timeout" in [v[0] for v in violations(out)]


def test_once_mode_closes_when_the_last_missing_seq_arrives_after_end() -> None:
    s = typical()
    envs = envelopes(s.values)
    _, out = run("once", pick(envs, 0, 1, 2, 4, 5, 6), [envs[3]])
    assert session_record(out)["status"] == "ok"
    assert session_record(out)["digest"] == s.digest


# ---------------------------------------------------------------- window


def test_window_mode_reorders_within_the_lateness_and_closes_ok() -> None:
    s = typical()
    envs = envelopes(s.values)
    _, out = run(
        "window", arrive(pick(envs, 0, 2, 3)), arrive(pick(envs, 1, 5, 4, 6), 2_000), window_messages=2
    )
    record = session_record(out)
    assert (record["status"], record["digest"], record["reordered"], record["gaps"]) == ("ok", s.digest, 2, 0)
    assert [c["seq"] for c in out.of("change")][3:] == [1, 2, 3, 4, 5]
    assert [v[0] for v in violations(out)] == ["reorder", "reorder"]


def test_window_mode_records_a_hole_as_a_gap_once_too_many_messages_wait_behind_it() -> None:
    s = typical()
    envs = envelopes(s.values)
    late = envs[1]._replace(offset=500)
    _, out = run("window", pick(envs, 0, 2, 3, 4), arrive([late] + pick(envs, 5, 6)), window_messages=2)
    assert violations(out)[0] == ("gap", 1, 2)
    record = session_record(out)
    assert (record["status"], record["gaps"], record["reordered"], record["degraded_from_seq"]) == (
        "degraded", 1, 1, 1,
    )  # fmt: skip


def test_window_mode_gives_up_a_hole_after_the_lateness_in_event_time() -> None:
    s = typical()
    envs = envelopes(s.values)  # event ts are 1000 + seq
    _, out = run("window", pick(envs, 0, 2, 3), window_ms=0)
    assert violations(out) == [("gap", 1, 2)]
    _, out = run("window", pick(envs, 0, 2, 3), window_ms=5)
    assert violations(out) == []


def test_window_mode_drops_duplicates_held_back_or_applied() -> None:
    envs = envelopes(typical().values)
    _, out = run("window", arrive(pick(envs, 0, 2, 2, 0)), window_messages=5)
    assert [v[0] for v in violations(out)] == ["duplicate", "duplicate"]


def test_window_mode_releases_held_back_messages_at_timeout_with_the_holes_as_gaps() -> None:
    s = typical()
    envs = envelopes(s.values)
    state, _ = run("window", pick(envs, 0, 2, 3, 4, 5, 6), window_messages=10)
    assert state is not None
    _, out = SessionProcessor(PolicyConfig("window", window_messages=10)).expire(state, NOW + 5)
    record = session_record(out)
    assert (record["status"], record["closed_by"], record["gaps"]) == ("degraded", "end", 1)


# ---------------------------------------------------------------- none


def test_none_mode_applies_everything_and_only_counts_anomalies() -> None:
    envs = envelopes(typical().values)
    _, out = run("none", arrive(pick(envs, 0, 2, 1, 1, 3, 4, 5, 6)))
    assert out.of("integrity") == []
    record = session_record(out)
    assert (record["gaps"], record["reordered"], record["duplicates"], record["messages"]) == (1, 1, 1, 8)


def test_none_mode_still_writes_integrity_records_for_malformed_messages() -> None:
    envs = envelopes(typical().values)
    _, out = run("none", [envs[0], envs[1]._replace(value=b"[]")])
    assert violations(out) == [("malformed", None, None)]


# ---------------------------------------------------------------- one anomaly, each policy (docs/pipeline.md)

WINDOW = {"window_messages": 2}


def outcome(policy: str, envs: list[Envelope]) -> str | tuple[list[tuple[Any, ...]], str]:
    """What a policy makes of one batch of a session: the violation that stopped it, or its integrity records
    and the status it closed with (timed out if it was still open). ``window`` waits behind 2 messages."""
    processor = SessionProcessor(PolicyConfig(policy, **WINDOW if policy == "window" else {}))
    try:
        state, out = processor.apply(None, envs, NOW)
        if state is not None and not state.closed:
            _, timed_out = processor.expire(state, NOW + 1)
            out.others += timed_out.others
    except IntegrityViolation as stop:
        return stop.violation
    return violations(out), session_record(out)["status"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("strict", "duplicate"),
        ("ordered", ([("duplicate", 3, 1)], "ok")),
        ("once", ([("duplicate", 3, 1)], "ok")),
        ("window", ([("duplicate", 3, 1)], "ok")),
        ("none", ([], "ok")),
    ],
)
def test_a_repeated_seq_stops_strict_is_dropped_and_recorded_or_under_none_applied_again(
    policy: str, expected: Any
) -> None:
    envs = envelopes(typical().values)
    assert outcome(policy, arrive(pick(envs, 0, 1, 2, 1, 3, 4, 5, 6))) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("strict", "gap"),
        ("ordered", ([("gap", 2, 3), ("digest_mismatch", None, None)], "degraded")),
        ("once", ([("gap", 2, None), ("timeout", 6, None)], "failed")),
        ("window", ([("gap", 2, 3), ("digest_mismatch", None, None)], "degraded")),
        ("none", ([], "degraded")),
    ],
)
def test_a_seq_that_never_comes_stops_strict_is_a_gap_and_makes_once_wait_and_fail(
    policy: str, expected: Any
) -> None:
    envs = envelopes(typical().values)
    assert outcome(policy, pick(envs, 0, 1, 3, 4, 5, 6)) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("strict", "gap"),
        ("ordered", ([("gap", 2, 3), ("reorder", 4, 2), ("digest_mismatch", None, None)], "degraded")),
        ("once", ([("reorder", 4, 2)], "ok")),
        ("window", ([("reorder", 2, 2)], "ok")),
        ("none", ([], "degraded")),
    ],
)
def test_a_seq_arriving_after_a_higher_one_is_restored_only_by_once_and_window(
    policy: str, expected: Any
) -> None:
    envs = envelopes(typical().values)
    assert outcome(policy, arrive(pick(envs, 0, 1, 3, 2, 4, 5, 6))) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("strict", "late_after_close"),
        ("ordered", ([("late_after_close", None, 7), ("duplicate", None, 1)], "ok")),
        ("once", ([("late_after_close", None, 7), ("duplicate", None, 1)], "ok")),
        ("window", ([("late_after_close", None, 7), ("duplicate", None, 1)], "ok")),
        ("none", ([], "ok")),
    ],
)
def test_messages_after_the_end_are_dropped_as_late_or_duplicate_and_stop_strict(
    policy: str, expected: Any
) -> None:
    s = typical().upsert(2, 99.0)  # seq 7, after the end
    envs = envelopes(s.values)
    assert outcome(policy, arrive(pick(envs, *range(8), 1))) == expected


def test_each_policy_is_one_class_chosen_once_from_the_config() -> None:
    assert sorted(POLICY_CLASSES) == sorted(POLICIES)
    for name in POLICIES:
        config = PolicyConfig(name, **WINDOW if name == "window" else {})
        policy = policy_for(config)
        assert isinstance(policy, Policy) and type(policy) is POLICY_CLASSES[name]
        assert (policy.name, policy.config) == (name, config)
        assert type(SessionProcessor(config).policy) is POLICY_CLASSES[name]


def test_session_state_tells_a_late_arrival_for_a_hole_from_a_duplicate() -> None:
    state = SessionState(SESSION, SENSOR, next_seq=10, missing=[(2, 4), (7, 7)])
    assert [state.seen(seq) for seq in (1, 3, 7, 9, 10)] == [True, False, False, True, False]
    assert state.take_missing(3) and state.missing == [(2, 2), (4, 4), (7, 7)]
    assert not state.take_missing(3) and state.seen(3)
    assert state.take_missing(7) and state.missing == [(2, 2), (4, 4)]


# ---------------------------------------------------------------- lifecycle


def test_a_quiet_session_times_out_and_leaves_a_marker_that_then_expires() -> None:
    envs = envelopes(typical().values)
    processor = SessionProcessor(PolicyConfig("ordered", session_timeout_ms=60_000))
    state, _ = processor.apply(None, envs[:3], NOW)
    assert state is not None and state.deadline_ms == NOW + 60_000
    state, out = processor.expire(state, NOW + 60_000)
    record = session_record(out)
    assert (record["status"], record["closed_by"], record["row_count"]) == ("timed_out", "timeout", 4)
    assert violations(out) == [("timeout", 3, None)]
    assert state is not None and state.closed and state.table == {}
    state, out = processor.expire(state, NOW + 120_000)
    assert state is None and len(out) == 0


def test_a_late_duplicate_of_a_closed_session_is_recognised_not_opened_as_a_new_session() -> None:
    envs = envelopes(typical().values)
    processor = SessionProcessor(PolicyConfig("ordered"))
    state, _ = processor.apply(None, pick(envs, 0, 1, 3, 4, 5, 6), NOW)
    state, out = processor.apply(state, [envs[0]._replace(offset=900), envs[2]._replace(offset=901)], NOW + 1)
    assert violations(out) == [("duplicate", None, 0), ("late_after_close", None, 2)]
    assert out.of("session") == [] and out.of("change") == []
    assert state is not None and state.closed


def test_malformed_messages_never_open_a_session() -> None:
    processor = SessionProcessor(PolicyConfig("ordered"))
    null_key = Envelope(TOPIC, 0, 1, None, encode_end(SENSOR, SESSION, 0, 1, 0, "a" * 64), 7)
    wrong_key = Envelope(TOPIC, 0, 2, b"other", encode_end(SENSOR, SESSION, 0, 1, 0, "a" * 64), 7)
    state, out = processor.apply(None, [null_key, wrong_key], NOW)
    assert state is None
    reasons = [d["detail"] for d in out.of("dead_letter")]
    assert reasons == ["key is null: messages must be keyed by their session", "key does not equal 'session'"]
    assert [d["sensor"] for d in out.of("dead_letter")] == [SENSOR, SENSOR]
    assert [d["event_ms"] for d in out.of("dead_letter")] == [7, 7]


def test_records_become_one_table_with_every_output_column() -> None:
    envs = envelopes(typical().values)
    _, out = run("ordered", [envs[0], envs[2], envs[1]._replace(value=b"x")])
    frame = out.to_arrow().to_pandas()
    assert tuple(frame.columns) == COLUMNS
    assert sorted(frame["record"].unique()) == ["change", "dead_letter", "integrity"]
    assert frame.loc[frame["record"] == "change", "seq"].tolist() == [0, 0, 0, 2]


def test_state_bytes_from_another_format_version_are_refused() -> None:
    import pickle

    from pipeline.errors import PipelineError

    with pytest.raises(PipelineError, match="format version 99"):
        SessionState.from_bytes(pickle.dumps((99, ())))


# A window session's state as sotw wrote it in checkpoint format 1: that of
# Session(rows=1).upsert(0, 1.5).upsert(1, 2.5).end() with its snapshot applied and seqs 2 and 3 (the end)
# held back, waiting for seq 1.
FORMAT_1_WINDOW_STATE = base64.b64decode(
    "gAWV1QEAAAAAAABLASiMBnNlc3MtMZSMCHNlbnNvci03lIlOiH2USwCMIXsiaWQiOjAsIm5hbWUiOiLDqTAiLCJ0ZW1wIjoyMC41"
    "fZRzfZRLAV2UfZQoSwIoTeoDjA1zb3R3LXNlbnNvci03lEsDS2ZDBnNlc3MtMZRDfnsic2Vuc29yIjoic2Vuc29yLTciLCJzZXNz"
    "aW9uIjoic2Vzcy0xIiwic2VxIjoyLCJraW5kIjoidXBkYXRlIiwidHMiOjEwMDIsIm9wIjoidXBzZXJ0Iiwicm93Ijp7ImlkIjox"
    "LCJ0ZW1wIjoyLjUsIm5hbWUiOiJ1MiJ9fZR0lEsDKE3rA2gHSwNLZ0MGc2Vzcy0xlEOceyJzZW5zb3IiOiJzZW5zb3ItNyIsInNl"
    "c3Npb24iOiJzZXNzLTEiLCJzZXEiOjMsImtpbmQiOiJlbmQiLCJ0cyI6MTAwMywicm93cyI6MiwiZGlnZXN0IjoiYjdmZDFlNDQz"
    "MjNmNTdhOTdlNmUzNjM4OGNkZmY0YmNjYTEwMzIyOTMwNjRiMmNhZWEyZTM4MGRkMDJkOGUxNiJ9lHSUdU5LAEsDTesDTesDaAdL"
    "A0tnS2RLAUsASwBLAEsASwBLAE5KwDBGAHSUhpQu"
)


def test_a_checkpoint_written_in_format_1_still_loads_and_the_session_resumes() -> None:
    s = Session(rows=1).upsert(0, 1.5).upsert(1, 2.5).end()
    state = SessionState.from_bytes(FORMAT_1_WINDOW_STATE)
    assert (state.next_seq, sorted(state.buffer), state.last_offset) == (1, [2, 3], 103)
    processor = SessionProcessor(PolicyConfig("window", window_messages=5))
    state, out = processor.apply(state, [envelopes(s.values)[1]], NOW)
    assert (session_record(out)["status"], session_record(out)["digest"]) == ("ok", s.digest)
    assert [c["seq"] for c in out.of("change")] == [1, 2]
    assert state is not None and state.closed and state.buffer == {}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"policy": "exact"}, "policy"),
        ({"policy": "ordered", "session_timeout_ms": 0}, "session_timeout_ms"),
        ({"policy": "window"}, "window_messages"),
        ({"policy": "ordered", "window_ms": 5}, "window_ms"),
        ({"policy": "window", "window_messages": -1}, "window_messages"),
    ],
)
def test_policy_config_rejects_bad_values_naming_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        PolicyConfig(**config)


def test_fast_canonical_row_writes_exactly_the_wire_formats_canonical_row() -> None:
    import struct

    from pipeline.state import fast_canonical_row
    from sotw.wire import canonical_row

    rng = random.Random(11)
    rows: list[dict[str, Any]] = [
        {"id": 1, chr(cp) + "k": chr(cp), "a" + chr(cp): cp}
        for cp in range(0x3100)
        if not 0xD800 <= cp <= 0xDFFF
    ]
    for _ in range(20_000):
        bits = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        x = bits if bits == bits and abs(bits) != float("inf") else 0.5
        rows.append(
            {"id": 2, "x": x, "y": round(rng.uniform(-1e5, 1e5), rng.randrange(7)), "z": 1e-5, "b": True}
        )
    rows.append({"id": 3, "nested": {"b": [1.5, None], "a": "é"}, "n": None})
    # Around the magnitudes where orjson and json.dumps write floats differently, text that only looks so, and
    # integers beyond 64 bits (orjson cannot write them).
    for x in (1e-4, 9.99e-5, -3e-5, 1e-7, 1.5e-10, 5e-324, 1e16, 1.5e16, 9999999999999998.0, 1e-4 + 1e-19):
        rows.append({"id": 4, "x": x, "s": "0.0000 and 1e-7 in text"})
        rows.append({"id": 5, "x": x})
    rows.append({"id": 6, "big": 2**64, "neg": -(2**63) - 1})
    assert [fast_canonical_row(r) for r in rows] == [canonical_row(r) for r in rows]


def _faulty_stream(rng: random.Random) -> list[bytes]:
    """Two sessions' worth of values under one key with every kind of fault the simulator injects."""
    values: list[bytes] = []
    for _ in range(2):
        s = Session(rows=4)
        for _ in range(rng.randrange(5, 40)):
            if rng.random() < 0.2:
                s.delete(rng.randrange(8))
            else:
                s.upsert(rng.randrange(8), round(rng.uniform(-50, 50), 3))
        if rng.random() < 0.8:
            s.end()
        values += s.values
    out: list[bytes] = []
    for v in values:
        roll = rng.random()
        if roll < 0.05:
            continue  # a gap
        if roll < 0.08:
            out.append(b'{"sensor": "sensor-7", "seq": tru')  # malformed
            continue
        out.append(v)
        if roll < 0.12:
            out.append(v)  # a duplicate
    for _ in range(len(out) // 10):  # some reordering
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


@pytest.mark.parametrize("policy", ["strict", "ordered", "once", "window", "none"])
def test_the_fast_path_for_plain_updates_gives_exactly_what_the_per_message_path_gives(policy: str) -> None:
    """``SessionProcessor(fast=True)`` (the default) must be a pure speed-up: same state, records, errors."""
    config: dict[str, Any] = {"window_messages": 3} if policy == "window" else {}
    rng = random.Random(7)
    for _ in range(60):
        envs = envelopes(_faulty_stream(rng))
        cuts = sorted(rng.sample(range(1, len(envs)), 3))
        batches = [envs[a:b] for a, b in zip([0, *cuts], [*cuts, len(envs)], strict=True)]
        results = []
        for fast in (True, False):
            processor = SessionProcessor(PolicyConfig(policy, **config), fast=fast)
            state: SessionState | None = None
            rows: list[dict[str, Any]] = []
            try:
                for i, batch in enumerate(batches):
                    state, records = processor.apply(state, batch, NOW + i)
                    rows += records.rows()
                    state = SessionState.from_bytes(state.to_bytes()) if state is not None else None
                outcome: Any = (state.to_bytes() if state is not None else None, rows)
            except IntegrityViolation as exc:
                outcome = (str(exc), rows)
            results.append(outcome)
        assert results[0] == results[1]


def test_a_block_of_changes_only_leaves_out_the_null_columns_and_reads_back_whole() -> None:
    envs = envelopes(typical().values)
    _, changes_only = run("ordered", envs[:3])
    _, mixed = run("ordered", [envs[0], envs[2], envs[1]._replace(value=b"x")])
    assert {r["record"] for r in changes_only.rows()} == {"change"}
    # Only the columns a change uses, in the output's column order.
    assert changes_only.to_arrow().column_names == [
        c for c in COLUMNS if c == "record" or c in CHANGE_COLUMNS
    ]
    table = from_blocks([changes_only.to_block(), pa.py_buffer(mixed.to_block())])
    assert table.schema == ARROW_SCHEMA
    assert table.to_pylist() == changes_only.rows() + mixed.rows()
