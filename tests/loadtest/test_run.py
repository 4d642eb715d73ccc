"""A real run of the whole system: a local Kafka broker, the pipeline, the simulator, verdict and report."""

from __future__ import annotations

import dataclasses
import json

import pytest

from loadtest.reports.results import Results
from loadtest.run.profile import load_profile
from loadtest.run.runner import RunRequest, execute
from sotw.kafka import KafkaConfig


@pytest.fixture(scope="module")
def smoke():
    """The smoke profile, with lag, latency and drain bounds wide enough for a busy 2-core CI machine.

    The verdict's speed criteria are exercised by the benchmarks; here the run must be correct and drain.
    """
    profile = load_profile("smoke")
    wide = dataclasses.replace(profile.run, max_lag_s=600, max_end_to_end_p99_s=None, drain_max_s=300)
    return dataclasses.replace(profile, run=wide)


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_a_run_on_spark_s_kafka_connector_killed_mid_run_passes_with_its_lag_from_the_checkpoint(
    smoke, kafka: KafkaConfig, tmp_path
):
    from loadtest.gameday.incidents import incident_from_mapping

    on_spark = dataclasses.replace(
        smoke,
        pipeline=dataclasses.replace(smoke.pipeline, source="spark-kafka"),
        run=dataclasses.replace(smoke.run, steady_s=16.0),
    )
    kill = incident_from_mapping({"kind": "pipeline_kill", "at_s": 3, "restart_after_s": 2}, "test")
    result = execute(RunRequest(on_spark, 1.0, tmp_path / "run", kafka, incidents=(kill,)))

    assert result.verdict.verdict == "PASS", result.verdict.reasons
    assert [i.kind for i in result.incidents] == ["pipeline_kill"]
    c = result.correctness
    # Every row's values checked against its message; no session need be fault-free (all 16 once had a gap).
    assert c is not None and c.rows_lost == c.rows_repeated == c.rows_wrong == 0
    assert c.rows_values_checked == c.rows_written > 0
    assert result.run.profile["pipeline"]["source"] == "spark-kafka"
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    drained = [s for s in samples if s["phase"] == "settle"]
    assert drained and drained[-1]["consumed"] == drained[-1]["sent"] and drained[-1]["lag_offsets"] == 0
    # The lag was read from the connector's offsets in the checkpoint: its last batch ends where the topics do.
    offsets = tmp_path / "run" / "pipeline" / "checkpoint" / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    positions = json.loads((offsets / str(last)).read_text().splitlines()[-1])
    assert sum(o for parts in positions.values() for o in parts.values()) == drained[-1]["consumed"]


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_a_pipeline_that_skips_a_batch_fails_and_is_blamed(smoke, kafka: KafkaConfig, tmp_path):
    from loadtest.reports.report import write_report

    quick = dataclasses.replace(smoke, run=dataclasses.replace(smoke.run, steady_s=6.0))
    result = execute(RunRequest(quick, 1.0, tmp_path / "broken", kafka, pipeline_args=("--drop-batch", "2")))

    assert result.verdict.verdict == "FAIL"
    assert result.correctness is not None and result.correctness.rows_lost > 0
    assert result.correctness.blame.get("pipeline", 0) > 0
    assert not result.correctness.blame.get("broker") and not result.correctness.blame.get("producer")
    paths = write_report([result], tmp_path / "broken")
    html = paths.html.read_text()
    assert "FAIL" in html and "pipeline" in html and "data:image/png;base64," in html


def test_ctrl_c_stops_every_part_and_still_writes_a_partial_report(smoke, kafka: KafkaConfig, tmp_path):
    import contextlib
    import threading
    import time

    import psutil

    stop = threading.Event()
    run_dir = tmp_path / "interrupted"
    outcome: list[Results] = []
    worker = threading.Thread(
        target=lambda: outcome.append(execute(RunRequest(smoke, 1.0, run_dir, kafka), stop))
    )
    worker.start()
    samples = run_dir / "samples.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (samples.exists() and '"steady"' in samples.read_text()):
        time.sleep(0.2)
    stop.set()  # what the CLI's Ctrl-C handler does
    worker.join(300)

    assert outcome, "the run did not return"
    result = outcome[0]
    assert result.run.interrupted and result.verdict.verdict == "FAIL"
    assert any("interrupted" in reason for reason in result.verdict.reasons)
    assert Results.from_json(run_dir / "results.json").run.interrupted
    # The pipeline process is gone, and nothing it wrote was lost or repeated.
    # (A zombie left by another test's child is gone as far as a user can tell: ``ps`` shows it <defunct>.)
    running = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE and p.cmdline()[1:4] == ["-m", "sotw", "pipeline"]:
                running.append(p)
    assert not running
    assert result.correctness is not None and result.correctness.rows_repeated == 0


def assert_it_passed_and_wrote_its_report(result: Results, run_dir, steady_s: float) -> None:
    """What a user checks of a finished run: PASS, its phases, latencies, the harness's cost, its files."""
    assert result.verdict.verdict == "PASS", result.verdict.reasons
    assert result.correctness is not None and result.correctness.rows_lost == 0
    assert result.correctness.rows_repeated == 0
    assert {p.name for p in result.phases} >= {"warmup", "steady", "drain"}
    e2e = next(lat for lat in result.latency if lat.name == "end_to_end")
    assert e2e.scope == "steady" and 0 < e2e.p50 <= e2e.p99 <= e2e.max
    assert result.figure("end_to_end_p99") == e2e.p99
    assert any(lat.name == "publish" for lat in result.latency)
    overhead = result.harness_overhead
    assert overhead["simulator_cpu_percent"] > 0 and overhead["sampler_cpu_percent"] > 0
    assert overhead["process_cpu_percent"] == pytest.approx(
        overhead["simulator_cpu_percent"] + overhead["sampler_cpu_percent"] + overhead["other_cpu_percent"],
        abs=0.5,
    )
    saved = Results.from_json(run_dir / "results.json")
    assert saved.verdict.verdict == "PASS"
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= steady_s
    # After the drain the pipeline has consumed exactly what the simulator sent.
    drained = [s for s in samples if s["phase"] == "settle"]
    assert drained and drained[-1]["consumed"] == drained[-1]["sent"] and drained[-1]["lag_offsets"] == 0


def test_a_short_run_with_every_fault_kind_passes_writes_its_report_and_one_value_changed_fails_naming_its_row(
    smoke, kafka: KafkaConfig, tmp_path
):
    import pyarrow.parquet as pq

    from loadtest.correctness.expect import read_ledger
    from loadtest.correctness.verify import verify_run
    from simulator import FaultConfig

    faults = FaultConfig(gap=0.005, duplicate=0.01, delayed=0.01, malformed=0.003, abandon=0.05, delay_ms=100)
    faulty = dataclasses.replace(
        smoke,
        simulator=dataclasses.replace(smoke.simulator, faults=faults, session_interval_s=2.0),
        run=dataclasses.replace(smoke.run, steady_s=10.0),
    )
    run_dir = tmp_path / "run"
    result = execute(RunRequest(faulty, 1.0, run_dir, kafka))
    assert_it_passed_and_wrote_its_report(result, run_dir, faulty.run.steady_s)
    c = result.correctness
    assert c is not None and c.rows_values_checked == c.rows_written > 0

    # A session a fault reached, and one of its updates: the bug writes an extra column into that row.
    ledger = read_ledger(run_dir)
    faulted = set(ledger.loc[ledger["fault"].isin(["duplicate", "delayed"]), "session"])
    changes = run_dir / "pipeline" / "output" / "changes"
    for path in sorted(changes.rglob("*.parquet")):
        table = pq.read_table(path, partitioning=None)
        rows = table.to_pylist()
        hit = next((r for r in rows if r["session"] in faulted and r["op"] == "upsert"), None)
        if hit is not None:
            hit["values"] = hit["values"][:-1] + ',"extra":1}'
            pq.write_table(type(table).from_pylist(rows, schema=table.schema), path)
            break
    assert hit is not None
    policy = faulty.pipeline.verifier_policy()
    again = verify_run(run_dir, run_dir / "pipeline" / "output", policy, kafka)
    assert not again.passed and again.rows_wrong == 1
    (wrong,) = [d for d in again.discrepancies if d.kind == "wrong_value"]
    assert (wrong.session, wrong.seq) == (
        hit["session"],
        hit["seq"],
    ) and f"row {hit['row_id']} is" in wrong.detail
    assert (
        wrong.triage is not None
        and wrong.triage.layer == "pipeline"
        and "wrote it wrong" in wrong.triage.detail
    )
