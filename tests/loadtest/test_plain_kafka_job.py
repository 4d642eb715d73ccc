"""A team's job the project never wrote, on a game day: a plain confluent-kafka consumer under ``sotw run``.

The job (tests/loadtest/jobs/plain_kafka_job.py) subscribes to ``{pattern}`` in a consumer group, keeps each
session's rows and writes them as the tables contract; the harness reads its lag from the group. With every
fault kind on, a last-write-wins job must FAIL, named on rows of sessions that only met delays and copies
sent again (which a correct job turns into the exact truth), while the same job keeping each row's highest
seq must PASS, sessions that lost messages included.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from loadtest.reports.results import Results
from sotw.kafka import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "plain_kafka_job.py"

SCENARIO = """
[profiles.plain]
description = "every fault kind, short sessions"
[profiles.plain.simulator]
sensors = 4
rows = 20
partitions = 1
rate = 300
session_interval_s = 2
seed = 9
[profiles.plain.simulator.faults]
gap = {gap}
duplicate = {rate}
delayed = {rate}
malformed = {gap}
abandon = {abandon}
delay_ms = 100
delay_max_ms = 400
[profiles.plain.pipeline]
trigger = "1s"
session_timeout = "2s"
[profiles.plain.run]
warmup_s = 3
steady_s = 10
drain_max_s = {drain}
pipeline_start_timeout_s = {start}
max_lag_s = 600
"""


def run_plain_job(
    tmp_path: Path, kafka: KafkaConfig, mode: str, faults: bool, topics: str = "{pattern}", drain: int = 120
) -> Results:
    scenario = tmp_path / "scenario.toml"
    # Losses rare enough that most sessions lose nothing, reordering frequent enough that every session meets it.
    rates = {"gap": 0.002, "rate": 0.03, "abandon": 0.1} if faults else {"gap": 0, "rate": 0, "abandon": 0}
    scenario.write_text(SCENARIO.format(drain=drain, start=min(drain, 120), **rates))
    group = f"team-job-{uuid.uuid4().hex[:8]}"
    template = (
        f"{{python}} {JOB} --bootstrap {{bootstrap}} --topics {topics} --out {{output}} "
        f"--group {group} --mode {mode} --kafka-config {{kafka_config}}"
    )
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sotw", "run", "--scenario", str(scenario), "--profile", "plain"]
    argv += ["--run-dir", str(run_dir), "--bootstrap", kafka.bootstrap, "--pipeline-cmd", template]
    argv += ["--contract", "tables", "--lag-from", f"group:{group}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert (run_dir / "results.json").is_file(), done.stderr[-3000:]
    # The job's {kafka_config} lived beside its checkpoint while it ran, and is gone with it.
    assert not list(run_dir.rglob("kafka.properties"))
    return Results.from_json(run_dir / "results.json")


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_a_plain_consumer_given_the_pattern_consumes_the_run_s_topics_and_passes_without_faults(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    results = run_plain_job(tmp_path, kafka, "last-write-wins", faults=False)

    assert results.verdict.verdict == "PASS", results.verdict.reasons
    c = results.correctness
    assert c is not None and c.sessions_exact == c.sessions_exact_required == c.sessions_expected > 5


def test_a_last_write_wins_job_fails_under_faults_on_sessions_that_only_met_delays_and_copies(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    results = run_plain_job(tmp_path, kafka, "last-write-wins", faults=True)

    assert results.verdict.verdict == "FAIL"
    c = results.correctness
    assert c is not None and c.sessions_not_judged == 0
    wrong = [d for d in c.discrepancies if d.kind in ("wrong_row", "extra_row")]
    assert wrong and all(d.triage and d.triage.layer == "pipeline" for d in wrong)
    # Sessions nothing was lost from: a correct job would hold their exact truth.
    whole = [d for d in wrong if "never reached the broker" not in d.detail]
    assert whole and all("delayed" in d.detail or "duplicated" in d.detail for d in whole)


def test_a_job_keeping_each_row_s_highest_seq_passes_under_the_same_faults(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    results = run_plain_job(tmp_path, kafka, "highest-seq", faults=True)

    assert results.verdict.verdict == "PASS", results.verdict.reasons
    c = results.correctness
    assert c is not None and c.sessions_judged_from_delivered > 0 and c.sessions_not_judged == 0
    assert c.sessions_exact == c.sessions_exact_required == c.sessions_expected


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_a_job_that_consumes_nothing_is_told_so_not_blamed_for_every_row(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    # The prefix without ^ is a literal topic name to librdkafka: the job subscribes to nothing.
    results = run_plain_job(tmp_path, kafka, "highest-seq", faults=False, topics="{prefix}", drain=5)

    assert results.verdict.verdict == "FAIL"
    first = next(r for r in results.verdict.reasons if "consumed nothing" in r)
    assert "position on the run's topics never moved" in first and "starts with ^" in first
