"""A team's job under Locust as under ``sotw run``: the same job and profile give the same verdict and results.

The job is tests/loadtest/jobs/plain_kafka_job.py (``--mode highest-seq``), given to ``sotw locust`` with
``--pipeline-cmd``, ``--contract tables`` and ``--lag-from group:ID`` exactly as tests/loadtest/test_plain_kafka_job.py
gives it to ``sotw run``. One headless Locust run and one ``sotw run`` of the same profile go side by side
(module fixture, both at once); each test checks one thing a user would compare afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtest.reports.results import Results
from sotw.kafka import KafkaConfig
from tests.loadtest.locust_process import start, stop
from tests.loadtest.test_plain_kafka_job import JOB, ROOT, SCENARIO

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class SideBySide:
    """A Locust session's one run and a ``sotw run`` of the same job and profile."""

    session: Path
    locust_log: str
    run_dir: Path
    run_log: str

    @property
    def locust_run(self) -> Path:
        """The Locust run's directory."""
        return self.session / "run-1"


def template(group: str) -> str:
    """The job's command line, reading the run's topics in consumer group ``group``."""
    return (
        f"{{python}} {JOB} --bootstrap {{bootstrap}} --topics {{pattern}} --out {{output}} "
        f"--group {group} --mode highest-seq"
    )


def job_flags(group: str) -> list[str]:
    """``sotw run``'s and ``sotw locust``'s flags for the job, alike."""
    return ["--pipeline-cmd", template(group), "--contract", "tables", "--lag-from", f"group:{group}"]


@pytest.fixture(scope="module")
def side_by_side(kafka: KafkaConfig, tmp_path_factory: pytest.TempPathFactory) -> SideBySide:
    """``sotw locust --headless --shape steady --load 1x`` and ``sotw run --load 1x`` of the job, both at once.

    The profile has every fault kind on, so the job's handling of delays, copies and losses is judged.
    """
    root = tmp_path_factory.mktemp("locust-job")
    scenario = root / "scenario.toml"
    scenario.write_text(SCENARIO.format(drain=120, start=120, gap=0.002, rate=0.03, abandon=0.1))
    profile = ["--scenario", str(scenario), "--profile", "plain", "--bootstrap", kafka.bootstrap]
    session, run_dir = root / "locust", root / "run"
    locust_log, run_log = root / "locust.log", root / "run.log"
    group = f"team-job-{uuid.uuid4().hex[:8]}"
    locust = start(
        [
            "--headless",
            *profile,
            "--shape=steady",
            "--load=1x",
            f"--run-dir={session}",
            *job_flags(f"{group}-locust"),
        ],
        locust_log,
        sotw=True,
    )
    argv = [sys.executable, "-m", "sotw", "run", *profile, "--load", "1x", "--run-dir", str(run_dir)]
    with run_log.open("ab") as out:
        run = subprocess.Popen(
            [*argv, *job_flags(f"{group}-run")], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )
    try:
        run.wait(timeout=600)
        locust.wait(timeout=600)
    except subprocess.TimeoutExpired:
        stop(locust)
        run.kill()
    return SideBySide(
        session, locust_log.read_text(errors="replace"), run_dir, run_log.read_text(errors="replace")
    )


def test_a_locust_run_of_a_team_job_reaches_the_verdict_sotw_run_gives_the_same_job(
    side_by_side: SideBySide,
) -> None:
    assert (side_by_side.locust_run / "results.json").is_file(), side_by_side.locust_log[-3000:]
    assert (side_by_side.run_dir / "results.json").is_file(), side_by_side.run_log[-3000:]
    on_locust = Results.from_json(side_by_side.locust_run / "results.json")
    on_run = Results.from_json(side_by_side.run_dir / "results.json")

    assert on_locust.verdict.verdict == on_run.verdict.verdict == "PASS", (
        on_locust.verdict.reasons,
        on_run.verdict.reasons,
    )
    for c in (on_locust.correctness, on_run.correctness):
        assert c is not None and c.contract == "tables"
        assert c.sessions_exact == c.sessions_exact_required == c.sessions_expected > 5
        assert c.sessions_judged_from_delivered > 0


def test_the_locust_run_starts_the_job_in_its_own_directory_and_stops_it_before_its_verdict(
    side_by_side: SideBySide,
) -> None:
    job = side_by_side.locust_run / "pipeline"
    assert any((job / "output").glob("*.parquet")), "the job wrote its table into the run's directory"
    assert not (side_by_side.session / "pipeline").exists(), "no pipeline of the session's own was started"
    # The job handles SIGTERM: it flushes its table and commits, then exits 0, before the run is verified.
    stopped = side_by_side.locust_log.index("pipeline stopped (exit code 0)")
    assert stopped < side_by_side.locust_log.index("run 1: PASS")


def test_sotw_compare_takes_the_locust_run_and_the_sotw_run_side_by_side(side_by_side: SideBySide) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sotw",
            "compare",
            str(side_by_side.run_dir / "results.json"),
            str(side_by_side.locust_run / "results.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert "(1x PASS)" in done.stdout and "end_to_end" in done.stdout, done.stdout
