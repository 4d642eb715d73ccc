import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from sotw.broker import free_port


def sotw(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sotw", "simulate", *args], capture_output=True, text=True, timeout=timeout
    )


def test_bad_config_exits_non_zero_naming_the_field(tmp_path):
    result = sotw("--rate", "-5", "--run-dir", str(tmp_path / "r"), "--bootstrap", "127.0.0.1:1")
    assert result.returncode != 0
    assert "rate must be a number >= 0, got -5.0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.system  # waits on a broker of its own, or on none
def test_missing_broker_exits_non_zero_with_a_clear_error(tmp_path):
    port = free_port()
    result = sotw(
        "--bootstrap",
        f"127.0.0.1:{port}",
        "--connect-timeout",
        "1",
        "--run-dir",
        str(tmp_path / "r"),
        "--no-progress",
    )
    assert result.returncode != 0
    assert f"127.0.0.1:{port} did not answer" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_scenario_run_prints_a_summary_and_leaves_a_run_directory(bootstrap, tmp_path, unique_prefix):
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f"""
sensors = 3
rows = 10
rate = 1000
duration_s = 5
topic_prefix = "{unique_prefix()}"
[profiles.short.simulator]
duration_s = 1
[profiles.short.simulator.faults]
gap = 0.05
"""
    )
    run_dir = tmp_path / "run-a"
    result = sotw(
        "--scenario",
        str(scenario),
        "--profile",
        "short",
        "--bootstrap",
        bootstrap,
        "--run-dir",
        str(run_dir),
        "--seed",
        "5",
    )
    assert result.returncode == 0, result.stderr
    assert "fault: gap" in result.stdout and "acknowledged" in result.stdout
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["seed"] == 5 and doc["config"]["duration_s"] == 1 and doc["config"]["faults"]["gap"] == 0.05
    assert doc["ended_ms"] >= doc["started_ms"] and doc["versions"]["sotw"]
    ledger = pq.read_table(run_dir / "ledger").to_pylist()
    assert 800 <= len(ledger) <= 1300
    assert (run_dir / "truth" / "sessions.parquet").exists()


def test_ctrl_c_stops_cleanly_and_still_writes_the_ledger_and_the_summary(bootstrap, tmp_path, unique_prefix):
    import signal
    import time

    run_dir = tmp_path / "run-c"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sotw",
            "simulate",
            "--bootstrap",
            bootstrap,
            "--run-dir",
            str(run_dir),
            "--duration",
            "60",
            "--rate",
            "2000",
            "--sensors",
            "3",
            "--rows",
            "10",
            "--topic-prefix",
            unique_prefix(),
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (run_dir / "run.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping" in err and "acknowledged" in out
    ledger = pq.read_table(run_dir / "ledger").to_pylist()
    assert 1000 < len(ledger) < 60 * 2000 and all(r["delivered"] for r in ledger)
    sessions = pq.read_table(run_dir / "truth" / "sessions.parquet").to_pylist()
    assert sessions and all(s["status"] == "ended" for s in sessions)
    assert json.loads((run_dir / "run.json").read_text())["ended_ms"] is not None


def test_the_producer_path_flag_chooses_the_path_and_is_auto_by_default():
    from simulator.cli import build_parser, config_from_args

    assert config_from_args(build_parser().parse_args([])).producer_path == "auto"
    assert (
        config_from_args(build_parser().parse_args(["--producer-path", "client"])).producer_path == "client"
    )
