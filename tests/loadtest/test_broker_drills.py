"""The broker drills in short form, on a real Apache Kafka node or three-node cluster, pipeline and simulator.

Each test is a shipped broker drill (``sotw drill --list``) on the ``smoke`` profile with wider bounds for a busy
2-core machine; the shipped drills' own bounds are checked by running them (docs/gamedays.md). A three-node
cluster takes longer to start and to settle than one node, and each drill here takes minutes on a loaded machine,
so they are marked slow (`make test-slow` and the nightly job run them).
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from loadtest.cli import run_drill
from loadtest.gameday.drills import drill_from_mapping, scorecard_text
from loadtest.reports.results import IncidentResult, Results


def run(tmp_path: Path, text: str) -> Results:
    """Run the drill ``text`` and print its scorecard and the incidents' notes (shown when a test fails)."""
    results = run_drill(drill_from_mapping("test", tomllib.loads(text)), tmp_path / "run", None)
    assert results.drill is not None
    print(scorecard_text(results.drill))
    for i in results.incidents:
        print(f"{i.label}: {i.notes} figures={i.figures} error={i.error}")
    return results


def only_incident(results: Results) -> IncidentResult:
    (incident,) = results.incidents
    assert incident.error is None
    return incident


@pytest.mark.slow
def test_a_killed_node_of_three_hands_its_partitions_over_and_rejoins_with_nothing_lost(tmp_path: Path):
    results = run(
        tmp_path,
        """
[drill]
description = "broker-node-kill, short"
profile = "smoke"
broker = "kafka-3"
# Longer than the outage (the controller fences the dead node after its 9 s session): no session times out.
pipeline = { session_timeout = "30s" }
run = { warmup_s = 3, steady_s = 45, max_lag_s = 600, drain_max_s = 300 }
[[incidents]]
kind = "broker_node_kill"
at_s = 5
restart_after_s = 15
[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
leaders_moved_s = 30
rejoined_s = 60
replicated_s = 120
""",
    )
    assert results.drill is not None and results.drill.passed
    kill = only_incident(results)
    assert kill.figures["led"] >= 1  # the busiest node led some of the run's partitions
    assert "killed (SIGKILL" in kill.notes[0] and "started again" in kill.notes[-1]


@pytest.mark.slow
def test_a_rolling_restart_moves_leadership_off_each_node_in_turn_with_nothing_lost(tmp_path: Path):
    results = run(
        tmp_path,
        """
[drill]
description = "rolling-restart, short: two of the three nodes"
profile = "smoke"
broker = "kafka-3"
pipeline = { session_timeout = "30s" }
run = { warmup_s = 3, steady_s = 60, max_lag_s = 600, drain_max_s = 300 }
[[incidents]]
kind = "broker_node_restart"
name = "node 1"
node = 1
at_s = 5
downtime_s = 2
[[incidents]]
kind = "broker_node_restart"
name = "node 2"
node = 2
at_s = 30
downtime_s = 2
[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
rejoined_s = 60
replicated_s = 120
""",
    )
    assert results.drill is not None and results.drill.passed
    assert [i.figures["node"] for i in results.incidents] == [1.0, 2.0]
    assert all(i.error is None and "stopped gracefully" in i.notes[0] for i in results.incidents)


UNCLEAN = """
[drill]
description = "unclean-election, short"
profile = "smoke"
broker = "kafka-3"
broker_settings = {{ "default.replication.factor" = 2, "min.insync.replicas" = 1, "unclean.leader.election.enable" = true }}
simulator = {{ faults = {{}} }}
pipeline = {{ policy = "{policy}", fail_on_data_loss = {fail}, session_timeout = "60s" }}
run = {{ warmup_s = 3, steady_s = 50, max_lag_s = 600, drain_max_s = 300 }}
[[incidents]]
kind = "unclean_election"
at_s = 5
lag_s = 15
restart_after_s = 10
[expect]
broker_lost = true
blame_pipeline = 0
"""


@pytest.mark.slow
def test_an_unclean_election_under_strict_stops_naming_the_partition_and_triage_blames_the_broker(
    tmp_path: Path,
):
    results = run(tmp_path, UNCLEAN.format(policy="strict", fail="true"))
    assert results.drill is not None and results.drill.passed
    election = only_incident(results)
    assert election.figures["at_risk"] >= 1 and math.isfinite(election.figures["elected_s"])
    # Its reader reports the loss, or its policy stops at the first message whose predecessors are gone.
    assert results.pipeline_stop is not None
    assert re.search(r"(Kafka data lost|integrity violation).*partition \d+ offsets? ", results.pipeline_stop)
    assert results.correctness is not None and results.correctness.blame.get("pipeline", 0) == 0


@pytest.mark.slow
def test_an_unclean_election_under_ordered_goes_on_and_the_ledger_shows_what_the_broker_gave_away(
    tmp_path: Path,
):
    results = run(tmp_path, UNCLEAN.format(policy="ordered", fail="false"))
    assert results.drill is not None and results.drill.passed
    assert results.pipeline_stop is None
    assert results.correctness is not None
    given_away = [d for d in results.correctness.discrepancies if d.kind == "broker_lost"]
    assert given_away and all(d.triage is not None and d.triage.layer == "broker" for d in given_away)


@pytest.mark.slow
def test_a_frozen_broker_is_ridden_out_with_nothing_lost_or_repeated(tmp_path: Path):
    results = run(
        tmp_path,
        """
[drill]
description = "broker-freeze, short"
profile = "smoke"
pipeline = { session_timeout = "30s" }
run = { warmup_s = 3, steady_s = 25, max_lag_s = 600, drain_max_s = 300 }
[[incidents]]
kind = "broker_pause"
at_s = 5
duration_s = 5
[expect]
stopped = false
rows_lost = 0
rows_repeated = 0
correct = true
recover_s = 60
""",
    )
    assert results.drill is not None and results.drill.passed
    assert only_incident(results).notes == ["broker frozen (SIGSTOP)", "broker thawed (SIGCONT)"]


@pytest.mark.slow  # 40 s to 3.5 min, by the machine's load: the suite has the strict form (test_drills.py)
def test_broker_data_loss_under_ordered_is_recorded_and_blamed_on_the_broker_not_the_pipeline(tmp_path: Path):
    results = run(
        tmp_path,
        """
[drill]
description = "broker-data-loss-ordered, short"
profile = "smoke"
pipeline = { policy = "ordered", fail_on_data_loss = false, session_timeout = "30s" }
run = { warmup_s = 3, steady_s = 20, max_lag_s = 600, drain_max_s = 120 }
[[incidents]]
kind = "broker_data_loss"
at_s = 5
downtime_s = 1
[expect]
stopped = false
data_loss_recorded = true
blame_pipeline = 0
""",
    )
    assert results.drill is not None and results.drill.passed
    assert results.pipeline_stop is None and results.data_loss_reports > 0
