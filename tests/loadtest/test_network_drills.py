"""Network drills: partitions, flaky and capped links between the broker's nodes, the pipeline and the simulator.

The incidents' parameters are checked without a network. The runs are short forms of the shipped drills on the
``smoke`` profile, each node and the pipeline in a namespace of their own (``--netns``); they need root and
nftables, skip saying which is missing, and are marked slow (`make test-slow`). ``make test`` keeps one cut
and heal seen by a real Kafka client (tests/test_broker_netns.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import pytest

from loadtest.cli import run_drill
from loadtest.errors import HarnessError
from loadtest.gameday.drills import DrillOutcome, load_drill
from loadtest.reports.results import IncidentResult
from loadtest.run.job import JobSpec, LagFrom
from sotw.network import missing
from tests.loadtest.sample_results import sample_results
from tests.loadtest.test_drills import drill, passed

MISSING = missing()
needs_network = pytest.mark.skipif(
    bool(MISSING), reason="a network of namespaces needs " + "; ".join(MISSING)
)

ROOT = Path(__file__).resolve().parents[2]
NETWORK_DRILLS = (
    "isolate-leader",
    "split-minority",
    "pipeline-cut",
    "producers-cut",
    "flaky-network",
    "slow-link",
)


def test_the_six_network_drills_ship_on_a_network_of_hosts_with_their_incidents():
    kinds = {}
    for name in NETWORK_DRILLS:
        d = load_drill(name)
        assert d.netns and d.description and d.expect["rows_lost"] == 0, name
        kinds[name] = {i.kind for i in d.incidents}
    assert kinds["flaky-network"] == {"flaky_link"} and kinds["slow-link"] == {"link_cap"}
    assert all(
        kinds[n] == {"partition"}
        for n in ("isolate-leader", "split-minority", "pipeline-cut", "producers-cut")
    )


@pytest.mark.parametrize(
    ("incident", "message"),
    [
        (
            "kind='partition'\nside_a='moon'",
            r"side_a must name groups \(leader, controller, brokers, pipeline",
        ),
        ("kind='partition'\nside_b=[]", "side_b needs at least one group"),
        ("kind='partition'\none_way='yes'", "one_way must be true or false"),
        ("kind='flaky_link'\npercent=500", "percent must be a whole number from 0 to 100, got 500"),
        ("kind='link_cap'\nrate='fast'", "rate"),
        ("kind='link_cap'\nhost='rest'", "the root namespace has no link of its own"),
    ],
)
def test_a_bad_network_incident_is_refused_naming_the_problem(incident: str, message: str):
    with pytest.raises(HarnessError, match=message):
        drill(f"[drill]\nprofile='smoke'\nnetns=true\n[[incidents]]\nat_s=1\n{incident}\n")


@pytest.mark.parametrize(
    ("incident", "message"),
    [
        ("kind='partition'\nside_a='rest'\nside_b='brokers'", "at least one side a host or group other than"),
        ("kind='partition'\nside_a='pipeline'\nside_b='pipeline'", "must name different hosts"),
        ("kind='link_cap'\nhost=['pipeline', 'n1']", "host must be one host"),
    ],
)
def test_sides_that_cannot_be_told_apart_are_refused_when_the_drill_is_read(incident: str, message: str):
    with pytest.raises(HarnessError, match=message):
        drill(f"[drill]\nprofile='smoke'\nnetns=true\n[[incidents]]\nat_s=1\n{incident}\n")


@pytest.mark.parametrize(
    ("head", "incident", "message"),
    [
        ("netns=true", "side_a=2", "side_a names node 2, but the broker has nodes 1 to 1"),
        (
            "netns=true\nbroker='kafka-3'",
            "side_b='n4'",
            "side_b names node 'n4', but the broker has nodes 1 to 3",
        ),
        (
            "netns=true\npipeline={master='spark://127.0.0.1:7077'}",
            "side_a='pipeline'",
            "executors \\(--master\\)",
        ),
    ],
)
def test_a_network_drill_the_run_could_not_carry_out_is_refused_before_anything_starts(
    tmp_path: Path, head: str, incident: str, message: str
):
    cut = drill(f"[drill]\nprofile='smoke'\n{head}\n[[incidents]]\nkind='partition'\nat_s=1\n{incident}\n")
    with pytest.raises(HarnessError, match=message):
        run_drill(cut, tmp_path / "run", None)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_an_incident_that_failed_fails_the_scorecard_and_a_network_incident_is_plain_data():
    cut = drill(
        "[drill]\nprofile='smoke'\nnetns=true\n[[incidents]]\nkind='partition'\nat_s=1\n[expect]\nrows_lost=0\n"
    )
    failed = IncidentResult("partition", "partition", 1, 2, error="partition: no host 'n9'")
    correct = sample_results().correctness
    score = cut.score(DrillOutcome("PASS", correct, [failed], stopped=False, stop_message=""))
    assert not score.passed and score.checks[-1].name == "carried out (partition)"
    assert json.loads(json.dumps(dataclasses.asdict(cut.incidents[0]))) == {
        "at_s": 1,
        "name": "",
        "duration_s": 30.0,
        "side_a": "leader",
        "side_b": "rest",
        "one_way": False,
    }


def test_a_network_incident_without_a_network_is_refused_before_anything_starts(tmp_path: Path):
    cut = drill("[drill]\nprofile='smoke'\n[[incidents]]\nkind='partition'\nat_s=1\nside_a='pipeline'\n")
    with pytest.raises(
        HarnessError, match="incident partition needs the run on a network of hosts: netns = true"
    ):
        run_drill(cut, tmp_path / "run", None)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


PIPELINE_CUT = """
[drill]
description = "the pipeline cut from the broker for 15 s"
profile = "smoke"
netns = true
pipeline = { session_timeout = "60s" }
run = { warmup_s = 3, steady_s = 50, max_lag_s = 600, drain_max_s = 300 }

[[incidents]]
kind = "partition"
at_s = 5
side_a = "pipeline"
side_b = "brokers"
duration_s = 15

[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
recover_s = 90
"""


@needs_network
@pytest.mark.slow
@pytest.mark.parametrize("source", ["sotw-kafka", "spark-kafka"])
def test_a_pipeline_cut_from_the_broker_goes_on_where_it_was_after_the_heal(tmp_path: Path, source: str):
    d = drill(PIPELINE_CUT)
    d = dataclasses.replace(d, pipeline={**d.pipeline, "source": source})
    results = run_drill(d, tmp_path / "run", None)
    assert passed(results)
    assert "network cut ['pipeline'] | ['n1']" in " ".join(
        incident.notes[0] for incident in results.incidents
    )


PLAIN_JOB = (
    f"{{python}} {ROOT / 'tests' / 'loadtest' / 'jobs' / 'plain_kafka_job.py'} --bootstrap {{bootstrap}} "
    "--topics {pattern} --out {output} --group cut-job --mode highest-seq"
)


@needs_network
@pytest.mark.slow
def test_a_job_that_skips_to_the_latest_offset_after_a_silence_fails_the_cut_on_the_rows_it_skipped(
    tmp_path: Path,
):
    """The planted bug shows only under a partition: under steady load the job is never silent for 3 s."""
    job = JobSpec(
        command=PLAIN_JOB + " --skip-to-latest-after-s 3",
        lag_from=LagFrom("group", "cut-job"),
        contract="tables",
    )
    results = run_drill(drill(PIPELINE_CUT), tmp_path / "run", None, job=job)
    assert results.drill is not None and not results.drill.passed
    assert results.correctness is not None and results.correctness.rows_lost > 0
    assert results.correctness.blame.get("pipeline", 0) > 0 and not results.correctness.blame.get("broker")
    log = (tmp_path / "run" / "pipeline" / "pipeline.log").read_text()
    skipped = [int(n) for n in re.findall(r"s of silence: skipped (\d+)", log)]
    assert max(skipped) > 0, log[-2000:]  # the cut's backlog, skipped after the heal


ISOLATE_LEADER = """
[drill]
description = "the busiest leader of three nodes cut from everything for 20 s"
profile = "smoke"
broker = "kafka-3"
netns = true
pipeline = { session_timeout = "60s" }
run = { warmup_s = 3, steady_s = 60, max_lag_s = 600, drain_max_s = 300 }

[[incidents]]
kind = "partition"
at_s = 5
side_a = "leader"
side_b = "rest"
duration_s = 20

[[incidents]]
kind = "flaky_link"
at_s = 35
percent = 5
duration_s = 10

[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
leaders_moved_s = 20
replicated_s = 120
"""


@needs_network
@pytest.mark.slow
def test_an_isolated_leader_hands_its_partitions_over_and_catches_up_with_nothing_lost(tmp_path: Path):
    results = run_drill(drill(ISOLATE_LEADER), tmp_path / "run", None)
    assert passed(results)
    cut = next(i for i in results.incidents if i.label == "partition")
    assert cut.figures["leaders_moved_s"] > 0 and "led the most partitions" in cut.notes[0]


CONTROLLER_PRODUCERS_LINK = """
[drill]
description = "short forms of split-minority (the active controller's node), producers-cut and slow-link"
profile = "smoke"
broker = "kafka-3"
netns = true
pipeline = { session_timeout = "60s" }
run = { warmup_s = 3, steady_s = 75, max_lag_s = 600, drain_max_s = 300 }

[[incidents]]
kind = "partition"
at_s = 5
side_a = "controller"
side_b = "brokers"
duration_s = 15

[[incidents]]
kind = "partition"
at_s = 30
side_a = "simulator"
side_b = "brokers"
duration_s = 10

[[incidents]]
kind = "link_cap"
at_s = 50
host = "pipeline"
rate = "1mbit"
duration_s = 10

[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
controller_moved_s = 20
replicated_s = 120
"""


@needs_network
@pytest.mark.slow
def test_the_controller_the_producers_and_a_slow_link_each_cut_in_turn_lose_nothing(tmp_path: Path):
    results = run_drill(drill(CONTROLLER_PRODUCERS_LINK), tmp_path / "run", None)
    assert passed(results)
    controller, producers, link = results.incidents
    assert controller.figures["controller_moved_s"] > 0 and "was the active controller" in controller.notes[0]
    assert "network cut ['gateway'] | ['n1', 'n2', 'n3']" in producers.notes[0]
    assert "capped at 1mbit" in link.notes[0]


def test_the_planted_bug_is_in_the_job_and_off_by_default():
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "loadtest" / "jobs" / "plain_kafka_job.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--skip-to-latest-after-s" in done.stdout


LOCUST_SCENARIO = """
[profiles.cut]
description = "the pipeline cut from the broker for 10 s, in a Locust session on a network of hosts"
[profiles.cut.simulator]
sensors = 4
rows = 20
partitions = 1
rate = 300
[profiles.cut.pipeline]
session_timeout = "60s"
[profiles.cut.run]
warmup_s = 3
steady_s = 30
max_lag_s = 600
drain_max_s = 300
[[profiles.cut.incidents]]
kind = "partition"
at_s = 5
side_a = "pipeline"
side_b = "brokers"
duration_s = 10
"""


@needs_network
@pytest.mark.slow
def test_a_locust_session_on_a_network_of_hosts_cuts_its_pipeline_and_verifies_nothing_lost(tmp_path: Path):
    """``sotw locust --netns``: the session's broker and pipeline in namespaces, a profile's partition honoured."""
    from tests.loadtest.locust_process import start, stop

    scenario = tmp_path / "scenario.toml"
    scenario.write_text(LOCUST_SCENARIO)
    session, log = tmp_path / "session", tmp_path / "locust.log"
    locust = start(
        ["--headless", "--netns", "--scenario", str(scenario), "--profile", "cut", "--shape=steady"]
        + ["--load=1x", f"--run-dir={session}"],
        log,
        sotw=True,
    )
    try:
        locust.wait(timeout=600)
    finally:
        stop(locust)
    results = json.loads((session / "run-1" / "results.json").read_text())
    cut = results["incidents"][0]
    assert cut["kind"] == "partition" and cut["error"] is None, log.read_text()[-3000:]
    assert "network cut ['pipeline'] | ['n1']" in cut["notes"][0]
    assert results["correctness"]["rows_lost"] == 0 and results["correctness"]["passed"], results["verdict"]


@needs_network
@pytest.mark.slow
def test_a_partition_chosen_in_the_locust_panel_cuts_the_pipeline_and_the_run_verifies_nothing_lost(
    tmp_path: Path, artifact_dir: Path
):
    """The person at the Locust UI: on a ``--netns`` session, the panel's incident form cuts the pipeline off."""
    from playwright.sync_api import expect, sync_playwright

    from tests.loadtest.locust_process import free_port, start, stop
    from tests.loadtest.test_locust_browser import started_in_the_ui, wait_ready

    port, log, session = free_port(), tmp_path / "locust.log", tmp_path / "session"
    url = f"http://127.0.0.1:{port}"
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(LOCUST_SCENARIO.split("[[profiles.cut.incidents]]")[0])  # the panel cuts instead
    args = ["--netns", "--scenario", str(scenario), "--profile", "cut", "--run-dir", str(session)]
    proc = start(args + ["--web-host", "127.0.0.1", "--web-port", str(port)], log, sotw=True)
    try:
        wait_ready(url, log, 300)
        with sync_playwright() as playwright:
            browser, page = started_in_the_ui(playwright, url)
            page.locator("#sotw-button").click()
            panel = page.frame_locator("#sotw-frame")
            panel.locator("#incident-kind").select_option("partition")
            panel.locator("#incident-params").fill(
                json.dumps({"side_a": "pipeline", "side_b": "brokers", "duration_s": 10})
            )
            panel.locator("#incident-form button[type=submit]").click()
            expect(panel.locator("#incident-message")).to_have_text("sent", timeout=10_000)
            expect(panel.locator("#sotw-log")).to_contain_text(
                "network cut ['pipeline'] | ['n1']", timeout=30_000
            )
            expect(panel.locator("#sotw-log")).to_contain_text("healed", timeout=60_000)
            page.screenshot(path=str(artifact_dir / "locust-partition.png"))
            page.locator("#sotw-button").click()
            time.sleep(20)  # the pipeline catches up on what waited in Kafka during the cut
            page.get_by_role("button", name="Stop").click()
            correctness = page.locator("#sotw-correctness-live")
            page.get_by_role("tab", name="Correctness").click()
            expect(correctness).to_contain_text(re.compile(r"verdict \(final\)\s*PASS"), timeout=300_000)
            browser.close()
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    results = json.loads((session / "run-1" / "results.json").read_text())
    (cut,) = [i for i in results["incidents"] if i["kind"] == "partition"]
    assert cut["error"] is None and "healed" in cut["notes"][-1]
    assert results["correctness"]["rows_lost"] == 0 and results["correctness"]["rows_repeated"] == 0
