"""The whole pipeline on a real broker and a real SparkSession, checked against the simulator's truth."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from pipeline import query
from pipeline.config import PipelineConfig
from pipeline.errors import IntegrityStopped
from pipeline.inspect import read_dataset, render, summarize_output
from pipeline.policies import PolicyConfig
from pipeline.progress import input_messages
from pipeline.sinks import committed_batches
from simulator import FaultConfig
from sotw.kafka import topic_pattern


def pipeline_config(
    kafka, prefix: str, where: Path, policy: str = "ordered", **policy_args
) -> PipelineConfig:
    return PipelineConfig(
        kafka=kafka,
        output=where / "output",
        checkpoint=where / "checkpoint",
        pattern=topic_pattern(prefix),
        policy=PolicyConfig(policy, **policy_args),
        trigger_ms=None,  # availableNow: drain what is there, then stop
        discovery_interval_ms=0,
    )


def truth_sessions(run_dir: Path) -> dict[str, dict]:
    return {r["session"]: r for r in pq.read_table(run_dir / "truth" / "sessions.parquet").to_pylist()}


def ledger(run_dir: Path) -> list[dict]:
    return pq.read_table(run_dir / "ledger").to_pylist()


def sessions_out(output: Path) -> dict[str, dict]:
    table = read_dataset(output, "sessions")
    return {} if table is None else {r["session"]: r for r in table.to_pylist()}


def rows_of(output: Path, name: str) -> list[dict]:
    table = read_dataset(output, name)
    return [] if table is None else table.to_pylist()


def canon(rows: list[dict]) -> list[tuple]:
    """Rows without the columns that depend on how the stream was cut into batches."""
    drop = {"batch_id", "processed_ms", "date"}
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in drop)) for r in rows)


def test_a_fault_free_run_is_rebuilt_exactly(spark, kafka, simulate, tmp_path):
    summary, config = simulate(sensors=3, rows=30, duration_s=1.5, session_interval_s=0.5, partitions=2)
    cfg = pipeline_config(kafka, config.topic_prefix, tmp_path)
    status_lines: list[dict] = []
    query.run(spark, cfg, on_progress=status_lines.append)

    truth = {s: t for s, t in truth_sessions(summary.run_dir).items() if t["status"] == "ended"}
    out = sessions_out(cfg.output)
    assert len(truth) >= 6
    assert set(out) == set(truth)
    for session, t in truth.items():
        assert out[session]["status"] == "ok", out[session]
        assert (out[session]["digest"], out[session]["row_count"]) == (t["digest"], t["rows"])
    assert rows_of(cfg.output, "integrity") == []
    assert rows_of(cfg.output, "dead_letters") == []
    # Every update and snapshot row of the ledger is one change row, none repeated.
    changes = rows_of(cfg.output, "changes")
    keys = [(c["session"], c["seq"], c["row_id"]) for c in changes]
    assert len(keys) == len(set(keys))
    updates = sum(1 for r in ledger(summary.run_dir) if r["kind"] == "update")
    assert sum(1 for c in changes if c["op"] != "snapshot") == updates
    text = render(summarize_output(cfg.output), cfg.output)
    assert f"ok                 {len(truth):>8,}" in text
    # Every row names the batch that wrote it and when that batch ran, as the batch's commit marker does,
    # and nothing is left in staging.
    markers = {
        b: json.loads((cfg.output / "_commits" / f"{b}.json").read_text())
        for b in committed_batches(cfg.output)
    }
    for row in [*changes, *out.values()]:
        assert row["processed_ms"] == markers[row["batch_id"]]["processed_ms"]
    assert not list((cfg.output / "_staging").rglob("*.parquet"))
    # The progress log: one line per committed batch, counting every delivered message once, with the lag.
    progress = [json.loads(line) for line in cfg.progress_file.read_text().splitlines()]
    assert [p["batchId"] for p in progress] == committed_batches(cfg.output)
    delivered = sum(1 for r in ledger(summary.run_dir) if r["delivered"])
    assert sum(input_messages(p) for p in progress) == delivered
    assert progress[-1]["sources"][0]["metrics"]["offsetsBehindLatest"] == "0"
    assert [line["batch"] for line in status_lines] == [p["batchId"] for p in progress]


def test_strict_stops_at_the_first_gap_naming_session_and_offsets(spark, kafka, simulate, tmp_path):
    summary, config = simulate(sensors=2, rows=20, duration_s=1.0, partitions=1, faults=FaultConfig(gap=0.02))
    gaps = [r for r in ledger(summary.run_dir) if r["fault"] == "gap"]
    assert gaps
    cfg = pipeline_config(kafka, config.topic_prefix, tmp_path, "strict")
    with pytest.raises(IntegrityStopped) as stopped:
        query.run(spark, cfg)
    message = str(stopped.value)
    gap_sessions = {r["session"] for r in gaps}
    named = re.search(r"session '([^']+)'", message)
    assert named and named.group(1) in gap_sessions, message
    stop = re.search(r"topic '(.+)' partition (\d+) offset (\d+): expected seq (\d+), got seq (\d+)", message)
    assert stop, message
    # The stop batch is committed with every stopped session's violation, the one the message names among them.
    integrity = rows_of(cfg.output, "integrity")
    assert message.startswith("strict policy: gap in session"), message
    assert {r["violation"] for r in integrity} == {"gap"}
    assert len({r["session"] for r in integrity}) == len(integrity)
    named_row = next(r for r in integrity if r["session"] == named.group(1))
    topic, partition, offset, expected, got = stop.groups()
    position = (named_row["topic"], named_row["partition"], named_row["offset"])
    assert position == (topic, int(partition), int(offset))
    assert (named_row["expected_seq"], named_row["got_seq"]) == (int(expected), int(got))
    assert (named_row["missing_from"], named_row["missing_to"]) == (int(expected), int(got) - 1)
    # Nothing of the stopped session from the violating message on was applied.
    changes = rows_of(cfg.output, "changes")
    assert all(c["seq"] < int(got) for c in changes if c["session"] == named.group(1))
    # Under strict a session closes only if nothing was wrong with it.
    assert all(s["status"] == "ok" for s in sessions_out(cfg.output).values())


SENSOR = "sensor-0003"


def produce_a_gap_beside_a_whole_session(kafka, unique_prefix) -> tuple[str, str]:
    """One topic of one partition where session ``a`` is whole and session ``b`` skips seq 2 (offset 4 has its
    seq 3); returns (topic prefix, topic)."""
    from sotw.kafka import ensure_topics
    from sotw.wire import encode_end, encode_snapshot, encode_update, table_digest

    prefix = unique_prefix()
    topic = prefix + "0003"
    ensure_topics(kafka, {topic: 1})
    rows = [{"id": 0, "temp": 20.0}, {"id": 1, "temp": 21.0}]

    def update(session: str, seq: int) -> tuple[str, bytes]:
        row = {"id": 0, "temp": float(seq)}
        return session, encode_update(SENSOR, session, seq, 1_000 + seq, "upsert", row)

    end_of_a = encode_end(SENSOR, "a", 2, 1_002, 2, table_digest([{"id": 0, "temp": 1.0}, rows[1]]))
    produce(
        kafka,
        topic,
        [
            ("a", encode_snapshot(SENSOR, "a", 0, 1_000, rows)),  # offset 0
            ("b", encode_snapshot(SENSOR, "b", 0, 1_000, rows)),
            update("a", 1),
            update("b", 1),  # offset 3: the last of b applied
            update("b", 3),  # offset 4: seq 2 is missing, strict stops here
            ("a", end_of_a),
            update("b", 4),
        ],
    )
    return prefix, topic


def committed_rows(output: Path) -> dict[str, list[str]]:
    """Every committed row of every dataset, batch ids included, in a comparable form."""
    datasets = ("changes", "sessions", "integrity", "dead_letters")
    return {name: sorted(map(repr, rows_of(output, name))) for name in datasets}


def check_a_strict_stop_is_committed_and_stops_a_restart_again(
    spark, kafka, unique_prefix, where: Path, **changes
) -> PipelineConfig:
    """Run strict over ``produce_a_gap_beside_a_whole_session``'s topic (with ``changes`` to the config), then
    restart it: both stop at b's gap, and the stop batch, b's violation in it, is committed once."""
    prefix, topic = produce_a_gap_beside_a_whole_session(kafka, unique_prefix)
    cfg = replace(pipeline_config(kafka, prefix, where, "strict"), **changes)
    with pytest.raises(IntegrityStopped) as stopped:
        query.run(spark, cfg)
    assert str(stopped.value) == (
        f"strict policy: gap in session 'b' of sensor '{SENSOR}' at topic '{topic}' partition 0 offset 4: "
        "expected seq 2, got seq 3 (last applied offset: 3)"
    )
    (gap,) = rows_of(cfg.output, "integrity")
    assert {k: gap[k] for k in ("violation", "sensor", "session", "expected_seq", "got_seq")} == {
        "violation": "gap", "sensor": SENSOR, "session": "b", "expected_seq": 2, "got_seq": 3,
    }  # fmt: skip
    assert (gap["missing_from"], gap["missing_to"], gap["topic"], gap["partition"], gap["offset"]) == (
        2, 2, topic, 0, 4,
    )  # fmt: skip
    # b's changes before the gap are committed, none from it on; a, closed in the same batch, is committed whole.
    changes = rows_of(cfg.output, "changes")
    assert sorted({(c["session"], c["seq"]) for c in changes}) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert {s: r["status"] for s, r in sessions_out(cfg.output).items()} == {"a": "ok"}
    assert {r["batch_id"] for r in changes} == {gap["batch_id"]}

    before = committed_rows(cfg.output)
    with pytest.raises(IntegrityStopped) as again:
        query.run(spark, cfg)
    assert str(again.value) == str(stopped.value)
    assert committed_rows(cfg.output) == before
    return cfg


def test_a_strict_stop_commits_its_violation_with_the_batch_and_a_restart_stops_there_again(
    spark, kafka, unique_prefix, tmp_path
):
    cfg = check_a_strict_stop_is_committed_and_stops_a_restart_again(spark, kafka, unique_prefix, tmp_path)
    (batch,) = committed_batches(cfg.output)
    stop = json.loads((cfg.output / "_commits" / f"{batch}.json").read_text())["stop"]
    assert (stop["violation"], stop["session"], stop["offset"], stop["last_offset"]) == ("gap", "b", 4, 3)


def test_ordered_marks_sessions_degraded_from_the_first_gap_and_quarantines_malformed(
    spark, kafka, simulate, tmp_path
):
    faults = FaultConfig(gap=0.01, duplicate=0.01, malformed=0.01)
    summary, config = simulate(sensors=3, rows=20, duration_s=1.5, partitions=1, faults=faults, seed=11)
    cfg = pipeline_config(kafka, config.topic_prefix, tmp_path, "ordered")
    query.run(spark, cfg)

    led = ledger(summary.run_dir)
    lost = {}  # session -> first seq that never arrived intact (a gap, or a malformed stand-in)
    for r in led:
        if r["fault"] in ("gap", "malformed") and r["kind"] != "end":
            lost[r["session"]] = min(lost.get(r["session"], r["seq"]), r["seq"])
    out = sessions_out(cfg.output)
    truth = truth_sessions(summary.run_dir)
    assert lost
    for session, first in lost.items():
        if session in out and truth[session]["last_seq"] > first:
            assert out[session]["status"] == "degraded"
            assert out[session]["degraded_from_seq"] == first
    for session, rec in out.items():
        if session not in lost and truth[session]["status"] == "ended":
            assert rec["status"] == "ok" and rec["digest"] == truth[session]["digest"]
    malformed = [r for r in led if r["fault"] == "malformed"]
    dead = rows_of(cfg.output, "dead_letters")
    assert sorted((d["topic"], d["partition"], d["offset"]) for d in dead) == sorted(
        (r["topic"], r["partition"], r["offset"]) for r in malformed
    )
    dups = sum(1 for r in led if r["fault"] == "duplicate")
    assert sum(s["duplicates"] for s in out.values()) >= min(1, dups)


@pytest.mark.parametrize(("policy", "args"), [("once", {}), ("window", {"window_messages": 1000})])
def test_reordered_messages_still_rebuild_the_true_table(spark, kafka, simulate, tmp_path, policy, args):
    faults = FaultConfig(delayed=0.05, delay_ms=20, delay_max_ms=100)
    summary, config = simulate(sensors=2, rows=20, duration_s=1.5, partitions=1, faults=faults, seed=5)
    assert any(r["fault"] == "delayed" for r in ledger(summary.run_dir))
    cfg = pipeline_config(kafka, config.topic_prefix, tmp_path, policy, **args)
    query.run(spark, cfg)
    truth = {s: t for s, t in truth_sessions(summary.run_dir).items() if t["status"] == "ended"}
    out = sessions_out(cfg.output)
    assert set(truth) <= set(out)
    for session, t in truth.items():
        assert (out[session]["status"], out[session]["digest"]) == ("ok", t["digest"]), out[session]


def test_a_killed_pipeline_restarts_without_losing_or_repeating_output(spark, kafka, simulate, tmp_path):
    summary, config = simulate(sensors=4, rows=40, duration_s=4.0, rate=3000.0, partitions=2, seed=21)
    pattern = topic_pattern(config.topic_prefix)
    # Reference: one uninterrupted run.
    reference = pipeline_config(kafka, config.topic_prefix, tmp_path / "reference")
    query.run(spark, reference)

    where = tmp_path / "killed"
    argv = [
        sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap, "--pattern", pattern,
        "--output", str(where / "output"), "--checkpoint", str(where / "checkpoint"),
        "--max-offsets-per-trigger", "1500", "--trigger", "200ms", "-q",
    ]  # fmt: skip
    commits = where / "output" / "_commits"
    kill_mid_run_then_drain(argv, lambda: len(list(commits.glob("*.json"))) >= 3)

    for name in ("changes", "sessions", "integrity", "dead_letters"):
        assert canon(rows_of(where / "output", name)) == canon(rows_of(reference.output, name)), name


def kill_mid_run_then_drain(argv: list[str], written: Callable[[], bool]) -> None:
    """Start ``sotw pipeline`` (``argv`` ending in ``--max-offsets-per-trigger N --trigger X -q``), SIGKILL its
    whole process tree once ``written()`` holds, then run it again with ``availableNow`` until it has drained."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not written() and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    family = psutil.Process(proc.pid).children(recursive=True)  # the JVM and its Python workers
    proc.kill()
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait()
    done = subprocess.run([*argv[:-5], "--trigger", "availableNow", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def produce(kafka, topic: str, messages: list[tuple[str, bytes]]) -> None:
    """Produce ``(key, value)`` pairs to partition 0 of ``topic``, in order, and wait for every ack."""
    from confluent_kafka import Producer

    producer = Producer(kafka.client(**{"enable.idempotence": True}))
    for key, value in messages:
        producer.produce(topic, value=value, key=key.encode(), partition=0)
    assert producer.flush(10) == 0


def test_a_timeout_and_new_data_of_one_sensor_in_one_batch_are_both_published(
    spark, kafka, unique_prefix, tmp_path
):
    """The pass over timed-out sessions and the pass over new data run in one task; their files must not clash."""
    from sotw.kafka import ensure_topics
    from sotw.wire import encode_end, encode_snapshot, table_digest

    topic = unique_prefix() + "0007"
    ensure_topics(kafka, {topic: 1})
    rows = [{"id": i, "temp": 20.0 + i} for i in range(3)]
    # Session a: a snapshot and no end, so it times out; session b of the same sensor: complete.
    produce(kafka, topic, [("a", encode_snapshot("sensor-0007", "a", 0, 1_000, rows))])
    cfg = pipeline_config(kafka, topic[: -len("0007")], tmp_path, "ordered", session_timeout_ms=1_000)
    query.run(spark, cfg)
    time.sleep(1.5)  # past a's timeout: the next batch expires it while it applies b
    produce(
        kafka,
        topic,
        [
            ("b", encode_snapshot("sensor-0007", "b", 0, 3_000, rows)),
            ("b", encode_end("sensor-0007", "b", 1, 3_001, len(rows), table_digest(rows))),
        ],
    )
    query.run(spark, cfg)

    out = sessions_out(cfg.output)
    assert {s: (r["status"], r["closed_by"]) for s, r in out.items()} == {
        "a": ("timed_out", "timeout"),
        "b": ("ok", "end"),
    }
    timeouts = [r for r in rows_of(cfg.output, "integrity") if r["violation"] == "timeout"]
    assert [r["session"] for r in timeouts] == ["a"]
    # Both records were made in the same batch, by the two passes of one task.
    assert out["a"]["batch_id"] == out["b"]["batch_id"]


def put_back_one_batch(checkpoint: Path) -> int:
    """Make ``checkpoint`` what a backup taken just before its last batch would be; return that batch."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for log in ("commits", "offsets"):
        for name in (str(last), f".{last}.crc"):
            (checkpoint / log / name).unlink(missing_ok=True)
    version = last + 1  # the state version batch `last` committed
    names = {f"{version}.{kind}" for kind in ("delta", "snapshot")}
    for path in list((checkpoint / "state").rglob("*")):
        if path.name in names or path.name.lstrip(".").removesuffix(".crc") in names:
            path.unlink()
    return last


@pytest.mark.slow  # over 20 s on CI: the nightly job runs it (make test-slow)
def test_a_checkpoint_restored_one_batch_back_is_refused_then_rolled_back_without_losing_rows(
    spark, kafka, simulate, tmp_path
):
    from pipeline.errors import PipelineError
    from pipeline.recovery import rollback

    _, config = simulate(sensors=3, rows=20, duration_s=1.5, partitions=1, seed=31)
    cfg = replace(
        pipeline_config(kafka, config.topic_prefix, tmp_path / "restored"), max_offsets_per_trigger=800
    )
    query.run(spark, cfg)
    last = put_back_one_batch(cfg.checkpoint)
    assert last >= 2
    simulate(
        name="more",
        sensors=3,
        rows=20,
        duration_s=1.5,
        partitions=1,
        seed=32,
        topic_prefix=config.topic_prefix,
    )

    # The restart plans batch `last` again, over more offsets than the output's batch `last` holds.
    with pytest.raises(PipelineError, match=rf"batch {last} is already in the output .* other offsets"):
        query.run(spark, cfg)
    removed = rollback(cfg.output, cfg.checkpoint, last - 1)
    assert removed.batches == [last]
    query.run(spark, cfg)

    reference = replace(
        pipeline_config(kafka, config.topic_prefix, tmp_path / "reference"), max_offsets_per_trigger=800
    )
    query.run(spark, reference)
    for name in ("changes", "sessions", "integrity", "dead_letters"):
        assert canon(rows_of(cfg.output, name)) == canon(rows_of(reference.output, name)), name
