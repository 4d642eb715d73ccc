"""A team's own job under the harness, run as a user runs it: ``sotw run --pipeline-cmd ... --contract tables``.

The naive job (last write wins, no seq order, no de-duplication) must pass without faults and fail with the
faults a real producer brings, naming its wrong rows; the correct Delta job must pass with the same faults.
Lag comes from each job's own Spark checkpoint. The fleet is the smoke profile's, with short sessions and
the baseline's reordering faults (delayed messages, copies sent again) at rates a few seconds of load meet
for certain; `sotw run --profile baseline` fails the naive job the same way over a longer run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.reports.results import Results
from sotw.kafka import KafkaConfig

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """
[profiles.{name}]
description = "the test suite's own-pipeline run"
[profiles.{name}.simulator]
sensors = 4
rows = 20
partitions = 1
rate = 300
session_interval_s = 1
seed = 5
[profiles.{name}.simulator.faults]
duplicate = {rate}
delayed = {rate}
delay_ms = 100
delay_max_ms = 300
[profiles.{name}.pipeline]
trigger = "1s"
session_timeout = "2s"
[profiles.{name}.run]
warmup_s = 3
steady_s = 10
drain_max_s = 180
max_lag_s = 600
"""


def run_job(tmp_path: Path, kafka: KafkaConfig, example: str, faults: float, *flags: str) -> Results:
    """``sotw run`` with the example as ``--pipeline-cmd`` on the test broker; its results."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO.format(name="own", rate=faults))
    template = (
        f"{{python}} {ROOT / 'examples' / example} --bootstrap {{bootstrap}} --topics {{pattern}} "
        "--out {output} --checkpoint {checkpoint} --trigger-ms {trigger_ms}"
    )
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sotw", "run", "--scenario", str(scenario), "--profile", "own"]
    argv += ["--run-dir", str(run_dir), "--bootstrap", kafka.bootstrap, "--pipeline-cmd", template, *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert (run_dir / "results.json").is_file(), done.stderr[-3000:]
    results = Results.from_json(run_dir / "results.json")
    assert done.returncode == (0 if results.verdict.verdict == "PASS" else 1)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    # Lag from the job's own checkpoint: it fell to zero after the load, with everything sent consumed.
    last = [s for s in samples if s["phase"] in ("drain", "settle")][-1]
    assert last["lag_offsets"] == 0 and last["consumed"] >= last["acked"] > 0
    # The batch count comes from the job's checkpoint too (a Delta MERGE per batch makes few, large ones).
    assert max(s.get("batches", 0) for s in samples) >= 3
    return results


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
def test_the_naive_pipeline_passes_without_faults(tmp_path: Path, kafka: KafkaConfig) -> None:
    results = run_job(tmp_path, kafka, "naive_pipeline.py", 0.0, "--contract", "tables")

    assert results.verdict.verdict == "PASS", results.verdict.reasons
    c = results.correctness
    assert c is not None and c.contract == "tables" and c.sessions_exact == c.sessions_exact_required > 10


def test_the_naive_pipeline_fails_under_reordering_faults_naming_its_wrong_rows(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    results = run_job(tmp_path, kafka, "naive_pipeline.py", 0.05, "--contract", "tables")

    assert results.verdict.verdict == "FAIL"
    c = results.correctness
    assert c is not None and c.rows_wrong + c.rows_unexpected > 0
    wrong = [d for d in c.discrepancies if d.kind in ("wrong_row", "extra_row")]
    assert wrong and all(d.session and d.triage and d.triage.layer == "pipeline" for d in wrong)
    assert any("delayed" in d.detail or "duplicated" in d.detail for d in wrong)
    assert c.latency_source == "not measured: the output has no seq column"
    report = (tmp_path / "run" / "report.md").read_text()
    assert "wrong_row" in report or "wrong row" in report


@pytest.mark.slow
def test_the_delta_pipeline_passes_under_the_same_faults(tmp_path: Path, kafka: KafkaConfig) -> None:
    results = run_job(tmp_path, kafka, "delta_pipeline.py", 0.05, "--contract", "tables", "--format", "delta")

    assert results.verdict.verdict == "PASS", results.verdict.reasons
    c = results.correctness
    assert c is not None and c.output_format == "delta" and c.sessions_exact > 10
    assert c.latency_source == "the committed_ms column"
    assert any(lat.name == "end_to_end" for lat in results.latency)


@pytest.mark.slow
def test_a_drill_kills_and_restarts_a_team_s_job_and_its_exactly_once_output_still_passes(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    import dataclasses

    from loadtest.gameday.incidents import incident_from_mapping
    from loadtest.run.job import JobSpec
    from loadtest.run.profile import load_profile
    from loadtest.run.runner import RunRequest, execute

    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO.format(name="own", rate=0.05))
    profile = load_profile("own", scenario)
    profile = dataclasses.replace(profile, run=dataclasses.replace(profile.run, steady_s=16.0))
    template = (
        f"{{python}} {ROOT / 'examples' / 'delta_pipeline.py'} --bootstrap {{bootstrap}} --topics {{pattern}} "
        "--out {output} --checkpoint {checkpoint} --trigger-ms {trigger_ms}"
    )
    kill = incident_from_mapping({"kind": "pipeline_kill", "at_s": 2, "restart_after_s": 3}, "test")
    job = JobSpec(command=template, contract="tables")
    result = execute(RunRequest(profile, 1.0, tmp_path / "run", kafka, incidents=(kill,), job=job))

    (incident,) = result.incidents
    assert incident.kind == "pipeline_kill"
    assert result.correctness is not None and result.correctness.passed, result.correctness.reasons
    assert result.correctness.sessions_exact > 10


@pytest.mark.slow
def test_sotw_s_own_pipeline_writing_delta_passes_the_full_contract(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    import dataclasses

    from loadtest.run.job import JobSpec
    from loadtest.run.profile import load_profile
    from loadtest.run.runner import RunRequest, execute

    smoke = load_profile("smoke")
    profile = dataclasses.replace(
        smoke, run=dataclasses.replace(smoke.run, steady_s=10.0, max_lag_s=600, max_end_to_end_p99_s=None)
    )
    result = execute(RunRequest(profile, 1.0, tmp_path / "run", kafka, job=JobSpec(format="delta")))

    assert result.verdict.verdict == "PASS", result.verdict.reasons
    c = result.correctness
    assert c is not None and (c.contract, c.output_format) == ("full", "delta")
    assert c.latency_source == "Delta commit timestamps" and c.sessions_exact > 0
    assert (tmp_path / "run" / "pipeline" / "output" / "changes" / "_delta_log").is_dir()
    assert result.figure("written_rate") > 0
