"""Game-day drills against the real broker, pipeline and simulator: every incident kind, and scorecards that fail.

Each drill here is a short form of a shipped one, on the ``smoke`` profile, with recovery bounds wide enough for a
busy 2-core CI machine (a Spark restart alone takes 10-30 s there); the shipped drills' own bounds are checked by
running them (docs/benchmarks.md, "Game-day drills"). The two longer runs (every incident kind in one run, the
broker's restart) are marked slow: `make test-slow` and the nightly job run them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from loadtest.cli import run_drill
from loadtest.errors import HarnessError
from loadtest.gameday.drills import Drill, drill_from_mapping, load_drill, scorecard_text, shipped
from loadtest.reports.results import Results


def drill(text: str, name: str = "test") -> Drill:
    return drill_from_mapping(name, tomllib.loads(text))


def passed(results: Results) -> bool:
    """Whether the drill passed; its scorecard (and the incidents' notes) printed for the failure message."""
    assert results.drill is not None
    print(scorecard_text(results.drill))
    for i in results.incidents:
        print(f"{i.label}: {i.notes} error={i.error}")
    return results.drill.passed


def checks(results: Results) -> dict[str, bool]:
    assert results.drill is not None
    return {c.name: c.met for c in results.drill.checks}


def incident(results: Results, label: str):
    return next(i for i in results.incidents if i.label == label)


EVERY_KIND_BUT_THE_BROKERS_DATA = """
[drill]
description = "one run, one of each incident the pipeline must ride out"
profile = "smoke"
load = "1x"
run = { warmup_s = 3, steady_s = 125, max_lag_s = 600, drain_max_s = 300 }

[[incidents]]
kind = "faults"
at_s = 2
sensors = ["0001"]
faults = { gap = 0.02 }
duration_s = 10

[[incidents]]
kind = "sensor_storm"
at_s = 4
sensors = 2

[[incidents]]
kind = "load"
at_s = 6
factor = 3
duration_s = 6

[[incidents]]
kind = "pipeline_kill"
at_s = 14
restart_after_s = 2

[[incidents]]
kind = "pipeline_restart"
at_s = 40
downtime_s = 1
settings = { trigger = "500ms" }

[[incidents]]
kind = "broker_pause"
at_s = 75
duration_s = 4

[[incidents]]
kind = "cpu_hog"
at_s = 85
duration_s = 5

[[incidents]]
kind = "checkpoint_stall"
at_s = 95
duration_s = 5

[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
recover_s = 90
"""


@pytest.mark.slow
def test_every_incident_kind_but_data_loss_is_ridden_out_with_nothing_lost_or_repeated(tmp_path: Path):
    results = run_drill(drill(EVERY_KIND_BUT_THE_BROKERS_DATA), tmp_path / "run", None)

    assert passed(results)
    kinds = [i.kind for i in results.incidents]
    assert kinds == [
        "faults", "sensor_storm", "load", "pipeline_kill", "pipeline_restart", "broker_pause", "cpu_hog",
        "checkpoint_stall",
    ]  # fmt: skip
    assert all(i.error is None and i.end_ms >= i.start_ms > 0 for i in results.incidents)
    kill = incident(results, "pipeline_kill")
    assert kill.detect_s is not None and kill.peak_lag_age_s > 0  # killing the pipeline shows as lag
    assert "pipeline restarted on the same checkpoint" in kill.notes
    # The per-sensor fault window reached the simulator: its gaps are in the ledger and were detected.
    assert results.correctness is not None
    assert any(f.kind == "gap" and f.injected > 0 and f.recall == 1.0 for f in results.correctness.faults)
    html = (tmp_path / "run" / "results.json").read_text()
    assert '"drill"' in html and '"incidents"' in html


@pytest.mark.slow
@pytest.mark.parametrize("load", ["1x", "10x"])  # broker-restart and broker-restart-10x
def test_a_broker_restarted_mid_run_loses_nothing(tmp_path: Path, load: str):
    results = run_drill(
        drill(
            f"""
[drill]
description = "the broker restarts mid-run"
profile = "smoke"
load = "{load}"
# Longer than the outage (3 s down, then Kafka's stop and start): the smoke profile's 8 s would close every
# open session while the broker is away, and their later rows would count as lost.
pipeline = {{ session_timeout = "30s" }}
run = {{ warmup_s = 3, steady_s = 40, max_lag_s = 600, drain_max_s = 300 }}
[[incidents]]
kind = "broker_restart"
at_s = 5
downtime_s = 3
[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
recover_s = 60
"""
        ),
        tmp_path / "run",
        None,
    )
    assert passed(results)
    restart = incident(results, "broker_restart")
    assert 3.0 <= (restart.end_ms - restart.start_ms) / 1000 < 30


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
@pytest.mark.system  # a drill: a broker and a pipeline of its own
def test_broker_data_loss_under_strict_stops_the_pipeline_within_five_triggers_naming_the_partition(
    tmp_path: Path,
):
    # The shipped drill asks for 2 triggers. A partition the pipeline had read to its end that vanishes is
    # judged when it comes back (a topic deleted after its last record was read loses nothing), and when it
    # comes back depends on the simulator creating its topics again and sending its first message after the
    # restart: 1.9-2.4 s after the incident's end on a busy machine, 3 or 4 triggers, hence 5, as the
    # unclean-election-strict drill allows for the same reason.
    results = run_drill(
        drill(
            """
[drill]
description = "data loss under strict"
profile = "smoke"
simulator = { faults = {} }
pipeline = { policy = "strict", fail_on_data_loss = true }
run = { warmup_s = 3, steady_s = 30, max_lag_s = 600, drain_max_s = 120 }
[[incidents]]
kind = "broker_data_loss"
at_s = 5
downtime_s = 1
[expect]
stopped = true
stop_within_triggers = 5
stop_message = ["Kafka data lost", "topic '[^']+' partition \\\\d+ offsets (\\\\[\\\\d+, \\\\d+\\\\)|from \\\\d+ on)"]
"""
        ),
        tmp_path / "run",
        None,
    )
    assert passed(results)
    assert results.pipeline_stop is not None and "failOnDataLoss" in results.pipeline_stop


@pytest.mark.slow  # over 30 s on CI: the nightly job runs it (make test-slow)
@pytest.mark.system  # a drill: a broker and a pipeline of its own
def test_a_sabotaged_pipeline_fails_its_kill_drill_on_the_rows_it_lost(tmp_path: Path):
    results = run_drill(
        drill(
            """
[drill]
description = "a pipeline that commits batch 3 without its rows, killed and restarted"
profile = "smoke"
pipeline = { extra_args = ["--drop-batch", "3"] }
run = { warmup_s = 3, steady_s = 20, max_lag_s = 600, drain_max_s = 300 }
[[incidents]]
kind = "pipeline_kill"
at_s = 3
restart_after_s = 1
[expect]
rows_lost = 0
correct = true
stopped = false
"""
        ),
        tmp_path / "run",
        None,
    )
    assert results.drill is not None and not results.drill.passed
    assert checks(results) == {"rows_lost": False, "correct": False, "stopped": True}
    assert results.correctness is not None and results.correctness.blame.get("pipeline", 0) > 0


def test_every_shipped_drill_reads_and_names_its_expectations():
    names = set(shipped())
    assert {"pipeline-kill-1x", "pipeline-kill-10x", "deploy", "broker-freeze", "broker-restart",
            "broker-data-loss-strict", "broker-data-loss-ordered", "burst-10x", "checkpoint-stall"} <= names  # fmt: skip
    for name in names:
        d = load_drill(name)
        assert d.description and d.incidents and d.expect, name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[drill]\nprofile='smoke'\n[[incidents]]\nkind='meteor'\n", "kind must be one of .*pipeline_kill"),
        (
            "[drill]\nprofile='smoke'\n[[incidents]]\nkind='broker_pause'\nforever=1\n",
            "has no parameter 'forever'",
        ),
        ("[drill]\nprofile='smoke'\n[expect]\nhappy=true\n", "unknown expectation 'happy'"),
        ("[drill]\n[expect]\nrows_lost=0\n", "needs a profile"),
        (
            "[drill]\nprofile='smoke'\nbroker='postgres'\n",
            "broker must be one of kafka, kafka-3, got 'postgres'",
        ),
        ("[drill]\nprofile='smoke'\nbroker='durable'\n", "'durable'; Apache Kafka .* keeps its data on disk"),
        ("[drill]\nprofile='smoke'\n[[incidents]]\nkind='load'\nat_s=1\n", "exactly one of factor"),
    ],
)
def test_a_bad_drill_file_is_refused_naming_the_problem(text: str, message: str):
    with pytest.raises(HarnessError, match=message):
        drill(text)


def test_incidents_that_outlast_the_steady_phase_are_refused_before_anything_starts(tmp_path: Path):
    too_long = drill(
        "[drill]\nprofile='smoke'\nrun={steady_s=10}\n[[incidents]]\nkind='broker_pause'\nat_s=5\nduration_s=8\n"
    )
    with pytest.raises(HarnessError, match=r"steady phase \(10 s\) must outlast the incidents \(13 s\)"):
        run_drill(too_long, tmp_path / "run", None)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
