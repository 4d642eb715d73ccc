"""The pipeline and the harness on a real Spark standalone cluster (a master and a worker JVM on this machine)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time

import psutil
import pytest

from loadtest.gameday.pipeline_incidents import WorkerKill
from loadtest.run.cluster import ClusterConfig, LocalWorkers, StandaloneCluster
from loadtest.run.profile import load_profile
from loadtest.run.runner import RunRequest, execute
from pipeline import query
from sotw.kafka import topic_pattern
from tests.pipeline.test_pipeline import canon, pipeline_config, rows_of

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """One master and one 2-core worker on loopback, stopped (and their process group killed) at the end."""
    config = ClusterConfig(python=sys.executable, base_env=dict(os.environ), workers=1, cores=2, memory="2g")
    with StandaloneCluster(config, tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
    assert not LocalWorkers(cluster.master_url).workers()


@pytest.mark.slow
def test_a_driver_killed_on_the_cluster_restarts_and_writes_what_an_uninterrupted_run_writes(
    standalone, spark, kafka, simulate, tmp_path
):
    _, config = simulate(sensors=4, rows=40, duration_s=4.0, rate=3000.0, partitions=2, seed=23)
    reference = pipeline_config(kafka, config.topic_prefix, tmp_path / "reference")
    query.run(spark, reference)

    where = tmp_path / "killed"
    argv = [
        sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap,
        "--pattern", topic_pattern(config.topic_prefix), "--master", standalone.master_url,
        "--output", str(where / "output"), "--checkpoint", str(where / "checkpoint"),
        "--max-offsets-per-trigger", "1500", "--trigger", "200ms", "-q",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    driver = psutil.Process(proc.pid)
    try:
        commits = where / "output" / "_commits"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(list(commits.glob("*.json"))) < 3 and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert LocalWorkers(standalone.master_url).executors(), "the batches ran on the cluster's executors"
    finally:
        family = [driver, *driver.children(recursive=True)]  # the driver's Python, its JVM and Python helpers
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        proc.wait()
    done = subprocess.run([*argv[:-5], "--trigger", "availableNow", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    for name in ("changes", "sessions", "integrity", "dead_letters"):
        assert canon(rows_of(where / "output", name)) == canon(rows_of(reference.output, name)), name


@pytest.mark.slow
def test_a_run_on_the_cluster_recovers_from_its_worker_killed_mid_run(standalone, kafka, tmp_path):
    profile = load_profile("smoke")
    profile = dataclasses.replace(
        profile,
        pipeline=dataclasses.replace(profile.pipeline, master=standalone.master_url),
        run=dataclasses.replace(
            profile.run, steady_s=75, max_lag_s=600, max_end_to_end_p99_s=None, drain_max_s=300
        ),
    )
    # Recovery takes a new executor on the restarted worker: its JVM, Python workers and the state store
    # loaded from the checkpoint (about 40 s on the busy 2-core machine), so the steady phase outlasts it.
    kill = WorkerKill(at_s=3, worker=True, restart_after_s=5)
    result = execute(RunRequest(profile, 1.0, tmp_path / "run", kafka, incidents=(kill,)))

    assert result.correctness is not None and result.correctness.passed, result.correctness.reasons
    assert result.correctness.rows_lost == 0 and result.correctness.rows_repeated == 0
    [incident] = result.incidents
    assert incident.kind == "worker_kill" and incident.error is None, incident.error
    assert any("killed" in n for n in incident.notes) and any("started again" in n for n in incident.notes)
    assert incident.recover_s is not None, "the pipeline caught up again after the node came back"
    assert len(LocalWorkers(standalone.master_url).workers()) == 1


def test_a_worker_kill_is_read_from_a_drill_table_and_its_parameters_are_checked():
    from loadtest.errors import HarnessError
    from loadtest.gameday.incidents import incident_from_mapping

    kill = incident_from_mapping(
        {"kind": "worker_kill", "at_s": 20, "worker": True, "restart_after_s": 8}, "drill"
    )
    assert isinstance(kill, WorkerKill) and kill.duration == 8
    assert incident_from_mapping({"kind": "worker_kill", "at_s": 5}, "drill").duration == 0, (
        "executors: an instant"
    )
    with pytest.raises(HarnessError, match="worker must be true or false"):
        incident_from_mapping({"kind": "worker_kill", "worker": "yes"}, "drill")


def test_a_profile_carries_the_master_to_the_pipelines_command_line():
    profile = load_profile("smoke")
    on_cluster = dataclasses.replace(profile.pipeline, master="spark://127.0.0.1:7077")
    args = on_cluster.args()
    assert args[args.index("--master") + 1] == "spark://127.0.0.1:7077"
    assert "--master" not in profile.pipeline.args(), "local[2] stays the pipeline's own default"
