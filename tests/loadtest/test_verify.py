"""The verifier against hand-built ledgers, truth and pipeline outputs, for each integrity policy."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from loadtest.correctness.expect import build_expectation, read_ledger, read_truth
from loadtest.correctness.latency import end_to_end
from loadtest.correctness.output import read_output
from loadtest.correctness.policies import Policy
from loadtest.correctness.stops import JobExit, last_error
from loadtest.correctness.values import read_snapshots
from loadtest.correctness.verify import verify
from loadtest.reports.results import Correctness
from tests.loadtest.builders import T0, Output, SessionSpec, ledger_rows, write_run

CLEAN = [(s, "none") for s in range(7)]


def check(
    tmp_path: Path,
    policy: Policy,
    ledger: list,
    specs: list[SessionSpec],
    out: Output,
    stopped: bool | None = None,
) -> Correctness:
    run = tmp_path / "run"
    write_run(run, ledger, specs)
    exp = build_expectation(policy, read_ledger(run), read_truth(run), read_snapshots(run))
    job_exit = (
        None if stopped is None else JobExit(stopped, 3 if stopped else 0, "stopped" if stopped else "")
    )
    return verify(exp, read_output(out.write(tmp_path / "out")), job_exit=job_exit)


def kinds(result: Correctness) -> set[str]:
    return set(result.discrepancy_counts)


def pipelines(result: Correctness) -> list[tuple[str, int | None]]:
    """The discrepancies but ``broker_lost`` (what the broker gave away is not the output's fault)."""
    return [(d.kind, d.seq) for d in result.discrepancies if d.kind != "broker_lost"]


def broker_lost(result: Correctness) -> list[int | None]:
    """The seqs reported as acknowledged and then given away by the broker, each blamed on the broker."""
    lost = [d for d in result.discrepancies if d.kind == "broker_lost"]
    assert all(d.triage is not None and d.triage.layer == "broker" for d in lost)
    return sorted(d.seq for d in lost)


def clean_output(spec: SessionSpec) -> Output:
    return Output().apply(spec, *range(6)).session(spec, "ok")


# ------------------------------------------------------------------------------------------------ strict


def test_strict_clean_run_with_the_true_tables_passes(tmp_path: Path) -> None:
    spec = SessionSpec()
    result = check(tmp_path, Policy("strict"), ledger_rows(spec, CLEAN), [spec], clean_output(spec))
    assert result.passed, result.discrepancies
    assert result.exact_match_rate == 1.0
    assert (result.rows_lost, result.rows_repeated) == (0, 0)


def test_strict_lost_row_fails_as_lost(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = Output().apply(spec, 0, 1, 2, 4, 5).session(spec, "ok")
    result = check(tmp_path, Policy("strict"), ledger_rows(spec, CLEAN), [spec], out)
    assert not result.passed
    assert result.rows_lost == 1
    lost = [d for d in result.discrepancies if d.kind == "lost_row"]
    assert [d.seq for d in lost] == [3]
    assert "changes_table_mismatch" in kinds(result)


def test_strict_repeated_row_fails_as_repeated(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = clean_output(spec).apply(spec, 2)
    result = check(tmp_path, Policy("strict"), ledger_rows(spec, CLEAN), [spec], out)
    assert kinds(result) == {"repeated_row"}
    assert result.rows_repeated == 1


def test_strict_wrong_status_fails(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = Output().apply(spec, *range(6)).session(spec, "degraded")
    result = check(tmp_path, Policy("strict"), ledger_rows(spec, CLEAN), [spec], out)
    assert kinds(result) == {"wrong_status"}


GAP_AT_3 = [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none")]


def test_strict_gap_that_stopped_the_query_passes(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP_AT_3, unsent={3: "gap"})
    # The batch before the gap, then the query stopped, naming the gap in its integrity output.
    out = Output().apply(spec, 0, 1, 2).violation(spec, "gap", got=4, missing=(3, 3))
    result = check(tmp_path, Policy("strict"), ledger, [spec], out, stopped=True)
    assert result.passed, result.discrepancies
    assert result.must_stop and result.policy_stop == "gap in session s1 at seq 4"


def test_strict_job_that_died_of_its_own_error_where_its_policy_should_stop_fails_naming_the_exit(
    tmp_path: Path,
) -> None:
    # The same output, but the job's integrity output names no violation: it died of something else (an
    # out-of-memory kill, its own bug) at the moment the policy should have stopped it.
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP_AT_3, unsent={3: "gap"})
    out = Output().apply(spec, 0, 1, 2)
    run = tmp_path / "run"
    write_run(run, ledger, [spec])
    exp = build_expectation(Policy("strict"), read_ledger(run), read_truth(run), read_snapshots(run))
    died = JobExit(True, 137, "java.lang.OutOfMemoryError: Java heap space")
    result = verify(exp, read_output(out.write(tmp_path / "out")), job_exit=died)
    assert not result.passed and kinds(result) == {"no_policy_stop"}
    (found,) = result.discrepancies
    assert "exited with code 137: java.lang.OutOfMemoryError" in found.detail
    assert found.triage is not None and found.triage.layer == "pipeline"


def test_strict_job_that_crashed_before_any_fault_reached_it_fails(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP_AT_3, unsent={3: "gap"})
    result = check(tmp_path, Policy("strict"), ledger, [spec], Output(), stopped=True)
    assert not result.passed and "no_policy_stop" in kinds(result)


def test_strict_stop_naming_a_violation_that_did_not_happen_fails(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP_AT_3, unsent={3: "gap"})
    out = Output().apply(spec, 0, 1).violation(spec, "gap", got=3, missing=(2, 2))
    result = check(tmp_path, Policy("strict"), ledger, [spec], out, stopped=True)
    assert {"false_violation", "no_policy_stop"} <= kinds(result)


def test_a_job_s_last_error_is_the_last_line_of_its_log_that_reads_as_one(tmp_path: Path) -> None:
    log = tmp_path / "pipeline.log"
    log.write_text("batch 1\nTraceback (most recent call last):\n  x\nValueError: boom\nshutting down\n")
    assert last_error(log) == "ValueError: boom"
    assert last_error(tmp_path / "none.log") == ""


def test_a_session_the_strict_stop_cut_short_is_not_judged_against_its_whole_table(tmp_path: Path) -> None:
    # Sensor 1's gap stops the query; by then sensor 2's clean session had only its first three seqs applied
    # and no session record: a prefix of its changes is all a stopped pipeline can have written.
    gapped = SessionSpec()
    cut = SessionSpec(session="s2", sensor="0002")
    ledger = ledger_rows(
        gapped,
        [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none")],
        unsent={3: "gap"},
    ) + ledger_rows(cut, CLEAN)
    out = Output().apply(gapped, 0, 1, 2).apply(cut, 0, 1, 2).violation(gapped, "gap", got=4, missing=(3, 3))
    result = check(tmp_path, Policy("strict"), ledger, [gapped, cut], out, stopped=True)
    assert result.passed, result.discrepancies
    assert "changes_table_mismatch" not in kinds(result)


def test_a_broker_that_lost_its_data_numbers_later_copies_from_zero_and_they_still_come_after(
    tmp_path: Path,
) -> None:
    # Seqs 0-3 were read at offsets 40-43; the broker lost its data and numbered seqs 4-6 from 0 again.
    spec = SessionSpec()
    ledger = ledger_rows(spec, CLEAN, first_offset=40)
    for row in ledger:
        if row["seq"] >= 4:
            row["offset"] -= 44
            row["acked_ts"] += 60_000
    result = check(tmp_path, Policy("strict"), ledger, [spec], clean_output(spec))
    assert pipelines(result) == []
    # The pipeline had read seqs 0-3 before, but the broker no longer has them: the ledger says so.
    assert broker_lost(result) == [0, 1, 2, 3]


def test_an_unclean_election_loses_what_was_acknowledged_at_or_above_where_the_new_leader_numbers_on(
    tmp_path: Path,
) -> None:
    # Seqs 0-4 acknowledged at offsets 40-44; the new leader's log ended at 42, so seqs 5-6 became 42-43.
    spec = SessionSpec()
    ledger = _reset_after(ledger_rows(spec, CLEAN, first_offset=40), 5, 3)
    result = check(tmp_path, Policy("ordered"), ledger, [spec], clean_output(spec))
    assert pipelines(result) == []
    assert broker_lost(result) == [2, 3, 4]
    assert "offsets later started again at 42" in result.discrepancies[0].detail


def test_records_the_new_leader_numbered_over_offsets_a_reader_had_passed_are_lost_by_the_broker(
    tmp_path: Path,
) -> None:
    # The pipeline had read to offset 44 when the new leader, its log ending at 42, numbered seqs 5-6 at 42-43:
    # a reader past them never sees them. Triage blames the broker, not the pipeline that did not read them.
    spec = SessionSpec()
    ledger = _reset_after(ledger_rows(spec, CLEAN, first_offset=40), 5, 3)
    read_to_44 = Output().apply(spec, 0, 1, 2, 3, 4).session(spec, "ok")
    result = check(tmp_path, Policy("ordered"), ledger, [spec], read_to_44)
    lost = {d.seq: d.triage for d in result.discrepancies if d.kind == "lost_row"}
    assert sorted(lost) == [5]  # seq 6 is the session's end; the ordered policy's change rows stop at 5
    assert all(t is not None and t.layer == "broker" for t in lost.values())
    assert result.blame.get("pipeline", 0) == 0, result.discrepancies


def _reset_after(ledger: list, seq: int, drop: int) -> list:
    """The broker lost its data before ``seq``: from it on, offsets are ``drop`` lower and acknowledged later."""
    for row in ledger:
        if row["seq"] >= seq:
            row["offset"] -= drop
            row["acked_ts"] += 60_000
    return ledger


def test_a_pipeline_that_stopped_on_the_brokers_data_loss_need_not_have_read_what_came_after(
    tmp_path: Path,
) -> None:
    # Seqs 0-3 at offsets 40-43 were read; the broker lost its data and numbered seqs 4-6 from 0 again. A
    # pipeline that stops on data loss (failOnDataLoss) stops before it reads on: no more rows, no record.
    spec = SessionSpec()
    ledger = _reset_after(ledger_rows(spec, CLEAN, first_offset=40), 4, 44)
    read_before_the_loss = Output().apply(spec, 0, 1, 2, 3)
    result = check(tmp_path, Policy("strict"), ledger, [spec], read_before_the_loss, stopped=True)
    assert pipelines(result) == [] and broker_lost(result) == [0, 1, 2, 3]
    # Without the stop, everything the broker acknowledged after its return was the pipeline's to write.
    kept_on = check(tmp_path / "again", Policy("strict"), ledger, [spec], read_before_the_loss, stopped=False)
    assert kept_on.rows_lost == 2 and "missing_session" in kinds(kept_on)


def test_a_stop_on_data_loss_still_requires_what_was_acknowledged_before_it(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = _reset_after(ledger_rows(spec, CLEAN, first_offset=40), 4, 44)
    lost_seq_2 = Output().apply(spec, 0, 1, 3)
    result = check(tmp_path, Policy("strict"), ledger, [spec], lost_seq_2, stopped=True)
    assert pipelines(result) == [("lost_row", 2)]
    assert broker_lost(result) == [0, 1, 3]  # seq 2 is counted once, as lost


def test_a_session_that_began_after_the_loss_in_the_same_partition_counts_as_after_it(tmp_path: Path) -> None:
    # The partition's offsets went from 46 back to 0 between the two sessions: the second session's own
    # copies never go down, but they were all acknowledged after the loss.
    before, after = SessionSpec("s1"), SessionSpec("s2")
    ledger = ledger_rows(before, CLEAN, first_offset=40) + _reset_after(ledger_rows(after, CLEAN), 0, 0)
    result = check(tmp_path, Policy("strict"), ledger, [before, after], clean_output(before), stopped=True)
    assert pipelines(result) == []


def test_strict_missed_gap_fails_for_applying_past_it_and_not_stopping(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(
        spec,
        [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none")],
        unsent={3: "gap"},
    )
    out = Output().apply(spec, 0, 1, 2, 4, 5).session(spec, "ok", applied=[0, 1, 2, 4, 5])
    result = check(tmp_path, Policy("strict"), ledger, [spec], out, stopped=False)
    assert {"wrong_status", "unexpected_row", "did_not_stop"} <= kinds(result)
    assert result.rows_unexpected == 2


# ------------------------------------------------------------------------------------------------ ordered

GAP3 = [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none")]


def ordered_gap_output(spec: SessionSpec) -> Output:
    return (
        Output()
        .apply(spec, 0, 1, 2, 4, 5)
        .session(spec, "degraded", applied=[0, 1, 2, 4, 5], degraded_from=3)
        .violation(spec, "gap", got=4, missing=(3, 3))
    )


def test_ordered_gap_reported_and_degraded_passes_with_its_damage_window(tmp_path: Path) -> None:
    spec = SessionSpec()
    result = check(
        tmp_path,
        Policy("ordered"),
        ledger_rows(spec, GAP3, unsent={3: "gap"}),
        [spec],
        ordered_gap_output(spec),
    )
    assert result.passed, result.discrepancies
    assert [(d.degraded_from, d.updates_affected) for d in result.damage] == [(3, 3)]
    gap = next(f for f in result.faults if f.kind == "gap")
    assert (gap.precision, gap.recall, gap.injected) == (1.0, 1.0, 1)
    assert result.sessions_exact_required == 0


def test_ordered_missed_gap_fails_with_recall_below_one(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = ordered_gap_output(spec)
    out.integrity.clear()
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, GAP3, unsent={3: "gap"}), [spec], out)
    assert kinds(result) == {"missed_violation"}
    assert next(f for f in result.faults if f.kind == "gap").recall == 0.0


def test_ordered_gap_called_ok_fails_as_wrong_status(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = ordered_gap_output(spec)
    out.sessions[0]["status"] = "ok"
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, GAP3, unsent={3: "gap"}), [spec], out)
    assert kinds(result) == {"wrong_status"}


def test_ordered_lost_and_repeated_rows_fail(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = ordered_gap_output(spec)
    out.changes = [c for c in out.changes if c["seq"] != 4]
    out.apply(spec, 2)
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, GAP3, unsent={3: "gap"}), [spec], out)
    # The degraded session's record still names the table with seq 4, which its change rows no longer build.
    assert kinds(result) == {"lost_row", "repeated_row", "wrong_digest", "wrong_row_count"}
    assert (result.rows_lost, result.rows_repeated) == (1, 1)


def test_ordered_drops_a_duplicate_and_a_late_message_and_reports_both(tmp_path: Path) -> None:
    spec = SessionSpec()
    arrivals = [
        (0, "none"),
        (1, "none"),
        (3, "none"),
        (2, "delayed"),
        (4, "none"),
        (1, "duplicate"),
        (5, "none"),
        (6, "none"),
    ]
    out = (
        Output()
        .apply(spec, 0, 1, 3, 4, 5)
        .session(spec, "degraded", applied=[0, 1, 3, 4, 5], degraded_from=2)
        .violation(spec, "gap", got=3, missing=(2, 2))
        .violation(spec, "reorder", got=2)
        .violation(spec, "duplicate", got=1)
    )
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, arrivals), [spec], out)
    assert result.passed, result.discrepancies
    scores = {f.kind: (f.fault, f.recall) for f in result.faults}
    assert scores == {
        "gap": ("gap", 1.0),
        "reorder": ("delayed", 1.0),
        "duplicate": ("duplicate", 1.0),
        "digest_mismatch": ("-", 1.0),  # degraded: its table is not the one its end said
    }


# ------------------------------------------------------------------------------------------------ once

ONCE_ARRIVALS = [
    (0, "none"),
    (1, "none"),
    (3, "none"),
    (4, "none"),
    (2, "delayed"),
    (1, "duplicate"),
    (5, "none"),
    (6, "none"),
]


def once_output(spec: SessionSpec) -> Output:
    return Output().apply(spec, 0, 1, 3, 4, 2, 5).session(spec, "ok").violation(spec, "duplicate", got=1)


def test_once_out_of_order_with_a_duplicate_rebuilds_the_true_table_and_passes(tmp_path: Path) -> None:
    spec = SessionSpec()
    result = check(tmp_path, Policy("once"), ledger_rows(spec, ONCE_ARRIVALS), [spec], once_output(spec))
    assert result.passed, result.discrepancies
    assert result.exact_match_rate == 1.0


def test_once_applying_the_duplicate_fails_as_repeated(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = once_output(spec).apply(spec, 1)
    result = check(tmp_path, Policy("once"), ledger_rows(spec, ONCE_ARRIVALS), [spec], out)
    assert kinds(result) == {"repeated_row"}


def test_once_missing_duplicate_report_and_lost_row_fail(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = once_output(spec)
    out.integrity.clear()
    out.changes = [c for c in out.changes if c["seq"] != 5]
    result = check(tmp_path, Policy("once"), ledger_rows(spec, ONCE_ARRIVALS), [spec], out)
    assert {"missed_violation", "lost_row", "changes_table_mismatch"} <= kinds(result)


def test_once_session_with_a_missing_seq_must_fail_and_report_the_gap(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP3, unsent={3: "gap"})
    good = (
        Output()
        .apply(spec, 0, 1, 2, 4, 5)
        .session(spec, "failed", applied=[0, 1, 2, 4, 5])
        .violation(spec, "gap", missing=(3, 3))
    )
    assert check(tmp_path / "a", Policy("once"), ledger, [spec], good).passed
    wrong = Output().apply(spec, 0, 1, 2, 4, 5).session(spec, "ok", applied=[0, 1, 2, 4, 5])
    result = check(tmp_path / "b", Policy("once"), ledger, [spec], wrong)
    assert kinds(result) == {"wrong_status", "missed_violation"}


# ------------------------------------------------------------------------------------------------ window

WINDOW_ARRIVALS = [(0, "none"), (1, "none"), (3, "none"), (2, "delayed"), (5, "none"), (6, "none")]


def window_output(spec: SessionSpec) -> Output:
    return (
        Output()
        .apply(spec, 0, 1, 2, 3, 5)
        .session(spec, "degraded", applied=[0, 1, 2, 3, 5], degraded_from=4)
        .violation(spec, "gap", got=5, missing=(4, 4))
    )


def test_window_reorders_within_the_window_and_reports_the_real_gap(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, WINDOW_ARRIVALS, unsent={4: "gap"})
    result = check(tmp_path, Policy("window", window_messages=2), ledger, [spec], window_output(spec))
    assert result.passed, result.discrepancies


def test_window_missed_gap_wrong_status_and_lost_row_fail(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, WINDOW_ARRIVALS, unsent={4: "gap"})
    out = window_output(spec)
    out.integrity.clear()
    out.sessions[0]["status"] = "ok"
    out.changes = [c for c in out.changes if c["seq"] != 2]
    result = check(tmp_path, Policy("window", window_messages=2), ledger, [spec], out)
    # The record's table is no longer the one the change rows build either.
    assert kinds(result) - {"wrong_digest", "wrong_row_count"} == {
        "missed_violation",
        "wrong_status",
        "lost_row",
    }
    assert "wrong_digest" in kinds(result)


def test_window_of_zero_treats_a_late_message_as_a_gap_like_ordered(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, WINDOW_ARRIVALS, unsent={4: "gap"})
    result = check(tmp_path, Policy("window", window_messages=0), ledger, [spec], window_output(spec))
    assert "missed_violation" in kinds(result)  # seq 2 came after its hole expired: gap + reorder
    assert "lost_row" not in kinds(result) and "unexpected_row" in kinds(result)


# ------------------------------------------------------------------------------------------------ none

NONE_ARRIVALS = [
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (3, "none"),
    (2, "duplicate"),
    (4, "none"),
    (5, "none"),
    (6, "none"),
]


def none_output(spec: SessionSpec) -> Output:
    return Output().apply(spec, 0, 1, 2, 3, 2, 4, 5).session(spec, "ok")


def test_none_applies_a_duplicate_again_and_passes(tmp_path: Path) -> None:
    spec = SessionSpec()
    result = check(tmp_path, Policy("none"), ledger_rows(spec, NONE_ARRIVALS), [spec], none_output(spec))
    assert result.passed, result.discrepancies


def test_none_lost_and_repeated_rows_fail(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = none_output(spec).apply(spec, 1)
    out.changes = [c for c in out.changes if c["seq"] != 3]
    result = check(tmp_path, Policy("none"), ledger_rows(spec, NONE_ARRIVALS), [spec], out)
    assert kinds(result) - {"wrong_digest", "wrong_row_count"} == {"lost_row", "repeated_row"}
    assert "wrong_digest" in kinds(result)


def test_none_requires_no_gap_report_but_a_clean_session_must_be_ok(tmp_path: Path) -> None:
    spec = SessionSpec()
    gap = Output().apply(spec, 0, 1, 2, 4, 5).session(spec, "ok", applied=[0, 1, 2, 4, 5])
    assert check(
        tmp_path / "a", Policy("none"), ledger_rows(spec, GAP3, unsent={3: "gap"}), [spec], gap
    ).passed
    wrong = Output().apply(spec, *range(6)).session(spec, "timed_out", closed_by="timeout")
    result = check(tmp_path / "b", Policy("none"), ledger_rows(spec, CLEAN), [spec], wrong)
    assert kinds(result) == {"wrong_status", "wrong_closed_by"}


# ------------------------------------------------------------------------------------------------ common


@pytest.mark.parametrize("policy", ["strict", "ordered", "once", "none"])
def test_abandoned_session_must_time_out(tmp_path: Path, policy: str) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in range(6)], unsent={6: "abandoned"})
    out = (
        Output()
        .apply(spec, *range(6))
        .session(spec, "timed_out", closed_by="timeout")
        .violation(spec, "timeout")
    )
    result = check(tmp_path / "ok", Policy(policy), ledger, [spec], out)
    assert result.passed, result.discrepancies
    if policy != "none":
        missing = Output().apply(spec, *range(6))
        assert kinds(check(tmp_path / "bad", Policy(policy), ledger, [spec], missing)) == {
            "missing_session",
            "missed_violation",
        }


def test_malformed_message_must_be_quarantined_and_its_seq_is_a_gap(tmp_path: Path) -> None:
    spec = SessionSpec()
    arrivals = [
        (0, "none"),
        (1, "none"),
        (2, "malformed"),
        (3, "none"),
        (4, "none"),
        (5, "none"),
        (6, "none"),
    ]
    ledger = ledger_rows(spec, arrivals)
    good = (
        Output()
        .apply(spec, 0, 1, 3, 4, 5)
        .session(spec, "degraded", applied=[0, 1, 3, 4, 5], degraded_from=2)
        .violation(spec, "gap", got=3, missing=(2, 2))
        .dead_letter(spec, offset=2)
    )
    result = check(tmp_path / "a", Policy("ordered"), ledger, [spec], good)
    assert result.passed, result.discrepancies
    assert (result.malformed_sent, result.malformed_quarantined) == (1, 1)
    unreported = dataclasses.replace(
        good, integrity=[r for r in good.integrity if r["violation"] != "malformed"]
    )
    result = check(tmp_path / "c", Policy("ordered"), ledger, [spec], unreported)
    assert kinds(result) == {"missed_violation"} and "malformed not reported" in str(result.discrepancies)
    good.dead_letters.clear()
    result = check(tmp_path / "b", Policy("ordered"), ledger, [spec], good)
    assert kinds(result) == {"malformed_not_quarantined"}
    assert next(f for f in result.faults if f.kind == "malformed").recall == 0.0


def test_uncommitted_batches_are_not_visible_output(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = clean_output(spec).apply(spec, 3, batch=7)  # batch 7 wrote files but never committed
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, CLEAN), [spec], out)
    assert result.passed, result.discrepancies


def test_two_sessions_only_the_broken_one_is_blamed_and_exact_rate_counts_both(tmp_path: Path) -> None:
    a, b = SessionSpec(), SessionSpec(session="s2", sensor="0002")
    ledger = ledger_rows(a, CLEAN) + ledger_rows(b, CLEAN)
    out = clean_output(a).apply(b, *range(6)).session(b, "ok", applied=[0, 1, 2, 3, 4])
    result = check(tmp_path, Policy("ordered"), ledger, [a, b], out)
    assert kinds(result) == {"table_mismatch"}
    assert result.exact_match_rate == 0.5
    assert {d.session for d in result.discrepancies} == {"s2"}
    assert all(d.triage is not None and d.triage.layer == "pipeline" for d in result.discrepancies)


def test_end_to_end_latency_joins_each_change_to_its_batch_commit(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = Output(batches={0: T0 + 1000, 1: T0 + 2000}).apply(spec, 0, 1, 2).apply(spec, 3, 4, 5, batch=1)
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, CLEAN), [spec])
    lat = end_to_end(read_ledger(run), read_output(out.write(tmp_path / "out"))).sort_values("seq")
    assert list(lat["latency_ms"]) == [1000.0, 900.0, 800.0, 1700.0, 1600.0, 1500.0]
    assert not math.isnan(lat["latency_ms"].max())


def test_window_in_milliseconds_uses_event_time_of_the_messages(tmp_path: Path) -> None:
    spec = SessionSpec()  # message seq s has event time T0 + 100 * s
    ledger = ledger_rows(
        spec,
        [(0, "none"), (1, "none"), (3, "none"), (5, "none"), (2, "delayed"), (6, "none")],
        unsent={4: "gap"},
    )
    in_time = (
        Output()
        .apply(spec, 0, 1, 2, 3, 5)
        .session(spec, "degraded", applied=[0, 1, 2, 3, 5], degraded_from=4)
        .violation(spec, "gap", got=5, missing=(4, 4))
    )
    # 250 ms: when seq 5 (ts 500) comes, seq 3 (ts 300) has waited 200 ms: seq 2 is still in time.
    assert check(tmp_path / "a", Policy("window", window_ms=250), ledger, [spec], in_time).passed
    # 150 ms: seq 5 makes the hole at 2 expire, so seq 2 is late: a gap, a reorder, and not applied.
    late = check(tmp_path / "b", Policy("window", window_ms=150), ledger, [spec], in_time)
    assert kinds(late) == {"missed_violation", "unexpected_row", "wrong_degraded_from"}


def test_once_accepts_either_reading_for_a_message_that_comes_after_end(tmp_path: Path) -> None:
    spec = SessionSpec()
    arrivals = [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (5, "none"), (6, "none"), (3, "delayed")]
    ledger = ledger_rows(spec, arrivals)
    waited = Output().apply(spec, 0, 1, 2, 4, 5, 3).session(spec, "ok").violation(spec, "reorder", got=3)
    assert check(tmp_path / "a", Policy("once"), ledger, [spec], waited).passed
    closed = (
        Output()
        .apply(spec, 0, 1, 2, 4, 5)
        .session(spec, "failed", applied=[0, 1, 2, 4, 5])
        .violation(spec, "gap", missing=(3, 3))
        .violation(spec, "late_after_close", got=3)
    )
    assert check(tmp_path / "b", Policy("once"), ledger, [spec], closed).passed
    wrong = Output().apply(spec, 0, 1, 2, 4, 5).session(spec, "ok", applied=[0, 1, 2, 4, 5])
    assert "wrong_status" in kinds(check(tmp_path / "c", Policy("once"), ledger, [spec], wrong))


def test_a_still_open_sessions_changes_must_still_replay_to_its_table(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in range(6)], unsent={6: "abandoned"})
    wrong = SessionSpec()
    wrong.messages[5]["row"] = {"id": 1, "value": 999, "unit": "C"}  # seq 5 written with a wrong value
    out = Output().apply(spec, *range(5)).apply(wrong, 5)
    result = check(tmp_path, Policy("ordered", timeouts_expire=False), ledger, [spec], out)
    assert "changes_table_mismatch" in kinds(result), result.discrepancies


def test_a_session_without_end_may_be_absent_when_the_timeout_has_not_passed(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in range(6)], unsent={6: "abandoned"})
    out = Output().apply(spec, *range(6))
    assert check(tmp_path, Policy("ordered", timeouts_expire=False), ledger, [spec], out).passed


# ------------------------------------------------------------------------------ values, in every session

# A copy of seq 2 sent again after the session's end: every policy keeps the true table, so any wrong value
# is the pipeline's, in a session a fault did reach.
FAULTED = [*CLEAN, (2, "duplicate")]


def faulted_output(spec: SessionSpec) -> Output:
    return clean_output(spec).violation(spec, "late_after_close", got=2)


@pytest.mark.parametrize("policy", ["strict", "ordered", "once", "window", "none"])
def test_a_wrong_value_in_a_faulted_session_fails_naming_the_row_under_every_policy(
    tmp_path: Path, policy: str
) -> None:
    spec = SessionSpec()
    rules = Policy(policy, window_messages=2 if policy == "window" else None)
    good = check(tmp_path / "good", rules, ledger_rows(spec, FAULTED), [spec], faulted_output(spec))
    assert good.passed, good.discrepancies
    assert good.rows_values_checked == 8  # 3 snapshot rows and 5 updates

    out = faulted_output(spec)
    (row,) = [r for r in out.changes if r["seq"] == 2]
    row["values"] = '{"id":2,"unit":"C","value":21.0}'  # seq 2 set row 2 to 20.0
    result = check(tmp_path / "bad", rules, ledger_rows(spec, FAULTED), [spec], out)
    assert not result.passed and result.rows_wrong == 1
    (wrong,) = [d for d in result.discrepancies if d.kind == "wrong_value"]
    assert (wrong.session, wrong.seq) == ("s1", 2)
    assert "row 2 is" in wrong.detail and "seq 2 was an upsert of row 2" in wrong.detail


def test_a_change_row_on_the_wrong_row_or_with_the_wrong_op_is_wrong(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = clean_output(spec)
    upsert, delete = (next(r for r in out.changes if r["seq"] == seq) for seq in (3, 4))
    upsert["row_id"], upsert["values"] = 5, '{"id":5,"unit":"C","value":40.0}'  # seq 3 inserted row 4
    delete["op"], delete["values"] = "upsert", '{"id":3,"unit":"C","value":3.0}'  # seq 4 deleted row 3
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, CLEAN), [spec], out)
    wrong = sorted((d.seq, d.detail) for d in result.discrepancies if d.kind == "wrong_value")
    assert [seq for seq, _ in wrong] == [3, 4]
    assert "seq 3 was an upsert of row 4" in wrong[0][1] and "seq 4 deleted row 3" in wrong[1][1]


def test_snapshot_rows_must_be_the_rows_the_snapshot_carried(tmp_path: Path) -> None:
    spec = SessionSpec()
    out = clean_output(spec)
    first, second, third = (r for r in out.changes if r["seq"] == 0)
    first["values"] = '{"id":1,"unit":"F","value":1.0}'
    out.changes.remove(third)
    result = check(tmp_path, Policy("ordered"), ledger_rows(spec, CLEAN), [spec], out)
    found = {(d.kind, d.seq) for d in result.discrepancies if d.kind in ("wrong_value", "lost_row")}
    assert found == {("wrong_value", 0), ("lost_row", 0)}
    details = " ".join(d.detail for d in result.discrepancies)
    assert "snapshot row 1 is" in details and "snapshot row 3 (seq 0) has no change row" in details


def test_a_session_closed_by_its_timeout_must_have_been_quiet_for_the_timeout(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in range(6)], unsent={6: "abandoned"})
    for row in ledger:  # acknowledged long before the pipeline ran
        row["acked_ts"] = T0 + 1000 if row["acked_ts"] is not None else None
    rules = Policy("ordered", session_timeout_ms=6000, trigger_ms=1000)

    def closed_after(ms: int) -> Correctness:
        out = (
            Output()
            .apply(spec, *range(6), processed_ms=T0 + 5000)
            .session(spec, "timed_out", closed_by="timeout", processed_ms=T0 + 5000 + ms)
            .violation(spec, "timeout")
        )
        return check(tmp_path / str(ms), rules, ledger, [spec], out)

    assert closed_after(6000).passed
    assert closed_after(5000).passed  # within one trigger
    early = closed_after(1000)
    assert kinds(early) == {"early_timeout"}
    (found,) = early.discrepancies
    assert "1.0 s after its last message" in found.detail and "session timeout is 6 s" in found.detail


# ----------------------------------------------------------------- outputs that once fooled the verifier


def gap_run(tmp_path: Path, policy: str, out: Output) -> Correctness:
    spec = SessionSpec()
    return check(tmp_path, Policy(policy), ledger_rows(spec, GAP3, unsent={3: "gap"}), [spec], out)


def test_the_ordered_gap_output_these_tests_corrupt_passes_as_it_is(tmp_path: Path) -> None:
    assert gap_run(tmp_path, "ordered", ordered_gap_output(SessionSpec())).passed


def test_a_copy_acknowledged_without_an_offset_is_delivered_and_applied_in_its_place(tmp_path: Path) -> None:
    # librdkafka acknowledges an idempotent retry the broker had already written without its offset.
    spec = SessionSpec()
    ledger = ledger_rows(spec, CLEAN)
    ledger[3] |= {"offset": None}
    result = check(tmp_path, Policy("ordered"), ledger, [spec], clean_output(spec))
    assert result.passed, result.discrepancies


@pytest.mark.parametrize("applied", [True, False], ids=["read", "not read"])
def test_a_copy_purged_in_flight_may_or_may_not_have_reached_the_job_and_never_blames_it(
    tmp_path: Path, applied: bool
) -> None:
    # Seq 3's only copy was purged in flight: the broker may have written it. A job that read it and one
    # that met a gap there are both right; the copy is the producer's not-delivered, never the pipeline's.
    spec = SessionSpec()
    ledger = ledger_rows(spec, CLEAN)
    ledger[3] |= {"offset": None, "delivered": False, "acked_ts": None, "error": "Local: Purged in flight"}
    out = clean_output(spec) if applied else ordered_gap_output(spec)
    result = check(tmp_path, Policy("ordered"), ledger, [spec], out)
    assert kinds(result) == {"not_delivered"}, result.discrepancies
    assert result.blame == {"producer": 1}


def test_a_row_written_with_an_op_the_contract_does_not_know_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    update = next(c for c in out.changes if c["seq"] == 1)
    update["op"] = "frobnicate"
    result = gap_run(tmp_path, "ordered", out)
    assert "wrong_value" in kinds(result) and "a frobnicate row for seq 1" in str(result.discrepancies)


def test_an_update_written_to_another_row_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    next(c for c in out.changes if c["seq"] == 1)["row_id"] = 2
    assert "wrong_value" in kinds(gap_run(tmp_path, "ordered", out))


def test_a_change_row_without_a_session_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    out.changes.append({**out.changes[-1], "session": None})
    result = gap_run(tmp_path, "ordered", out)
    assert "unexpected_row" in kinds(result) and result.rows_unexpected == 1


def test_a_session_record_closed_by_nothing_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    out.sessions[0]["closed_by"] = None
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"wrong_closed_by"}


def test_a_degraded_session_s_digest_and_row_count_are_its_own_change_rows_table(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    out.sessions[0] |= {"digest": "0" * 64, "row_count": 99}
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"wrong_digest", "wrong_row_count"}


def test_a_malformed_report_where_no_malformed_copy_was_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec()).violation(SessionSpec(), "malformed")
    out.integrity[-1]["offset"] = 2
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"false_violation"}


def test_a_gap_reported_up_to_2_to_the_31_is_a_false_report_found_at_once(tmp_path: Path) -> None:
    import time

    out = ordered_gap_output(SessionSpec())
    next(r for r in out.integrity if r["violation"] == "gap")["missing_to"] = 2**31 - 2
    began = time.monotonic()
    result = gap_run(tmp_path, "ordered", out)
    assert time.monotonic() - began < 30
    assert "false_violation" in kinds(result) and "3..2147483646" in str(result.discrepancies)


def test_a_violation_the_contract_does_not_name_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec()).violation(SessionSpec(), "cosmic_ray", got=2)
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"false_violation"}


def test_under_once_a_snapshot_row_lost_in_a_session_that_is_not_exact_fails(tmp_path: Path) -> None:
    spec = SessionSpec()
    good = (
        Output()
        .apply(spec, 0, 1, 2, 4, 5)
        .session(spec, "failed", applied=[0, 1, 2, 4, 5])
        .violation(spec, "gap", missing=(3, 3))
    )
    assert gap_run(tmp_path / "good", "once", good).passed
    good.changes = [c for c in good.changes if not (c["seq"] == 0 and c["row_id"] == 3)]
    result = gap_run(tmp_path / "lost", "once", good)
    assert "lost_row" in kinds(result), result.discrepancies


def test_a_change_row_with_another_event_time_than_its_message_fails(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    out.changes[-1]["event_ms"] += 5
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"wrong_value"}


# ------------------------------------------------------------------ strict stops, read adversarially

STOPPED = JobExit(True, 3, "IntegrityViolation: gap")


def test_a_strict_job_that_commits_batches_after_the_one_naming_its_stop_did_not_stop(tmp_path: Path) -> None:
    s1, s2 = SessionSpec("s1", "0001"), SessionSpec("s2", "0002")
    ledger = ledger_rows(s1, GAP_AT_3, unsent={3: "gap"}) + ledger_rows(s2, CLEAN)
    out = Output(batches={0: T0 + 6000, 1: T0 + 16000, 2: T0 + 26000})
    out.apply(s1, 0, 1, 2).violation(s1, "gap", got=4, missing=(3, 3))
    out.apply(s2, 0, 1, 2, batch=1).apply(s2, 3, 4, 5, batch=2).session(s2, "ok", batch=2)
    run = tmp_path / "run"
    write_run(run, ledger, [s1, s2])
    exp = build_expectation(Policy("strict"), read_ledger(run), read_truth(run), read_snapshots(run))
    result = verify(exp, read_output(out.write(tmp_path / "out")), job_exit=STOPPED)
    assert kinds(result) == {"did_not_stop"} and "committed batches up to 2" in str(result.discrepancies)


def test_the_session_a_strict_job_names_its_stop_in_holds_everything_before_the_stop(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(spec, GAP_AT_3, unsent={3: "gap"})
    short = Output().apply(spec, 0, 1).violation(spec, "gap", got=4, missing=(3, 3))
    result = check(tmp_path, Policy("strict"), ledger, [spec], short, stopped=True)
    assert pipelines(result) == [("lost_row", 2)]


def test_a_copy_of_unknown_outcome_does_not_force_a_strict_stop(tmp_path: Path) -> None:
    # Seq 3 timed out, but the broker may have it: a strict job that met no violation and kept running is right.
    spec = SessionSpec()
    ledger = ledger_rows(spec, CLEAN)
    ledger[3] |= {"offset": None, "delivered": False, "acked_ts": None, "error": "Local: Message timed out"}
    result = check(tmp_path, Policy("strict"), ledger, [spec], clean_output(spec), stopped=False)
    assert kinds(result) == {"not_delivered"} and result.blame == {"producer": 1}


def test_after_a_strict_stop_a_malformed_copy_the_job_read_past_in_its_partition_is_still_required(
    tmp_path: Path,
) -> None:
    # s1 and s3 share sensor 0001's partition: the job wrote s3 whole from offsets 4-10, so it read s1's broken
    # seq 3 at offset 3, then stopped on s2's gap. It must have quarantined and reported it.
    s1, s3, s2 = SessionSpec("s1", "0001"), SessionSpec("s3", "0001"), SessionSpec("s2", "0002")
    first = ledger_rows(s1, [(0, "none"), (1, "none"), (2, "none"), (3, "malformed"), (4, "none")])
    for row in first:
        if row["seq"] >= 4:
            row["offset"] += 7
            row["acked_ts"] += 700
    ledger = first + ledger_rows(s3, CLEAN, first_offset=4) + ledger_rows(s2, GAP_AT_3, unsent={3: "gap"})
    out = Output()
    for seq in range(3):
        out.changes += s1.change_rows(seq, offset=seq)
    for seq in range(6):
        out.changes += s3.change_rows(seq, offset=4 + seq)
    out.session(s3, "ok").apply(s2, 0, 1, 2).violation(s2, "gap", got=4, missing=(3, 3))
    result = check(tmp_path, Policy("strict"), ledger, [s1, s2, s3], out, stopped=True)
    assert {"malformed_not_quarantined", "missed_violation"} <= kinds(result)
    # Quarantined and reported, the same output passes.
    fixed = check(
        tmp_path / "fixed",
        Policy("strict"),
        ledger,
        [s1, s2, s3],
        out.dead_letter(s1, offset=3),
        stopped=True,
    )
    assert fixed.passed, fixed.discrepancies


def test_a_strict_stop_on_the_broker_s_data_loss_before_the_violation_came_is_a_stop(tmp_path: Path) -> None:
    # The broker lost its data (offsets start again at 0 from seq 4), and the only violation shows after it:
    # a job that stopped on the loss (failOnDataLoss) never met it.
    spec = SessionSpec()
    ledger = _reset_after(
        ledger_rows(
            spec,
            [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (5, "none"), (6, "none")],
            first_offset=40,
        ),
        5,
        44,
    )
    ledger.append(
        ledger_rows(spec, [(4, "none")])[0]
        | {"sent_ts": None, "offset": None, "delivered": False, "fault": "gap", "acked_ts": None}
    )
    result = check(tmp_path, Policy("strict"), ledger, [spec], Output().apply(spec, 0, 1, 2, 3), stopped=True)
    assert "no_policy_stop" not in kinds(result), result.discrepancies


def test_a_dead_letter_without_the_copy_s_bytes_or_quarantined_twice_fails(tmp_path: Path) -> None:
    spec = SessionSpec()
    ledger = ledger_rows(
        spec, [(0, "none"), (1, "none"), (2, "malformed"), *[(s, "none") for s in range(3, 7)]]
    )

    def good() -> Output:
        return (
            Output()
            .apply(spec, 0, 1, 3, 4, 5)
            .session(spec, "degraded", applied=[0, 1, 3, 4, 5], degraded_from=2)
            .violation(spec, "gap", got=3, missing=(2, 2))
            .dead_letter(spec, offset=2)
        )

    assert check(tmp_path / "good", Policy("ordered"), ledger, [spec], good()).passed
    bare = good()
    for letter in bare.dead_letters:
        letter.pop("value")
    assert kinds(check(tmp_path / "bare", Policy("ordered"), ledger, [spec], bare)) == {"wrong_dead_letter"}
    twice = good().dead_letter(spec, offset=2, reported=False)
    assert kinds(check(tmp_path / "twice", Policy("ordered"), ledger, [spec], twice)) == {"false_dead_letter"}


def test_a_session_closed_by_its_end_names_what_the_end_carried(tmp_path: Path) -> None:
    out = ordered_gap_output(SessionSpec())
    out.sessions[0] |= {"expected_rows": None, "expected_digest": None}
    assert kinds(gap_run(tmp_path, "ordered", out)) == {"wrong_end"}
    unreported = ordered_gap_output(SessionSpec())
    unreported.integrity = [r for r in unreported.integrity if r["violation"] != "digest_mismatch"]
    assert kinds(gap_run(tmp_path / "b", "ordered", unreported)) == {"missed_violation"}
