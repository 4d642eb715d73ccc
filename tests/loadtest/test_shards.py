"""A long run verified a few sensors at a time gets the verdict the whole run verified at once gets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.correctness.policies import Policy
from loadtest.correctness.stops import JobExit
from loadtest.correctness.verify import verify_run
from loadtest.reports.results import Correctness
from tests.loadtest.builders import Output, SessionSpec, ledger_rows, write_run

CLEAN = [(s, "none") for s in range(7)]
#: A job the harness stopped at the end of the run.
KEPT_RUNNING = JobExit(on_its_own=False, code=0)

# Four sensors, one with two sessions, and what went wrong in each.
LOST = SessionSpec("lost", "0001")  # the pipeline lost a row
CALM = SessionSpec("calm", "0001", partition=1)  # all well, beside it
REPEATED = SessionSpec("repeated", "0002")  # the pipeline wrote a row twice
UNSENT = SessionSpec("unsent", "0003")  # the producer never delivered seq 3
FAULTS = SessionSpec("faults", "0004")  # a malformed copy of seq 2 and a duplicate of seq 4
GHOST = SessionSpec("ghost", "0099")  # a session and a topic the ledger never had
LAYOUTS = {"one simulator": {"": [LOST, CALM, REPEATED, UNSENT, FAULTS]}}
LAYOUTS["locust parts"] = {"parts/a": [LOST, CALM, REPEATED], "parts/b": [UNSENT, FAULTS]}


def ledger_of(spec: SessionSpec) -> list[dict]:
    if spec is UNSENT:
        return ledger_rows(spec, [(s, "none") for s in (0, 1, 2, 4, 5, 6)], unsent={3: "none"})
    if spec is FAULTS:
        arrivals = [(0, "none"), (1, "none"), (2, "malformed"), (3, "none"), (4, "none"), (4, "duplicate")]
        return ledger_rows(spec, [*arrivals, (5, "none"), (6, "none")])
    return ledger_rows(spec, CLEAN)


def write_output(root: Path) -> Path:
    out = Output().apply(LOST, 0, 1, 2, 4, 5).session(LOST, "ok")
    out.apply(CALM, *range(6)).session(CALM, "ok")
    out.apply(REPEATED, *range(6), 2).session(REPEATED, "ok")
    out.apply(UNSENT, 0, 1, 2, 4, 5).session(UNSENT, "degraded", applied=[0, 1, 2, 4, 5], degraded_from=3)
    out.violation(UNSENT, "gap", got=4, missing=(3, 3))
    out.apply(FAULTS, 0, 1, 3, 4, 5).session(FAULTS, "degraded", applied=[0, 1, 3, 4, 5], degraded_from=2)
    out.violation(FAULTS, "gap", got=3, missing=(2, 2)).violation(FAULTS, "duplicate", got=4)
    out.dead_letter(FAULTS, offset=2)
    # Rows under sensors the ledger does not have: a session of its own, and a false report about a known
    # session filed under no sensor at all.
    out.apply(GHOST, 0).dead_letter(GHOST, offset=0, reported=False)
    out.violation(LOST, "duplicate", got=5)
    out.integrity[-1]["sensor"] = "__HIVE_DEFAULT_PARTITION__"
    return out.write(root)


def write(tmp_path: Path, layout: str) -> tuple[Path, Path]:
    run = tmp_path / "run"
    for part, specs in LAYOUTS[layout].items():
        write_run(run / part, [row for s in specs for row in ledger_of(s)], specs)
    return run, write_output(tmp_path / "out")


def in_any_order(c: Correctness) -> Correctness:
    """The verdict with its discrepancies and damage windows sorted: shards list them shard after shard."""
    return replace(
        c,
        discrepancies=sorted(c.discrepancies, key=lambda d: (d.kind, d.session, d.seq or -1, d.detail)),
        damage=sorted(c.damage, key=lambda w: w.session),
    )


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("policy", ["ordered", "strict"])
def test_sensors_verified_one_at_a_time_get_the_verdict_of_the_whole_run(
    tmp_path: Path, layout: str, policy: str
) -> None:
    run, out = write(tmp_path, layout)
    whole = verify_run(run, out, Policy(policy), job_exit=KEPT_RUNNING)
    heard: list[str] = []
    sharded = verify_run(run, out, Policy(policy), job_exit=KEPT_RUNNING, progress=heard.append, shard_rows=1)
    assert [h for h in heard if "(shard" in h] == [
        f"verifying sensor {i} of 4 (shard {i} of 4)" for i in range(1, 5)
    ]
    assert in_any_order(sharded) == in_any_order(whole)


def test_each_shard_finds_its_own_sensors_faults_and_the_rows_of_no_sensor_are_found_once(
    tmp_path: Path,
) -> None:
    run, out = write(tmp_path, "one simulator")
    result = verify_run(run, out, Policy("ordered"), shard_rows=1)
    assert not result.passed
    assert result.discrepancy_counts == {
        "lost_row": 1,  # LOST's seq 3
        "changes_table_mismatch": 1,  # LOST's table without it
        "repeated_row": 1,  # REPEATED's seq 2
        "not_delivered": 1,  # UNSENT's seq 3
        "false_violation": 1,  # the duplicate filed under no sensor against LOST
        "wrong_sensor": 1,  # ... which is filed under no sensor
        "unexpected_row": 1,  # GHOST's snapshot
        "false_dead_letter": 1,  # GHOST's dead letter
    }
    assert (result.rows_lost, result.rows_repeated, result.rows_unexpected) == (1, 1, 3)
    assert result.statuses == {"ok": 3, "degraded": 2}
    assert result.blame["producer"] == 1
    scores = {
        f.kind: (f.injected, f.expected, f.detected, f.true_positives, f.precision) for f in result.faults
    }
    assert scores["duplicate"] == (1, 1, 2, 1, 0.5)
    assert scores["malformed"] == (1, 1, 2, 1, 0.5)


def test_a_stop_in_one_shard_relaxes_the_sessions_of_the_shards_before_it(tmp_path: Path) -> None:
    run, out = write(tmp_path, "one simulator")
    heard: list[str] = []
    result = verify_run(
        run, out, Policy("strict"), job_exit=KEPT_RUNNING, progress=heard.append, shard_rows=1
    )
    # UNSENT (sensor 3) and FAULTS (sensor 4) must stop the query; sensors 1 and 2 learn it afterwards.
    assert [h for h in heard if "again" in h] == [
        "verifying sensor 1 again: a session elsewhere must stop the query",
        "verifying sensor 2 again: a session elsewhere must stop the query",
    ]
    assert result.must_stop and result.discrepancy_counts["did_not_stop"] == 1


def test_a_run_over_the_shard_size_is_verified_a_shard_of_sensors_at_a_time(tmp_path: Path) -> None:
    run, out = write(tmp_path, "one simulator")
    heard: list[str] = []
    verify_run(run, out, Policy("ordered"), progress=heard.append, shard_rows=16)
    # Sensor 0001 has two sessions (14 ledger rows), 0002 and 0003 seven each, 0004 eight.
    assert heard == [
        "verifying sensor 1 of 4 (shard 1 of 3)",
        "verifying sensors 2-3 of 4 (shard 2 of 3)",
        "verifying sensor 4 of 4 (shard 3 of 3)",
        "verifying the output of sensors the ledger does not have",
    ]


def test_a_run_within_the_shard_size_is_verified_whole(tmp_path: Path) -> None:
    run, out = write(tmp_path, "one simulator")
    heard: list[str] = []
    verify_run(run, out, Policy("ordered"), progress=heard.append, shard_rows=36)
    assert heard == []


def test_a_row_filed_under_another_sensor_is_named_alike_whole_and_sharded(tmp_path: Path) -> None:
    # One of CALM's change rows (sensor 0001) written under sensor 0002: a reader of sensor 0001 misses it,
    # a reader of 0002 finds a session it does not have. Both ways it is the same misfiled row of CALM.
    run = tmp_path / "run"
    write_run(run, [row for s in (CALM, REPEATED) for row in ledger_of(s)], [CALM, REPEATED])
    out = (
        Output().apply(CALM, *range(6)).session(CALM, "ok").apply(REPEATED, *range(6)).session(REPEATED, "ok")
    )
    out.changes[4]["sensor"] = REPEATED.sensor
    root = out.write(tmp_path / "out")
    whole = verify_run(run, root, Policy("ordered"))
    sharded = verify_run(run, root, Policy("ordered"), shard_rows=1)
    assert whole.discrepancy_counts == {"wrong_sensor": 1}, whole.reasons
    assert in_any_order(sharded) == in_any_order(whole)
    (found,) = whole.discrepancies
    assert found.session == CALM.session and "under sensor 0002" in found.detail


def test_after_a_strict_stop_elsewhere_a_shard_requires_only_what_the_job_read(tmp_path: Path) -> None:
    # s1 sent seq 5 broken, then was abandoned; the job stopped on s2's gap (another sensor) before reading it.
    s1, s2 = SessionSpec("s1", "0001"), SessionSpec("s2", "0002")
    ledger = ledger_rows(s1, [(s, "none") for s in range(5)] + [(5, "malformed")], unsent={6: "abandoned"})
    ledger += ledger_rows(
        s2, [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none")], unsent={3: "gap"}
    )
    run = tmp_path / "run"
    write_run(run, ledger, [s1, s2])
    out = Output().apply(s1, 0, 1, 2).apply(s2, 0, 1, 2).violation(s2, "gap", got=4, missing=(3, 3))
    root = out.write(tmp_path / "out")
    stopped = JobExit(True, 3, "IntegrityViolation: gap")
    whole = verify_run(run, root, Policy("strict"), job_exit=stopped)
    sharded = verify_run(run, root, Policy("strict"), job_exit=stopped, shard_rows=1)
    assert whole.passed, whole.discrepancies
    assert in_any_order(sharded) == in_any_order(whole)
