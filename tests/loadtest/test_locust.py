"""sotw's locustfile in real Locust processes: one master and two workers, headless, with CSV, HTML and thresholds.

One distributed run (module fixture) against the session's broker, with the pipeline the master starts;
each test checks one thing a user would look at afterwards.
"""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtest.correctness.expect import read_parquet_dir
from sotw.kafka import KafkaConfig
from tests.loadtest.locust_process import free_port, start, stop

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Distributed:
    """What a headless master with two workers left behind."""

    session: Path
    exit_code: int
    log: str

    @property
    def run(self) -> Path:
        """The run's directory."""
        return self.session / "run-1"


@pytest.fixture(scope="module")
def distributed(kafka: KafkaConfig, tmp_path_factory: pytest.TempPathFactory) -> Distributed:
    """``--master --headless --expect-workers 2`` and two ``--worker`` processes, one steady 1x run.

    Every message is acknowledged well within a second here, so ``--check-lag-age 0.001`` is a threshold the
    run must break, and ``--check-correct`` one it must keep.
    """
    session = tmp_path_factory.mktemp("locust-distributed")
    log, port = session / "master.log", str(free_port())
    master = start(
        [
            "--master",
            "--headless",
            "--expect-workers=2",
            "--master-bind-host=127.0.0.1",
            f"--master-bind-port={port}",
            f"--bootstrap={kafka.bootstrap}",
            "--sotw-profile=smoke",
            "--shape=steady",
            "--warmup=2",
            "--steady=8",
            f"--run-dir={session}",
            f"--csv={session / 'out'}",
            f"--html={session / 'out.html'}",
            "--check-correct",
            "--check-lag-age=0.001",
        ],
        log,
    )
    worker_args = ["--worker", "--master-host=127.0.0.1", f"--master-port={port}"]
    workers = [start(worker_args, session / f"worker-{i}.log") for i in range(2)]
    try:
        code = master.wait(timeout=420)
    except subprocess.TimeoutExpired:
        code = stop(master)
    finally:
        for worker in workers:
            try:
                worker.wait(timeout=60)  # the master's quit reaches them
            except subprocess.TimeoutExpired:
                stop(worker)
    return Distributed(session, code, log.read_text(errors="replace"))


def test_each_worker_writes_its_own_ledger_over_sensors_no_other_worker_writes(
    distributed: Distributed,
) -> None:
    parts = sorted(p.name for p in (distributed.run / "parts").iterdir())
    assert parts == ["worker-0", "worker-1"], distributed.log[-3000:]
    sensors = [set(read_parquet_dir(distributed.run / "parts" / p / "ledger")["sensor"]) for p in parts]
    assert sensors[0] and sensors[1] and not sensors[0] & sensors[1]


def test_the_run_is_verified_as_the_union_of_the_workers_ledgers(distributed: Distributed) -> None:
    results = json.loads((distributed.run / "results.json").read_text())
    truths = [
        read_parquet_dir(distributed.run / "parts" / p / "truth" / "sessions.parquet")
        for p in ("worker-0", "worker-1")
    ]
    correctness = results["correctness"]
    assert correctness["passed"], correctness["reasons"]
    assert correctness["sessions_expected"] == sum(len(t) for t in truths) > 0


def test_headless_csv_and_html_carry_sotws_verdict_lag_and_latency(distributed: Distributed) -> None:
    with (distributed.session / "out_sotw.csv").open() as f:
        figures = {(row["name"], row["scope"]): row["value"] for row in csv.DictReader(f)}
    assert figures[("correct", "run")] == "True"
    assert float(figures[("lag_age_max", "steady")]) >= 0
    assert float(figures[("end_to_end_p99", "steady")]) > 0
    with (distributed.session / "out_sotw_history.csv").open() as f:
        history = list(csv.DictReader(f))
    assert history and {"lag_offsets", "lag_age_s", "users"} <= set(history[0])
    assert len((distributed.session / "out_sotw_latency.csv").read_text().splitlines()) > 1
    html = (distributed.session / "out.html").read_text()
    assert '<section id="sotw"' in html and "End-to-end latency" in html


def test_a_broken_threshold_exits_3_naming_it_and_a_kept_one_is_not_named(distributed: Distributed) -> None:
    assert distributed.exit_code == 3, distributed.log[-3000:]
    assert "is not below --check-lag-age 0.001 s" in distributed.log
    assert "--check-correct:" not in distributed.log
