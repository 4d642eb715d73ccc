"""The live verifier: sessions verified as they settle add up to the final verdict; a run of several parts."""

from __future__ import annotations

import shutil
from pathlib import Path

from loadtest.correctness.expect import build_expectation, read_ledger, read_truth
from loadtest.correctness.liveverify import LiveVerifier, fault_rows
from loadtest.correctness.output import read_output
from loadtest.correctness.policies import Policy
from loadtest.correctness.verify import verify
from tests.loadtest.builders import T0, Output, SessionSpec, ledger_rows, write_run

CLEAN = [(s, "none") for s in range(7)]
LATER = (T0 + 3_600_000) / 1000.0  # an hour after the sessions: everything has settled


def write_part(run: Path, name: str, ledger: list, specs: list[SessionSpec]) -> Path:
    """A simulator's part of a run, with its closed sessions where a running simulator writes them."""
    part = run / "parts" / name
    write_run(part, ledger, specs)
    (part / "truth" / "closed").mkdir()
    shutil.copy(part / "truth" / "sessions.parquet", part / "truth" / "closed" / "part-00000.parquet")
    return part


def add_output(root: Path, out: Output, tag: str) -> None:
    """Add a pipeline's newly committed files to ``root`` (files of their own, as each batch writes)."""
    staged = out.write(root.parent / f"staged-{tag}")
    for path in staged.rglob("*"):
        if path.is_file():
            target = root / path.relative_to(staged)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".parquet":
                target = target.with_name(f"{tag}-{target.name}")
            shutil.copy(path, target)


def test_a_run_of_several_simulators_is_verified_as_the_union_of_their_ledgers(tmp_path: Path) -> None:
    a, b = SessionSpec("s1", "0001"), SessionSpec("s2", "10001")
    write_part(tmp_path / "run", "worker-0", ledger_rows(a, CLEAN), [a])
    write_part(tmp_path / "run", "worker-1", ledger_rows(b, CLEAN), [b])
    ledger, truth = read_ledger(tmp_path / "run"), read_truth(tmp_path / "run")
    assert set(ledger["session"]) == set(truth["session"]) == {"s1", "s2"}
    out = Output().apply(a, *range(6)).session(a, "ok").apply(b, *range(6)).session(b, "ok")
    result = verify(
        build_expectation(Policy("ordered"), ledger, truth), read_output(out.write(tmp_path / "out"))
    )
    assert result.passed and result.sessions_expected == 2 and result.sessions_exact == 2


def test_sessions_verified_as_they_settle_add_up_to_the_final_verdict(tmp_path: Path) -> None:
    a, b = SessionSpec("s1", "0001"), SessionSpec("s2", "0002")
    run, output = tmp_path / "run", tmp_path / "out"
    write_part(run, "local", ledger_rows(a, CLEAN) + ledger_rows(b, CLEAN, first_offset=100), [a, b])
    add_output(output, Output().apply(a, *range(6)).session(a, "ok"), "b0")
    live = LiveVerifier(
        run, output, "sotw-sensor-", Policy("ordered"), late_ms=0, clock=lambda: LATER, timeout_ms=10**12
    )
    first = live.step()
    assert (first.sessions_closed, first.sessions_verified) == (2, 1), "s2 has no session record yet"
    assert first.passed and first.sessions_exact == 1
    # The pipeline loses s2's seq 3 and closes the session.
    add_output(
        output,
        Output(batches={1: T0 + 7000}).apply(b, 0, 1, 2, 4, 5, batch=1).session(b, "ok", batch=1),
        "b1",
    )
    totals = live.step()
    assert totals.sessions_verified == 2 and totals.rows_lost == 1 and not totals.passed
    assert totals.discrepancy_counts["lost_row"] == 1 and totals.recent[0]["session"] == "s2"
    final = verify(
        build_expectation(Policy("ordered"), read_ledger(run), read_truth(run)), read_output(output)
    )
    assert (totals.rows_lost, totals.rows_expected, totals.rows_written) == (
        final.rows_lost,
        final.rows_expected,
        final.rows_written,
    )
    assert dict(totals.discrepancy_counts) == final.discrepancy_counts


def test_a_session_waits_until_its_late_copies_can_be_in_the_ledger(tmp_path: Path) -> None:
    a = SessionSpec("s1", "0001")
    run, output = tmp_path / "run", tmp_path / "out"
    write_part(run, "local", ledger_rows(a, CLEAN), [a])
    add_output(output, Output().apply(a, *range(6)).session(a, "ok"), "b0")
    now = (T0 + 1000) / 1000.0
    live = LiveVerifier(run, output, "sotw-sensor-", Policy("ordered"), late_ms=60_000, clock=lambda: now)
    assert live.step().sessions_verified == 0  # the ledger does not reach a minute past the session's end


def test_a_session_the_pipeline_never_closed_is_verified_after_the_timeout_as_missing(tmp_path: Path) -> None:
    a = SessionSpec("s1", "0001")
    run, output = tmp_path / "run", tmp_path / "out"
    write_part(run, "local", ledger_rows(a, CLEAN), [a])
    add_output(output, Output().apply(a, *range(6)), "b0")
    clock = [(T0 + 2000) / 1000.0]
    live = LiveVerifier(
        run, output, "sotw-sensor-", Policy("ordered"), late_ms=0, timeout_ms=5000, clock=lambda: clock[0]
    )
    assert live.step().sessions_verified == 0
    clock[0] = LATER
    totals = live.step()
    assert totals.sessions_verified == 1 and totals.discrepancy_counts["missing_session"] == 1


def test_only_the_runs_own_topics_are_read(tmp_path: Path) -> None:
    a, other = SessionSpec("s1", "0001"), SessionSpec("x1", "9001")
    run, output = tmp_path / "run", tmp_path / "out"
    write_part(run, "local", ledger_rows(a, CLEAN), [a])
    out = Output().apply(a, *range(6)).session(a, "ok").apply(other, *range(6)).session(other, "ok")
    add_output(output, out, "b0")
    live = LiveVerifier(run, output, "sotw-sensor-0", Policy("ordered"), late_ms=0, clock=lambda: LATER)
    totals = live.step()
    assert totals.passed and totals.sessions_verified == 1, dict(totals.discrepancy_counts)


def test_committed_change_rows_give_end_to_end_latency_by_window_of_commit_time(tmp_path: Path) -> None:
    a = SessionSpec("s1", "0001")
    run, output = tmp_path / "run", tmp_path / "out"
    write_part(run, "local", ledger_rows(a, CLEAN), [a])
    add_output(output, Output(batches={0: T0 + 6000}).apply(a, *range(6)).session(a, "ok"), "b0")
    live = LiveVerifier(run, output, "sotw-sensor-", Policy("ordered"), late_ms=0, clock=lambda: LATER)
    live.step()
    [window] = live.latency_windows()
    # Snapshot rows (3) at T0 and one row per update seq 1..5 at T0 + seq * 100, all committed at T0 + 6 s.
    assert window["count"] == 8 and window["max"] == 6000 and window["p50"] >= 5500


def test_fault_rows_set_injected_against_reported_and_scored() -> None:
    live = {
        "reported": {"gap": 3, "duplicate": 1},
        "faults": {"gap": {"fault": "gap", "expected": 3, "detected": 3, "true_positives": 3, "allowed": 3}},
    }
    rows = {r["fault"]: r for r in fault_rows(live, {"gap": 2, "duplicate": 1, "malformed": 4})}
    assert rows["gap"] == {
        "fault": "gap",
        "injected": 2,
        "reported": 3,
        "expected": 3,
        "detected": 3,
        "true_positives": 3,
    }
    assert rows["malformed"]["reported"] == 0 and rows["duplicate"]["reported"] == 1
