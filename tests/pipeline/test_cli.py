"""``sotw pipeline`` as a user runs it: bad input gives one clear line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest


def sotw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sotw", *args], capture_output=True, text=True, timeout=120)


def test_a_bad_trigger_is_named():
    done = sotw("pipeline", "--bootstrap", "127.0.0.1:9", "--trigger", "soon")
    assert done.returncode == 2
    assert "trigger must be like 5s, 500ms, 15min, 1h or availableNow, got 'soon'" in done.stderr


def test_a_bad_policy_is_refused_with_the_choices():
    done = sotw("pipeline", "--bootstrap", "127.0.0.1:9", "--policy", "lenient")
    assert done.returncode == 2 and "invalid choice: 'lenient'" in done.stderr and "strict" in done.stderr


@pytest.mark.system  # waits on a broker of its own, or on none
def test_a_missing_broker_is_one_line_and_exit_1(tmp_path):
    done = sotw("pipeline", "--bootstrap", "127.0.0.1:1", "--output", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "broker at 127.0.0.1:1 did not answer within 15 s" in done.stderr
    assert "Traceback" not in done.stderr


def test_inspect_of_a_missing_output_says_so(tmp_path):
    done = sotw("pipeline", "inspect", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "is not a directory" in done.stderr


def test_rollback_behind_the_checkpoint_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "checkpoint" / "commits").mkdir(parents=True)
    (tmp_path / "checkpoint" / "commits" / "4").write_text("v1\n{}")
    done = sotw("pipeline", "rollback", str(tmp_path / "output"), "--to-batch", "2")
    assert done.returncode == 2
    assert "has committed batches up to 4: rolling the output back to 2 would leave a hole" in done.stderr
    assert "Traceback" not in done.stderr
