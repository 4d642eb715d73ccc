"""The strict policy's stop, end to end: sotw's own pipeline under faults, and the same pipeline planted to die.

Under ``strict`` a run passes only when the job stopped as its policy says: its integrity output names the
violation that stopped it. The same pipeline with a bug planted from outside it (tests/loadtest/jobs/
dies_at_strict_stop: its stop dies of an out-of-memory error instead) exits at the same moment, and fails,
named with its exit and its log's last error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.reports.results import Results
from sotw.kafka import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]
PLANT = Path(__file__).resolve().parent / "jobs" / "dies_at_strict_stop"

SCENARIO = """
[profiles.strict]
description = "strict, with gaps, copies and delays from 8 s into the load"
[profiles.strict.simulator]
sensors = 4
rows = 50
partitions = 1
rate = 300
session_interval_s = 4
seed = 3
[profiles.strict.pipeline]
policy = "strict"
trigger = "1s"
session_timeout = "8s"
[profiles.strict.run]
warmup_s = 3
steady_s = 20
drain_max_s = 120
max_lag_s = 600
[[profiles.strict.schedule]]
start_s = 8
end_s = 30
faults = { gap = 0.005, duplicate = 0.005, delayed = 0.005 }
"""

# sotw's own pipeline as a team's job: the same command the harness runs, so that a plant can be put on it.
OWN_PIPELINE = (
    "{python} -m sotw pipeline --bootstrap {bootstrap} --pattern {pattern} --output {output} "
    "--checkpoint {checkpoint} --policy {policy} --trigger {trigger} --session-timeout {session_timeout} -q"
)


def strict_run(tmp_path: Path, kafka: KafkaConfig, template: str | None) -> tuple[int, Results]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sotw", "run", "--scenario", str(scenario), "--profile", "strict"]
    argv += ["--run-dir", str(run_dir), "--bootstrap", kafka.bootstrap]
    if template is not None:
        argv += ["--pipeline-cmd", template]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert (run_dir / "results.json").is_file(), done.stderr[-3000:]
    return done.returncode, Results.from_json(run_dir / "results.json")


@pytest.mark.slow
def test_a_strict_pipeline_that_stops_at_the_first_violation_naming_it_passes(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    code, result = strict_run(tmp_path, kafka, None)
    c = result.correctness
    assert c is not None and c.must_stop
    assert c.policy_stop is not None and c.policy_stop.split(" in session ")[0] in (
        "gap",
        "duplicate",
        "reorder",
    )
    assert result.verdict.verdict == "PASS" and code == 0, result.verdict.reasons


@pytest.mark.slow
def test_a_strict_pipeline_that_dies_of_an_unrelated_error_where_it_should_stop_fails_naming_it(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    template = f"env PYTHONPATH={PLANT} {OWN_PIPELINE}"
    code, result = strict_run(tmp_path, kafka, template)
    assert result.verdict.verdict == "FAIL" and code == 1
    c = result.correctness
    assert c is not None and c.must_stop and c.policy_stop is None
    (stop,) = [d for d in c.discrepancies if d.kind == "no_policy_stop"]
    assert "the job exited with code 1: MemoryError: planted" in stop.detail
    assert stop.triage is not None and stop.triage.layer == "pipeline"
