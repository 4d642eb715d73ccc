"""The tables contract and Delta output against hand-built ledgers and truth, read as the verifier reads them."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from loadtest.correctness.contracts import tables_end_to_end
from loadtest.correctness.expect import read_ledger, read_truth
from loadtest.correctness.latency import end_to_end_of
from loadtest.correctness.output import read_output
from loadtest.correctness.outputspec import OutputSpec
from loadtest.correctness.policies import Policy
from loadtest.correctness.stops import JobExit
from loadtest.correctness.tables import read_tables
from loadtest.correctness.verify import verify_run
from loadtest.errors import HarnessError
from tests.loadtest.builders import T0, Output, SessionSpec, ledger_rows, write_run

CLEAN = [(s, "none") for s in range(7)]


def write_truth(run: Path, ledger: list, specs: list[SessionSpec]) -> Path:
    write_run(run, ledger, specs)
    return run


def table_rows(spec: SessionSpec, seqs: list[int] | None = None, **extra: Any) -> list[dict[str, Any]]:
    """The session's rows as a team's job writes them: one per row, the row's columns as columns."""
    return [
        {
            "session": spec.session,
            "sensor": spec.sensor,
            "row_id": i,
            "value": r["value"],
            "unit": r["unit"],
            **extra,
        }
        for i, r in spec.table(seqs).items()
    ]


def judge(tmp_path: Path, ledger: list, specs: list[SessionSpec], rows: list[dict[str, Any]]):
    run = write_truth(tmp_path / "run", ledger, specs)
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), out / "part-0.parquet")
    return verify_run(run, OutputSpec(out, "tables"), Policy("ordered"))


def test_the_true_tables_pass_under_the_tables_contract(tmp_path: Path) -> None:
    spec = SessionSpec()
    result = judge(tmp_path, ledger_rows(spec, CLEAN), [spec], table_rows(spec))

    assert result.passed, result.reasons
    assert (result.contract, result.output_format) == ("tables", "parquet")
    assert (result.sessions_exact, result.sessions_exact_required, result.rows_expected) == (1, 1, 3)


def test_an_old_value_a_delayed_message_brought_back_is_a_wrong_row_naming_the_fault(tmp_path: Path) -> None:
    # seq 1 (row 1 = 10) reached Kafka after seq 5 (row 1 = 50): applied as it came, row 1 ends at 10.
    spec = SessionSpec()
    arrivals = [(0, "none"), (2, "none"), (3, "none"), (4, "none"), (5, "none"), (1, "delayed"), (6, "none")]
    stale = table_rows(spec)
    stale[0]["value"] = 10
    result = judge(tmp_path, ledger_rows(spec, arrivals), [spec], stale)

    assert not result.passed and result.rows_wrong == 1
    (wrong,) = result.discrepancies
    assert (wrong.kind, wrong.session, wrong.sensor) == ("wrong_row", "s1", "0001")
    assert "row 1" in wrong.detail and "seq 1 delayed" in wrong.detail
    assert wrong.triage is not None and wrong.triage.layer == "pipeline"


def test_missing_extra_and_repeated_rows_are_each_counted(tmp_path: Path) -> None:
    spec = SessionSpec()
    rows = table_rows(spec)  # rows 1, 2, 4
    rows = [r for r in rows if r["row_id"] != 2]  # row 2 missing
    rows.append({"session": "s1", "sensor": "0001", "row_id": 3, "value": 3, "unit": "C"})  # deleted at seq 4
    rows.append(dict(rows[0]))  # row 1 twice
    result = judge(tmp_path, ledger_rows(spec, CLEAN), [spec], rows)

    assert (result.rows_lost, result.rows_unexpected, result.rows_repeated) == (1, 1, 1)
    assert set(result.discrepancy_counts) == {"missing_row", "extra_row", "repeated_row"}


def test_tombstones_are_not_rows(tmp_path: Path) -> None:
    spec = SessionSpec()
    rows = table_rows(spec, deleted=False) + [
        {"session": "s1", "sensor": "0001", "row_id": 3, "value": None, "unit": None, "deleted": True}
    ]
    result = judge(tmp_path, ledger_rows(spec, CLEAN), [spec], rows)
    assert result.passed, result.reasons


# Seq 3 (row 4 = 40) never reached the broker: a correct job holds what the rest builds, rows 1 = 50 and 2 = 20.
GAPPED = ([(s, "none") for s in (0, 1, 2, 4, 5, 6)], {3: "gap"})


def test_a_session_that_lost_a_message_is_judged_against_what_its_delivered_messages_build(
    tmp_path: Path,
) -> None:
    good, gapped = SessionSpec(), SessionSpec(session="s2", sensor="0002")
    ledger = ledger_rows(good, CLEAN) + ledger_rows(gapped, *GAPPED)
    built = table_rows(gapped, [0, 1, 2, 4, 5])
    result = judge(tmp_path / "ok", ledger, [good, gapped], table_rows(good) + built)
    assert result.passed, result.reasons
    assert (result.sessions_exact_required, result.sessions_judged_from_delivered) == (2, 1)
    assert result.sessions_not_judged == 0

    extra = {"session": "s2", "sensor": "0002", "row_id": 4, "value": 40.0, "unit": "C"}  # from nowhere
    result = judge(tmp_path / "bad", ledger, [good, gapped], table_rows(good) + built + [extra])
    (found,) = result.discrepancies
    assert (found.kind, found.session) == ("extra_row", "s2")
    assert (
        "row 4 should not exist" in found.detail
        and "seq 3 never reached the broker intact (gap)" in found.detail
    )


def test_a_row_whose_later_update_was_lost_holds_the_value_of_the_last_one_delivered(tmp_path: Path) -> None:
    # Seq 5 (row 1 = 50) lost: row 1 must hold seq 1's 10.0, which only the ledger's digest of seq 1 says.
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in (0, 1, 2, 3, 4, 6)], {5: "gap"})
    right = table_rows(spec, [0, 1, 2, 3, 4])
    assert judge(tmp_path / "ok", ledger, [spec], right).passed

    stale = [{**r, "value": 1.0} if r["row_id"] == 1 else r for r in right]  # the snapshot's value
    result = judge(tmp_path / "bad", ledger, [spec], stale)
    (wrong,) = result.discrepancies
    assert wrong.kind == "wrong_row" and wrong.seq == 1
    assert (
        "row 1 is" in wrong.detail
        and "not what seq 1 set it to; seq 5, which touched it later" in wrong.detail
    )


def test_a_row_only_the_snapshot_set_among_the_delivered_holds_the_snapshot_s_value(tmp_path: Path) -> None:
    spec = SessionSpec()  # seqs 1 and 5 both set row 1; both lost
    ledger = ledger_rows(spec, [(s, "none") for s in (0, 2, 3, 4, 6)], {1: "gap", 5: "gap"})
    right = table_rows(spec, [0, 2, 3, 4])
    assert judge(tmp_path / "ok", ledger, [spec], right).passed
    wrong = [{**r, "value": 50.0} if r["row_id"] == 1 else r for r in right]
    (found,) = judge(tmp_path / "bad", ledger, [spec], wrong).discrepancies
    assert found.kind == "wrong_row" and '"value":1.0' in found.detail


@pytest.mark.parametrize("error", ["not acknowledged before exit", "Local: Purged in flight"])
def test_a_message_of_unknown_delivery_may_be_applied_or_not_and_its_session_is_still_judged(
    tmp_path: Path, error: str
) -> None:
    # Seq 3 was sent and never acknowledged (the flush gave up, or a purge took it in flight): the broker may
    # hold it, so a job that read it and one that did not are both right, and nothing else is let through.
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in (0, 1, 2, 4, 5, 6)])
    unacked = ledger_rows(spec, [(3, "none")])[0] | {"offset": None, "delivered": False, "acked_ts": None}
    unacked["error"] = error
    without = judge(tmp_path / "without", [*ledger, unacked], [spec], table_rows(spec, [0, 1, 2, 4, 5]))
    assert without.passed and without.sessions_not_judged == 0, without.reasons
    assert judge(tmp_path / "with", [*ledger, unacked], [spec], table_rows(spec)).passed

    garbage = [{**r, "value": -1.0} if r["row_id"] == 2 else r for r in table_rows(spec)]
    wrong = judge(tmp_path / "garbage", [*ledger, unacked], [spec], garbage)
    assert not wrong.passed and wrong.rows_wrong == 1


def test_a_message_acknowledged_without_an_offset_is_delivered(tmp_path: Path) -> None:
    # librdkafka acknowledges an idempotent retry the broker had already written without its offset.
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in (0, 1, 2, 4, 5, 6)])
    retried = ledger_rows(spec, [(3, "none")])[0] | {"offset": None}
    assert judge(tmp_path / "right", [*ledger, retried], [spec], table_rows(spec)).passed
    stale = judge(tmp_path / "stale", [*ledger, retried], [spec], table_rows(spec, [0, 1, 2, 4, 5]))
    assert not stale.passed


def test_an_exact_decimal_equals_the_float_it_was_written_from(tmp_path: Path) -> None:
    spec = SessionSpec()
    exact = [{**r, "value": Decimal(repr(r["value"]))} for r in table_rows(spec)]
    result = judge(tmp_path / "exact", ledger_rows(spec, CLEAN), [spec], exact)
    assert result.passed, result.reasons
    binary = [
        {**r, "value": Decimal(r["value"] + 0.001)} for r in table_rows(spec)
    ]  # 0.001 has no exact float
    reference = [{**r, "value": r["value"] + 0.001} for r in table_rows(spec)]
    assert (
        judge(tmp_path / "binary", ledger_rows(spec, CLEAN), [spec], binary).reasons
        == judge(tmp_path / "float", ledger_rows(spec, CLEAN), [spec], reference).reasons
    )
    rounded = [{**r, "value": Decimal(repr(r["value"])) + Decimal("0.001")} for r in table_rows(spec)]
    assert not judge(tmp_path / "rounded", ledger_rows(spec, CLEAN), [spec], rounded).passed


def test_a_column_that_is_not_the_rows_is_named_once_with_the_way_out(tmp_path: Path) -> None:
    spec = SessionSpec()
    rows = table_rows(spec, written_ms=T0)
    result = judge(tmp_path / "named", ledger_rows(spec, CLEAN), [spec], rows)
    (found,) = result.discrepancies
    assert found.kind == "unknown_column"
    assert (
        "'written_ms'" in found.detail
        and "'_written_ms'" in found.detail
        and "--ignore-column" in found.detail
    )
    assert result.sessions_exact == 1  # the rows themselves were judged without it

    run = write_truth(tmp_path / "ignored" / "run", ledger_rows(spec, CLEAN), [spec])
    out = tmp_path / "ignored" / "out"
    out.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), out / "part-0.parquet")
    ignored = verify_run(run, OutputSpec(out, "tables", ignored=("written_ms",)), Policy("ordered"))
    assert ignored.passed, ignored.reasons


def test_a_table_without_the_contract_columns_is_refused_naming_them(tmp_path: Path) -> None:
    spec = SessionSpec()
    rows = [{"key": spec.session, "value": 1}]
    with pytest.raises(HarnessError, match=r"`session` \(or `sensor`\).*\['key', 'value'\]"):
        judge(tmp_path, ledger_rows(spec, CLEAN), [spec], rows)


def test_a_delta_table_is_detected_and_dated_by_its_commits(tmp_path: Path) -> None:
    spec = SessionSpec()
    run = write_truth(tmp_path / "run", ledger_rows(spec, CLEAN), [spec])
    table = tmp_path / "table"
    rows = [{**r, "seq": 5 if r["row_id"] == 1 else 0} for r in table_rows(spec, [0, 1, 2, 3, 4])]
    rows = [r for r in rows if r["row_id"] != 1] + [{**table_rows(spec)[0], "seq": 5}]
    write_deltalake(
        str(table),
        pa.Table.from_pylist(rows),
        commit_properties=CommitProperties(app_transactions=[Transaction("q", 0)]),
    )

    result = verify_run(run, OutputSpec(table, "tables"), Policy("ordered"))
    assert result.passed, result.reasons
    assert result.output_format == "delta" and result.latency_source == "Delta commit timestamps"
    latency = tables_end_to_end(read_ledger(run), read_tables(OutputSpec(table, "tables")))
    assert sorted(latency["seq"]) == [0, 5]  # one latency per message that set a final row
    assert (latency["latency_ms"] > 0).all()


def test_sotw_s_full_output_as_delta_tables_reads_like_the_parquet_one(tmp_path: Path) -> None:
    spec = SessionSpec()
    parquet = (
        Output(batches={0: T0 + 6000}).apply(spec, *range(6)).session(spec, "ok").write(tmp_path / "parquet")
    )
    delta = tmp_path / "delta"
    for name in ("changes", "sessions"):
        rows = pq.read_table(parquet / name, partitioning="hive").to_pylist()
        rows = [{**r, "sensor": spec.sensor, "date": str(r["date"])} for r in rows]
        write_deltalake(
            str(delta / name),
            pa.Table.from_pylist(rows),
            partition_by=["sensor", "date"],
            commit_properties=CommitProperties(app_transactions=[Transaction("query", 0)]),
        )
    run = tmp_path / "run"
    write_run(run, ledger_rows(spec, CLEAN), [spec])

    got, want = read_output(delta), read_output(parquet)
    assert len(got.changes) == len(want.changes) and list(got.commits) == [0]
    result = verify_run(run, delta, Policy("ordered"))
    assert result.passed, result.reasons
    assert result.output_format == "delta" and result.latency_source == "Delta commit timestamps"
    e2e = end_to_end_of(read_ledger(run), OutputSpec(delta))
    assert len(e2e) == 6 and not e2e["latency_ms"].isna().any()
    assert not math.isnan(read_truth(run)["rows"].sum())


def judge_strict(
    tmp_path: Path, ledger: list, spec: SessionSpec, rows: list[dict[str, Any]], job_exit: JobExit
):
    run = write_truth(tmp_path / "run", ledger, [spec])
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), out / "part-0.parquet")
    return verify_run(run, OutputSpec(out, "tables"), Policy("strict"), job_exit=job_exit)


def test_a_strict_job_s_tables_hold_a_prefix_of_each_session_and_it_exits_non_zero(tmp_path: Path) -> None:
    # Seq 3 never reached the broker: strict must stop at seq 4, and the job's table may hold seqs 0-2 only.
    spec = SessionSpec()
    ledger = ledger_rows(spec, [(s, "none") for s in (0, 1, 2, 4, 5, 6)], {3: "gap"})
    stopped = JobExit(True, 3, "strict policy: gap")
    prefix = table_rows(spec, [0, 1, 2])
    assert judge_strict(tmp_path / "ok", ledger, spec, prefix, stopped).passed
    assert judge_strict(tmp_path / "shorter", ledger, spec, table_rows(spec, [0, 1]), stopped).passed

    past = judge_strict(tmp_path / "past", ledger, spec, table_rows(spec, [0, 1, 2, 4, 5]), stopped)
    assert not past.passed and "wrong_row" in past.discrepancy_counts  # row 1 holds seq 5's value

    clean_exit = judge_strict(tmp_path / "zero", ledger, spec, prefix, JobExit(True, 0, ""))
    assert clean_exit.discrepancy_counts == {"no_policy_stop": 1}
    kept = judge_strict(tmp_path / "kept", ledger, spec, prefix, JobExit(False, 0, ""))
    assert kept.discrepancy_counts == {"did_not_stop": 1}


def test_a_session_keyed_table_s_sensor_column_must_be_its_session_s(tmp_path: Path) -> None:
    spec = SessionSpec()
    rows = table_rows(spec)
    rows[0]["sensor"] = "0042"
    result = judge(tmp_path, ledger_rows(spec, CLEAN), [spec], rows)
    assert result.discrepancy_counts == {"wrong_sensor": 1}


def test_a_strict_job_s_tables_may_hold_only_what_it_applied_before_its_stop_in_kafka_order(
    tmp_path: Path,
) -> None:
    # Seq 3 came after seq 4: strict stops at 4 and never applies 3, though 3 is below it.
    spec = SessionSpec()
    ledger = ledger_rows(
        spec, [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (3, "delayed"), (5, "none"), (6, "none")]
    )
    stopped = JobExit(True, 3, "strict: gap")
    assert judge_strict(tmp_path / "ok", ledger, spec, table_rows(spec, [0, 1, 2]), stopped).passed
    past = judge_strict(tmp_path / "past", ledger, spec, table_rows(spec, [0, 1, 2, 3]), stopped)
    assert not past.passed and past.rows_unexpected == 1
