"""Triage against the real broker: each discrepancy is blamed on the layer that lost the message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from loadtest.correctness.expect import build_expectation, read_ledger, read_truth
from loadtest.correctness.output import read_output
from loadtest.correctness.policies import Policy
from loadtest.correctness.triage import KafkaReader, Triager
from loadtest.correctness.verify import verify
from loadtest.reports.results import Discrepancy
from sotw.kafka import KafkaConfig, ensure_topics
from tests.loadtest.builders import Output, SessionSpec, ledger_rows, write_run


def produce(kafka: KafkaConfig, topic: str, values: list[bytes], key: bytes) -> list[int]:
    offsets: list[int] = []
    producer = Producer(kafka.client(**{"acks": "all"}))
    for value in values:
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=0,
            on_delivery=lambda err, msg: offsets.append(msg.offset() if err is None else -1),
        )
    assert producer.flush(15) == 0
    return offsets


def two_sessions(kafka: KafkaConfig, prefix: str) -> tuple[SessionSpec, SessionSpec]:
    """Sessions s1 and s2 on topics of their own."""
    one, two = SessionSpec(session="s1", sensor=f"{prefix}1"), SessionSpec(session="s2", sensor=f"{prefix}2")
    ensure_topics(kafka, {one.topic: 1, two.topic: 1})
    return one, two


def unsent_seq3(kafka: KafkaConfig, spec: SessionSpec) -> list[dict[str, Any]]:
    """A session's ledger whose seq 3 the producer never got acknowledged; the others on its topic as acknowledged."""
    sent = (0, 1, 2, 4, 5, 6)
    assert produce(kafka, spec.topic, [spec.value(s) for s in sent], spec.session.encode()) == list(range(6))
    return ledger_rows(spec, [(s, "none") for s in sent], unsent={3: "none"})


def with_unsent_seq3(out: Output, spec: SessionSpec) -> Output:
    """``out`` plus what a pipeline writes for ``unsent_seq3``: every seq it got, closed ``ok``."""
    return out.apply(spec, 0, 1, 2, 4, 5).session(spec, "ok", applied=[0, 1, 2, 4, 5])


def test_each_lost_message_is_blamed_on_producer_broker_or_pipeline(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    lost, unsent = two_sessions(kafka, unique_prefix())
    # The broker kept seqs 0-3, 5 and 6 but lost seq 4: offset 4 now holds seq 5 and offset 6 nothing.
    offsets = produce(kafka, lost.topic, [lost.value(s) for s in (0, 1, 2, 3, 5, 6)], b"s1")
    assert offsets == [0, 1, 2, 3, 4, 5]
    run = tmp_path / "run"
    write_run(
        run, ledger_rows(lost, [(s, "none") for s in range(7)]) + unsent_seq3(kafka, unsent), [lost, unsent]
    )
    out = with_unsent_seq3(Output().apply(lost, 0, 1, 2, 5).session(lost, "ok", applied=[0, 1, 2, 5]), unsent)
    expectation = build_expectation(Policy("none"), read_ledger(run), read_truth(run))
    with Triager(expectation.ledger, kafka) as triager:
        result = verify(expectation, read_output(out.write(tmp_path / "out")), triager)

    blamed = {(d.kind, d.session, d.seq): d.triage for d in result.discrepancies}
    pipeline = blamed[("lost_row", "s1", 3)]
    assert pipeline is not None and (pipeline.layer, pipeline.in_kafka) == ("pipeline", True)
    broker = blamed[("lost_row", "s1", 4)]
    assert broker is not None and (broker.layer, broker.delivered, broker.in_kafka) == ("broker", True, False)
    assert "different value" in broker.detail
    producer = blamed[("not_delivered", "s2", 3)]
    assert producer is not None and (producer.layer, producer.sent) == ("producer", False)
    # By the ledger seq 6 was acknowledged at offset 6, where the partition now ends: the broker gave it away.
    assert blamed[("broker_lost", "s1", 6)] is not None
    assert result.blame["producer"] == 1 and result.blame["broker"] == 2


def test_a_delivered_offset_past_the_end_of_the_partition_is_the_brokers_fault(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    spec = SessionSpec(sensor=f"{unique_prefix()}1")
    ensure_topics(kafka, {spec.topic: 1})
    produce(kafka, spec.topic, [spec.value(0), spec.value(1)], b"s1")
    ledger = ledger_rows(spec, [(0, "none"), (1, "none"), (2, "none")])
    run = tmp_path / "run"
    write_run(run, ledger, [spec])
    with Triager(read_ledger(run), kafka) as triager:
        missing = triager.triage(Discrepancy("lost_row", "s1", "x", seq=2))
        present = triager.triage(Discrepancy("lost_row", "s1", "x", seq=1))
    assert (missing.layer, missing.in_kafka) == ("broker", False)
    assert "absent" in missing.detail
    assert (present.layer, present.in_kafka) == ("pipeline", True)


def test_reader_finds_every_record_of_the_last_batch(
    kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    # Every record of a producer batch is found, the batch's last one too; past the end there is none.
    topic = f"{unique_prefix()}batch"
    ensure_topics(kafka, {topic: 1})
    values = [f"v{i}".encode() for i in range(50)]
    offsets = produce(kafka, topic, values, b"k")
    reader = KafkaReader(kafka)
    try:
        assert [reader.read(topic, 0, o) for o in offsets] == values
        assert reader.read(topic, 0, 50) is None
    finally:
        reader.close()


def test_a_copy_acknowledged_without_an_offset_is_looked_for_between_its_neighbours(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    # librdkafka reports an idempotent retry the broker already had as delivered with offset -1001, so the
    # ledger has the copy as delivered with no offset; that is not the producer's fault.
    kept = SessionSpec(session="s1", sensor=f"{unique_prefix()}1")
    ensure_topics(kafka, {kept.topic: 1})
    assert produce(kafka, kept.topic, [kept.value(s) for s in (0, 1, 2, 4)], b"s1") == [0, 1, 2, 3]
    ledger = ledger_rows(kept, [(s, "none") for s in range(5)])
    for row in ledger:
        if row["seq"] in (2, 3):
            row["offset"] = None  # both acknowledged without an offset; seq 3 never reached the broker
    run = tmp_path / "run"
    write_run(run, ledger, [kept])
    with Triager(read_ledger(run), kafka) as triager:
        in_kafka = triager.triage(Discrepancy("lost_row", "s1", "x", seq=2))
        lost = triager.triage(Discrepancy("lost_row", "s1", "x", seq=3))
    assert (in_kafka.layer, in_kafka.delivered, in_kafka.in_kafka) == ("pipeline", True, True)
    assert "@2" in in_kafka.detail
    assert (lost.layer, lost.delivered, lost.in_kafka) == ("broker", True, False)


def test_a_sessions_damage_from_messages_the_broker_lost_is_blamed_on_the_broker(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    spec = SessionSpec(session="s1", sensor=f"{unique_prefix()}1")
    ensure_topics(kafka, {spec.topic: 1})
    # Acknowledged at offsets 0-4, but the broker kept only seqs 0, 1, 3, 4 (seq 2 is gone).
    assert produce(kafka, spec.topic, [spec.value(s) for s in (0, 1, 3, 4)], b"s1") == [0, 1, 2, 3]
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, [(s, "none") for s in range(5)]), [spec])
    # The pipeline applied all it could read; its table cannot be the truth without seq 2.
    out = Output().apply(spec, 0, 1, 3, 4).session(spec, "ok", applied=[0, 1, 3, 4])
    expectation = build_expectation(Policy("none"), read_ledger(run), read_truth(run))
    with Triager(expectation.ledger, kafka) as triager:
        result = verify(expectation, read_output(out.write(tmp_path / "out")), triager)

    kinds = {d.kind: d.triage.layer for d in result.discrepancies if d.triage is not None}
    assert kinds.get("lost_row") == "broker"
    session_level = {k: v for k, v in kinds.items() if k not in ("lost_row", "missing_session")}
    assert session_level and set(session_level.values()) == {"broker"}, kinds
    assert "pipeline" not in result.blame


def test_beyond_the_read_back_limit_a_sessions_damage_is_unknown_and_the_ledger_still_names_the_producer(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    lost, unsent = two_sessions(kafka, unique_prefix())
    # As above, the broker lost seq 2 of s1; s2's seq 3 was never acknowledged. No read back is allowed.
    assert produce(kafka, lost.topic, [lost.value(s) for s in (0, 1, 3, 4)], b"s1") == [0, 1, 2, 3]
    run = tmp_path / "run"
    write_run(
        run, ledger_rows(lost, [(s, "none") for s in range(5)]) + unsent_seq3(kafka, unsent), [lost, unsent]
    )
    out = with_unsent_seq3(Output().apply(lost, 0, 1, 3, 4).session(lost, "ok", applied=[0, 1, 3, 4]), unsent)
    expectation = build_expectation(Policy("none"), read_ledger(run), read_truth(run))
    with Triager(expectation.ledger, kafka, limit=0) as triager:
        result = verify(expectation, read_output(out.write(tmp_path / "out")), triager)

    layers = {(d.session, d.kind): d.triage.layer for d in result.discrepancies if d.triage is not None}
    assert layers[("s1", "lost_row")] == "unknown"
    # By the ledger seq 4 sat at offset 4, where the partition now ends: gone, whatever is read back.
    assert layers.pop(("s1", "broker_lost")) == "broker"
    assert {layer for (session, _), layer in layers.items() if session == "s1"} == {"unknown"}, layers
    assert layers[("s2", "not_delivered")] == "producer"
    assert "pipeline" not in result.blame, layers


def test_acknowledged_messages_past_where_the_partition_now_ends_are_what_the_broker_gave_away(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    spec = SessionSpec(session="s1", sensor=f"{unique_prefix()}1")
    ensure_topics(kafka, {spec.topic: 1})
    # Acknowledged at offsets 0-5 and read by the pipeline, but the partition now ends at 4 (an unclean
    # election before anything new was written over seqs 4 and 5).
    assert produce(kafka, spec.topic, [spec.value(s) for s in range(4)], b"s1") == [0, 1, 2, 3]
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, [(s, "none") for s in range(6)]), [spec])
    out = Output().apply(spec, *range(6)).session(spec, "ok", applied=list(range(6)))
    expectation = build_expectation(Policy("none"), read_ledger(run), read_truth(run))
    with Triager(expectation.ledger, kafka) as triager:
        result = verify(expectation, read_output(out.write(tmp_path / "out")), triager)

    gave_away = [d for d in result.discrepancies if d.kind == "broker_lost"]
    assert [d.seq for d in gave_away] == [4, 5]
    assert all("the partition now ends at 4" in d.detail for d in gave_away)
    assert all(d.triage is not None and d.triage.layer == "broker" for d in gave_away)
    assert "pipeline" not in result.blame


def test_a_lost_row_the_broker_no_longer_has_is_its_loss_without_reading_it_back(
    tmp_path: Path, kafka: KafkaConfig, unique_prefix: Callable[[], str]
) -> None:
    spec = SessionSpec(session="s1", sensor=f"{unique_prefix()}1")
    ensure_topics(kafka, {spec.topic: 1})
    # Seqs 0-5 acknowledged at offsets 0-5; the partition now ends at 4 and the pipeline never saw seq 5.
    assert produce(kafka, spec.topic, [spec.value(s) for s in range(4)], b"s1") == [0, 1, 2, 3]
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, [(s, "none") for s in range(6)]), [spec])
    out = Output().apply(spec, *range(5)).session(spec, "ok", applied=list(range(5)))
    expectation = build_expectation(Policy("none"), read_ledger(run), read_truth(run))
    with Triager(expectation.ledger, kafka, limit=0) as triager:  # no read back at all
        result = verify(expectation, read_output(out.write(tmp_path / "out")), triager)

    lost = {d.seq: d.triage for d in result.discrepancies if d.kind == "lost_row"}
    assert lost[5] is not None and lost[5].layer == "broker" and "no longer has" in lost[5].detail
    assert [d.seq for d in result.discrepancies if d.kind == "broker_lost"] == [4]
    assert "unknown" not in result.blame and "pipeline" not in result.blame
