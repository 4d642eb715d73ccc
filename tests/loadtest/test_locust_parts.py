"""The Locust side's small parts: shapes, users to load, aggregated request events, the UI's login guard.

And Stop's: a Start refused while a run is being verified, the runner's state as the UI polls it during a
stop, and the verification's progress in the Correctness tab. And the job under test: ``sotw run``'s flags,
carried to the harness process, and which job each run starts or shares.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import pytest
from locust import User, constant, events, task
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment

from loadtest.cli import _parser as harness_parser
from loadtest.errors import HarnessError
from loadtest.locust.conductor import Conductor
from loadtest.locust.driver import ACK_NAME, REQUEST_TYPE, count_aggregated, fire_acks
from loadtest.locust.fleetplan import LiveConfig, part_config, process_factor, users_for
from loadtest.locust.liverun import run_job
from loadtest.locust.locustfile import SensorLoad, add_options, cache_locust_defaults, job_of
from loadtest.locust.runview import RunView
from loadtest.locust.settings import LocustSettings
from loadtest.locust.shapes import make_shape
from loadtest.locust.webui import correctness_rows, install
from loadtest.reports.results import Results
from loadtest.run.job import JobSpec, LagFrom, job_process
from loadtest.run.jobargs import job_from_args
from loadtest.run.processes import PipelineProcess
from loadtest.run.profile import load_profile
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig


def test_step_climbs_from_1x_to_10x_in_equal_stages_then_ends() -> None:
    shape = make_shape("step", steady_s=100.0)
    assert [level.load for level in shape.levels] == [float(k) for k in range(1, 11)]
    assert shape.load_at(0) == 1.0 and shape.load_at(95) == 10.0 and shape.load_at(100) is None


def test_spike_goes_to_its_peak_and_back_and_soak_holds_an_hour() -> None:
    spike = make_shape("spike", steady_s=30.0, load=5.0)
    assert [spike.load_at(t) for t in (0, 15, 25)] == [1.0, 5.0, 1.0]
    assert make_shape("soak", steady_s=30.0).seconds == 3600.0


def test_an_unknown_shape_is_refused_naming_the_choices() -> None:
    with pytest.raises(HarnessError, match="steady, step, spike, soak"):
        make_shape("ramp", steady_s=10.0)


def test_ten_users_make_1x_and_a_process_without_users_keeps_a_trickle() -> None:
    assert users_for(10.0, 10.0) == 100 and users_for(0.01, 10.0) == 1
    assert process_factor(25, 10.0, rate=300.0) == 2.5
    assert 0 < process_factor(0, 10.0, rate=300.0) < 0.1


def test_workers_get_disjoint_sensor_ids_that_cover_the_fleet() -> None:
    profile = load_profile("smoke")
    parts = [part_config(profile, "p-", i, 3, 1.0) for i in range(3)]
    assert sum(p.sensors for p in parts) == profile.simulator.sensors
    ids = [set(range(p.first_sensor, p.first_sensor + p.sensors)) for p in parts]
    assert not (ids[0] & ids[1] or ids[1] & ids[2] or ids[0] & ids[2])


def test_one_aggregated_event_counts_every_message_it_stands_for() -> None:
    env = Environment(user_classes=[SensorLoad], events=events)
    env.create_local_runner()
    listener = count_aggregated(env)
    env.events.request.add_listener(listener)
    try:
        fired = fire_acks(env, acks=[[120, 500], [124, 250], [400, 250]], failures=[["timed out", 7]])
        entry = env.stats.get(ACK_NAME, REQUEST_TYPE)
        assert fired == 3, "120 and 124 ms share a bucket of Locust's; one event per error"
        assert entry.num_requests == 1007 and entry.num_failures == 7
        assert entry.get_response_time_percentile(0.5) == 120
    finally:
        env.events.request.remove_listener(listener)
        env.runner.quit()


def test_sotw_routes_ask_for_a_login_when_locust_runs_with_web_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["locust"])  # Locust's UI reads its extra options from the command line
    env = Environment(user_classes=[SensorLoad], events=events)
    env.create_local_runner()
    web_ui = env.create_web_ui("127.0.0.1", 0, web_login=True)
    web_ui.app.config["SECRET_KEY"] = "test"  # what an auth plugin sets, with its user loader
    web_ui.login_manager.user_loader(lambda user_id: None)  # nobody is logged in
    install(web_ui, Conductor(env, LocustSettings(LiveConfig(str(tmp_path), "smoke")), None, None))
    client = web_ui.app.test_client()
    try:
        for path in ("/sotw/", "/sotw/state", "/sotw/history.csv"):
            response = client.get(path)
            assert response.status_code == 302 and "login" in response.headers["Location"], path
        assert client.post("/sotw/faults", json={"gap": 0.5}).status_code == 302
    finally:
        env.runner.quit()  # the UI's server never served: the test client calls the app directly


def _ui(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Environment, Any, Conductor]:
    """Locust's UI with sotw's routes and a conductor without a harness (the tests set its run by hand)."""
    monkeypatch.setattr(sys, "argv", ["locust"])
    env = Environment(user_classes=[SensorLoad], events=events)
    env.create_local_runner()
    web_ui = env.create_web_ui("127.0.0.1", 0)
    conductor = Conductor(env, LocustSettings(LiveConfig(str(tmp_path), "smoke")), None, None)
    install(web_ui, conductor)
    return env, web_ui, conductor


def test_a_start_while_the_last_run_is_being_verified_is_refused_naming_where_the_verification_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, web_ui, conductor = _ui(tmp_path, monkeypatch)
    run = RunView(1, str(tmp_path / "run-1"), "p-run-1-", 0, finishing=True, stopped_ms=0)
    run.note_progress("settle", "sessions the load left open time out in the pipeline: 12 s left")
    conductor.run = run
    try:
        reply = web_ui.app.test_client().post("/swarm", data={"user_count": 8, "spawn_rate": 8}).get_json()
        assert reply["success"] is False
        assert "run 1 is still being verified after its stop (settle: " in reply["message"]
        assert env.runner.state == "ready", "Locust never started the run"
        env.runner.update_state("running")
        assert conductor.start_refusal() is None, "the UI's Edit of a running run's users is no new run"
        env.runner.update_state("stopped")
        run.finished.set()
        assert conductor.start_refusal() is None
    finally:
        env.runner.quit()


def test_the_ui_polls_the_runners_state_as_it_is_not_as_locust_cached_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, web_ui, _ = _ui(tmp_path, monkeypatch)
    client = web_ui.app.test_client()
    try:
        assert client.get("/stats/requests").get_json()["state"] == "ready"
        env.runner.update_state("stopped")  # within Locust's 2 s cache of the response
        assert client.get("/stats/requests").get_json()["state"] == "stopped"
    finally:
        env.runner.quit()


def shown(run: RunView) -> dict[str, Any]:
    """The Correctness tab's rows for ``run``, as the UI gets them (``Conductor.state``'s run)."""
    view = {"phase": run.phase, "verification": run.verification(), "verdict": run.verdict}
    return {r["name"]: r["value"] for r in correctness_rows({"run": view})}


def test_the_correctness_tab_follows_the_verification_after_stop_to_its_verdict() -> None:
    run = RunView(2, "run-2", "p-run-2-", 0)
    assert shown(run)["verdict (final)"] == "after the run" and "verification after Stop" not in shown(run)
    run.finishing, run.stopped_ms = True, int(time.time() * 1000) - 3000
    run.note_progress("drain", "1,234 offsets behind; 2 s of at most 60 s")
    assert shown(run)["verdict (final)"] == "being verified"
    assert shown(run)["verification after Stop"] == (
        "drain: 1,234 offsets behind; 2 s of at most 60 s (3 s since Stop)"
    )
    run.verdict = {"verdict": "PASS", "reasons": []}
    assert shown(run)["verdict (final)"] == "PASS" and "verification after Stop" not in shown(run)
    failed = RunView(3, "run-3", "p-run-3-", 0, stopped_ms=0, error="the run's verdict failed: disk full")
    assert shown(failed)["verdict (final)"] == "none: the verification failed"
    assert shown(failed)["verification after Stop"] == "failed: the run's verdict failed: disk full"


class SlowToStop(User):
    """A user whose ``on_stop`` takes a second: Locust's runner stays in CLEANUP that long."""

    wait_time = constant(1.0)

    @task
    def hold(self) -> None:
        """Nothing to do."""

    def on_stop(self) -> None:
        """Take a second."""
        gevent.sleep(1.0)


def test_a_poll_that_comes_while_locust_stops_is_answered_once_the_runner_has_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["locust"])
    env = Environment(user_classes=[SlowToStop], events=events)
    env.create_local_runner()
    web_ui = env.create_web_ui("127.0.0.1", 0)
    install(web_ui, Conductor(env, LocustSettings(LiveConfig(str(tmp_path), "smoke")), None, None))
    try:
        env.runner.start(2, spawn_rate=2)
        while env.runner.user_count < 2:
            gevent.sleep(0.05)
        stopping = gevent.spawn(env.runner.stop)
        while env.runner.state != "cleanup":
            gevent.sleep(0.01)
        # Locust's UI stops polling on any state but SPAWNING or RUNNING: CLEANUP would stay on screen.
        assert web_ui.app.test_client().get("/stats/requests").get_json()["state"] == "stopped"
        stopping.join(5)
    finally:
        env.runner.quit()


def test_a_worker_builds_locust_s_option_defaults_once_and_runs_without_the_cache_where_locust_lacks_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import locust.argument_parser as parser

    monkeypatch.setattr(parser, "default_args_dict", parser.default_args_dict)  # restored after the test
    assert cache_locust_defaults() and cache_locust_defaults()
    assert parser.default_args_dict() is parser.default_args_dict(), "built once"

    monkeypatch.delattr(parser, "default_args_dict")
    with caplog.at_level("WARNING", logger="sotw.locust"):
        assert not cache_locust_defaults()
    assert "has no argument_parser.default_args_dict" in caplog.text


JOB_FLAGS = (
    "--pipeline-cmd",
    "--attach",
    "--output",
    "--lag-from",
    "--contract",
    "--format",
    "--ignore-column",
)
TEAM_JOB = "{python} job.py --bootstrap {bootstrap} --topics {pattern} --out {output} --group g"


def locust_options(*args: str) -> Any:
    """What Locust's parser, with sotw's options added, makes of ``args``."""
    parser = LocustArgumentParser()
    add_options(parser)
    return parser.parse_args(list(args))


def test_sotw_locust_takes_sotw_run_s_job_flags_with_their_names_and_help_and_keeps_them_out_of_the_start_form() -> (
    None
):
    parser = LocustArgumentParser()
    add_options(parser)
    run = {s: a for a in harness_parser("run")._actions for s in a.option_strings}
    on_locust = {s: a for a in parser._actions for s in a.option_strings}
    for flag in (*JOB_FLAGS, "--source", "--min-judged"):
        assert (on_locust[flag].dest, on_locust[flag].help) == (run[flag].dest, run[flag].help), flag
    assert not {on_locust[f].dest for f in (*JOB_FLAGS, "--source", "--min-judged")} & set(
        parser.args_included_in_web_ui
    )

    flags = [
        "--pipeline-cmd",
        TEAM_JOB,
        "--contract",
        "tables",
        "--lag-from",
        "group:g",
        "--ignore-column",
        "x",
    ]
    assert job_of(locust_options(*flags)) == job_from_args(harness_parser("run").parse_args(flags))


def test_a_pipeline_given_by_its_output_and_checkpoint_is_a_job_attached_to() -> None:
    given = locust_options("--no-pipeline", "--pipeline-output", "/o", "--pipeline-checkpoint", "/c")
    assert job_of(given) == JobSpec(attach=True, output=Path("/o"), lag_from=LagFrom("checkpoint", "/c"))
    assert job_of(locust_options("--no-pipeline")) is None
    with pytest.raises(SotwError, match="exclude each other"):
        job_of(locust_options("--no-pipeline", "--pipeline-cmd", TEAM_JOB + " --checkpoint {checkpoint}"))
    with pytest.raises(SotwError, match="go together"):
        job_of(locust_options("--no-pipeline", "--pipeline-output", "/o"))


def test_the_job_reaches_the_harness_process_through_its_config(tmp_path: Path) -> None:
    job = JobSpec(command=TEAM_JOB, lag_from=LagFrom("group", "g"), contract="tables", ignore_columns=("x",))
    config = LiveConfig(str(tmp_path), "smoke", source="spark-kafka", job=job, pipeline=False)
    read = LiveConfig.read(config.write(tmp_path / "live.json"))
    assert read == config and read.load_profile().pipeline.source == "spark-kafka"


@dataclass
class FakeSession:
    """What a run takes from its Locust session (``loadtest.locust.liverun.Session``), without starting it."""

    config: LiveConfig
    kafka: KafkaConfig
    profile: Any
    dir: Path
    prefix: str = "sotw-sensor-abc123-"
    pipeline: PipelineProcess | None = None
    where: tuple[str, ...] = ()


def test_a_team_s_job_is_the_run_s_own_and_sotw_s_shared_pipeline_is_read_on_the_run_s_topics_only(
    tmp_path: Path, kafka: KafkaConfig
) -> None:
    profile = load_profile("smoke")
    team = JobSpec(command=TEAM_JOB, lag_from=LagFrom("group", "g"), contract="tables")
    session = FakeSession(LiveConfig(str(tmp_path), "smoke", job=team), kafka, profile, tmp_path)
    run_dir, prefix = tmp_path / "run-2", f"{session.prefix}run-2-"
    job, owns = run_job(session, run_dir, prefix)
    assert owns and job is not None and job.output.path == run_dir / "pipeline" / "output"
    assert job.output.topic_prefix is None, "the job's output holds only this run's data"
    argv = job.process.config.argv()
    assert argv[argv.index("--topics") + 1] == f"^{prefix}.*" and str(run_dir / "pipeline" / "output") in argv

    shared = job_process(None, profile, kafka, tmp_path / "pipeline", session.prefix, (), tmp_path)
    session = FakeSession(LiveConfig(str(tmp_path), "smoke"), kafka, profile, tmp_path, pipeline=shared)
    job, owns = run_job(session, run_dir, prefix)
    assert not owns and job is not None and job.process is shared
    assert (job.output.path, job.output.topic_prefix) == (tmp_path / "pipeline" / "output", prefix)


def test_a_headless_run_whose_only_broken_threshold_is_an_inconclusive_verdict_exits_4() -> None:
    from loadtest.locust.headless import EXIT_CODE, exit_code_of
    from loadtest.reports.results import RunInfo, Verdict

    def run(verdict: str) -> Results:
        return Results(RunInfo("r", 0, 0, 1.0, "ordered"), Verdict(verdict, ["why"]))

    unsure = ["--check-verdict: INCONCLUSIVE: why"]
    assert exit_code_of(unsure, run("INCONCLUSIVE")) == 4
    assert (
        exit_code_of([*unsure, "lag age max 9.0 s is not below --check-lag-age 5 s"], run("INCONCLUSIVE"))
        == 3
    )
    assert exit_code_of(["--check-verdict: FAIL: why"], run("FAIL")) == EXIT_CODE == 3
