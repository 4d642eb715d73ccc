"""A cluster's settings reach the harness's children in private files, never as arguments or in clear JSON.

The job's process (``sotw pipeline`` or a team's ``--pipeline-cmd``), the Locust harness and feeders, the
workers' assignments, the night's commands; and Locust's UI and worker socket stay on this machine by default.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from loadtest.errors import HarnessError
from loadtest.locust.driver import ProcessSide
from loadtest.locust.feeder import FeederConfig
from loadtest.locust.fleetplan import LiveConfig
from loadtest.locust.settings import exposure_warnings
from loadtest.regressions import nightly
from loadtest.regressions.config import NightlyConfig
from loadtest.regressions.sidebyside import CANDIDATE, Side
from loadtest.regressions.sides import SideRuns
from loadtest.run.processes import CommandTemplate, PipelineProcess, PipelineProcessConfig
from sotw.cliargs import KafkaArgsError, kafka_settings
from sotw.kafka import read_settings

PASSWORD = "pw-4f9a1c"
SETTINGS = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "team",
    "sasl.password": PASSWORD,
}
SLEEPER = (
    "{python} -c 'import time; time.sleep(60)' {bootstrap} {pattern} {output} {checkpoint} "
    "--kafka-config {kafka_config} --java-config {java_config} --spark-options {spark_options}"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_team_job_gets_its_settings_files_private_while_it_runs_and_none_after(tmp_path: Path) -> None:
    config = PipelineProcessConfig(
        "127.0.0.1:9093",
        tmp_path / "pipeline" / "output",
        tmp_path / "pipeline" / "checkpoint",
        template=CommandTemplate(SLEEPER),
        kafka_settings=SETTINGS,
    )
    process = PipelineProcess(config, tmp_path / "pipeline" / "pipeline.log").start()
    try:
        cmdline = psutil.Process(process.pid).cmdline()
        assert not [word for word in cmdline if PASSWORD in word or "sasl" in word]
        files = {flag: Path(cmdline[cmdline.index(flag) + 1]) for flag in ("--kafka-config", "--java-config")}
        files["--spark-options"] = Path(cmdline[cmdline.index("--spark-options") + 1])
        assert all(p.parent == tmp_path / "pipeline" and mode(p) == 0o600 for p in files.values())
        assert read_settings(files["--kafka-config"]) == SETTINGS
        assert "sasl.jaas.config=" in files["--java-config"].read_text()
        assert json.loads(files["--spark-options"].read_text())["kafka.security.protocol"] == "SASL_SSL"
    finally:
        process.stop(timeout=10)
    assert not [p for p in files.values() if p.exists()]


def test_sotw_pipeline_is_given_a_settings_file_not_the_settings(tmp_path: Path) -> None:
    config = PipelineProcessConfig("h:1", tmp_path / "o", tmp_path / "c", kafka_settings=SETTINGS)
    argv = config.argv()
    assert argv[argv.index("--kafka-config") + 1] == str(tmp_path / "kafka.properties")
    assert "-X" not in argv and not [w for w in argv if PASSWORD in w]
    assert "--kafka-config" not in PipelineProcessConfig("h:1", tmp_path / "o", tmp_path / "c").argv()


def test_a_job_whose_settings_have_no_java_names_is_refused_at_start_naming_the_setting(
    tmp_path: Path,
) -> None:
    config = PipelineProcessConfig(
        "h:1", tmp_path / "o", tmp_path / "c", template=CommandTemplate(SLEEPER), kafka_settings={"x.y": "1"}
    )
    with pytest.raises(HarnessError, match="x.y has no Java client equivalent"):
        PipelineProcess(config, tmp_path / "log").start()
    assert not list(tmp_path.glob("*.properties")) and not list(tmp_path.glob("*.json"))


def test_the_locust_harness_and_feeders_read_secrets_from_a_file_they_delete(tmp_path: Path) -> None:
    live = LiveConfig(str(tmp_path), "smoke", bootstrap="h:1", kafka_settings=SETTINGS)
    path = live.write(tmp_path / "live.json")
    assert PASSWORD not in path.read_text()
    secrets = tmp_path / "live-secrets.properties"
    assert mode(secrets) == 0o600
    assert LiveConfig.read(path) == live and not secrets.exists()
    feeder = FeederConfig({}, "h:1", SETTINGS, str(tmp_path))
    path = feeder.write(tmp_path / "feeder.json")
    assert PASSWORD not in path.read_text()
    assert FeederConfig.read(path) == feeder and not (tmp_path / "feeder-secrets.properties").exists()


def test_a_worker_takes_the_secrets_an_assignment_names_from_its_own_settings_file() -> None:
    public = {k: v for k, v in SETTINGS.items() if k != "sasl.password"}
    assignment = {"kafka_settings": public, "kafka_secrets": ["sasl.password"]}
    assert ProcessSide(None, SETTINGS).settings_for(assignment) == SETTINGS
    with pytest.raises(
        HarnessError, match=r"needs sasl.password.*start this worker with --kafka-config FILE"
    ):
        ProcessSide(None, {}).settings_for(assignment)


def test_locust_listens_on_this_machine_unless_told_and_warns_when_others_can_press_the_buttons() -> None:
    from locust.argument_parser import get_empty_argument_parser, setup_parser_arguments

    from loadtest.locust.locustfile import add_options

    parser = get_empty_argument_parser()
    setup_parser_arguments(parser)
    add_options(parser)
    given = parser.parse_args([])
    assert (given.web_host, given.master_bind_host) == ("127.0.0.1", "127.0.0.1")
    assert parser.parse_args(["--web-host", "0.0.0.0"]).web_host == "0.0.0.0"
    assert exposure_warnings("127.0.0.1", False, True, "127.0.0.1", True) == []
    [web] = exposure_warnings("0.0.0.0", False, True, "127.0.0.1", True)
    assert "kill the pipeline" in web and "freeze the broker" in web and "--web-login" in web
    assert exposure_warnings("0.0.0.0", True, True, "127.0.0.1", False) == []
    [master] = exposure_warnings("127.0.0.1", False, True, "*", True)
    assert "every interface" in master and "--master-bind-host" in master


def test_the_night_hands_its_commands_a_settings_file_and_refuses_a_secret_on_its_command_line(
    tmp_path: Path,
) -> None:
    config = NightlyConfig(
        root=tmp_path, bootstrap="h:1", kafka_config_file=str(tmp_path / "kafka.properties")
    )
    runs = SideRuns(config, Side(CANDIDATE, "c0ffee", tmp_path, sys.executable), tmp_path / "c", say=print)
    argv = runs._sotw("run", "--load", "1x")
    assert argv[argv.index("--kafka-config") + 1] == str(tmp_path / "kafka.properties")
    with pytest.raises(KafkaArgsError, match="-X sasl.password"):
        nightly.main(["--compare-only", "--history", str(tmp_path), "-X", "sasl.password=x"])
    settings = tmp_path / "night.properties"
    settings.write_text("client.id=night\n")
    args = nightly.build_parser().parse_args(["--kafka-config", str(settings)])
    assert kafka_settings(args) == {"client.id": "night"}


SECURED_SCENARIO = """
[profiles.secured]
description = "the smoke run, with bounds wide enough for a busy machine, on a secured broker"
[profiles.secured.simulator]
sensors = 4
rows = 50
partitions = 1
rate = 300
session_interval_s = 6
seed = 3
[profiles.secured.pipeline]
policy = "ordered"
trigger = "1s"
session_timeout = "8s"
source = "{source}"
[profiles.secured.run]
warmup_s = 3
steady_s = 10
drain_max_s = 300
max_lag_s = 600
"""


ROOT = Path(__file__).resolve().parents[2]
PLAIN_JOB = (
    f"{{python}} {ROOT / 'tests' / 'loadtest' / 'jobs' / 'plain_kafka_job.py'} --bootstrap {{bootstrap}} "
    "--topics {pattern} --out {output} --group secured-job --mode highest-seq --kafka-config {kafka_config}"
)
SPARK_JOB = (
    f"{{python}} {ROOT / 'examples' / 'naive_pipeline.py'} --bootstrap {{bootstrap}} --topics {{pattern}} "
    "--out {output} --checkpoint {checkpoint} --trigger-ms {trigger_ms} --spark-options {spark_options}"
)
TEAM_FLAGS = ["--contract", "tables"]


#: Both dialects run in make test: sotw's pipeline on Spark's connector (the Java client's names, from the
#: settings file its process is given) and a team's plain confluent-kafka job (librdkafka's, from
#: {kafka_config}). The other two (60-80 s each) run in make test-slow, keeping make test within its budget.
@pytest.mark.parametrize(
    ("source", "job"),
    [
        pytest.param("sotw-kafka", [], marks=pytest.mark.slow, id="sotw-kafka"),
        pytest.param("spark-kafka", [], id="spark-kafka"),
        pytest.param(
            "sotw-kafka",
            ["--pipeline-cmd", PLAIN_JOB, *TEAM_FLAGS, "--lag-from", "group:secured-job"],
            id="plain-kafka-job",
        ),
        pytest.param(
            "sotw-kafka",
            ["--pipeline-cmd", SPARK_JOB, *TEAM_FLAGS],
            marks=pytest.mark.slow,
            id="spark-example-job",
        ),
    ],
)
def test_a_run_on_a_secured_broker_passes_and_its_password_is_on_no_command_line_and_in_no_file(
    secured_kafka: Any, tmp_path: Path, source: str, job: list[str]
) -> None:
    import subprocess
    import time

    password = read_settings(secured_kafka.admin_config)["sasl.password"]
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SECURED_SCENARIO.format(source=source))
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "sotw", "run", "--scenario", str(scenario), "--profile", "secured"]
    argv += ["--run-dir", str(run_dir), "--bootstrap", secured_kafka.bootstrap]
    argv += ["--kafka-config", str(secured_kafka.admin_config), *job]
    log = (tmp_path / "run.log").open("w")
    run = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    shown: list[list[str]] = []
    deadline = time.monotonic() + 900
    while run.poll() is None and time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            if any(password in word for word in p.info["cmdline"] or []):
                shown.append(p.info["cmdline"])
        time.sleep(0.5)
    if run.poll() is None:
        run.kill()
    log.close()
    assert run.wait() == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert not shown, "the password was on a command line"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]  # the run directory and the run's output
    assert files and not [p for p in files if password.encode() in p.read_bytes()]
    leftovers = [
        p
        for p in run_dir.rglob("*")
        if p.name in ("kafka.properties", "java.properties", "spark-options.json")
    ]
    assert not leftovers, "a settings file outlived the run"


@pytest.mark.slow
def test_a_locust_master_and_worker_on_a_secured_broker_verify_correct_without_the_password_crossing_the_wire(
    secured_kafka: Any, tmp_path: Path
) -> None:
    """The worker's secrets come from its own ``--kafka-config``: the master's assignment names them only."""
    import subprocess
    import time

    from tests.loadtest.locust_process import free_port, start, stop

    password = read_settings(secured_kafka.admin_config)["sasl.password"]
    session, port = tmp_path / "session", str(free_port())
    settings = ["--bootstrap", secured_kafka.bootstrap, "--kafka-config", str(secured_kafka.admin_config)]
    master = start(
        ["--master", "--headless", "--expect-workers=1", f"--master-bind-port={port}", *settings]
        + ["--sotw-profile=smoke", "--shape=steady", "--warmup=2", "--steady=8", f"--run-dir={session}"]
        + ["--check-correct"],
        tmp_path / "master.log",
    )
    worker = start(
        [
            "--worker",
            "--master-host=127.0.0.1",
            f"--master-port={port}",
            "--kafka-config",
            str(secured_kafka.admin_config),
        ],
        tmp_path / "worker.log",
    )
    shown: list[list[str]] = []
    deadline = time.monotonic() + 420
    try:
        while master.poll() is None and time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                if any(password in word for word in p.info["cmdline"] or []):
                    shown.append(p.info["cmdline"])
            time.sleep(0.5)
        code = master.wait(timeout=1) if master.poll() is not None else stop(master)
    finally:
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(worker)
    assert code == 0, (tmp_path / "master.log").read_text(errors="replace")[-3000:]
    assert not shown, "the password was on a command line"
    assert (session / "run-1" / "results.json").is_file()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]  # the session and both Locust logs
    assert not [p for p in files if password.encode() in p.read_bytes()]
